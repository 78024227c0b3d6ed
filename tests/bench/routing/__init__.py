"""The routing benchmark (a dev tool, not part of the product): `python -m tests.bench.routing`."""
