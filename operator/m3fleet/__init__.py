"""m3fleet: a Kubernetes operator that plans, renders, reconciles and autoscales MiniMax-M3 fleets."""

__version__ = "0.1.0"
