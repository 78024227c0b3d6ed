"""m3fleet: a Kubernetes operator that plans, renders, reconciles and autoscales MiniMax-M3 fleets."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("m3fleet")  # pyproject.toml's, the one source (the chart's version is generated from it)
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
