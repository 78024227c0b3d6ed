"""The autoscaling benchmark (a dev tool, not part of the product): `python -m tests.bench.autoscaling`."""
