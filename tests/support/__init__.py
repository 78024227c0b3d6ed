"""Helpers shared by the test tiers (no tests here): the real control plane and its fault proxy (cluster/), the
engines' parsers and stand-ins (engines/), Prometheus and autoscaling inputs (autoscaling/), the chart, the CRD,
the samples and free ports."""
