"""Context-length-aware autoscaling: engine signals, Prometheus adapters, the pure policy, the simulator.

Modules: `signals` (typed snapshots), `metrics` (Prometheus adapters; the only I/O), `policy` (pure
decisions), `scenarios` / `simulator` / `baselines` / `benchmark` (the seeded benchmark) and `cli`
(`m3fleet simulate`). Nothing is imported here, so importing the pure policy never pulls in I/O.
"""
