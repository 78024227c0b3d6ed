"""The disaggregation benchmark (a dev tool, not part of the product): `python -m tests.bench.disaggregation`."""
