"""The engine time model's priors, shared by the autoscaling policy (its starting prefill throughput) and the
disaggregation planner (the prefill:decode ratio). Stand-ins for a measured profile: UNVERIFIED on hardware.

* prefill: prompt tokens per second per GPU at long context (compute-bound: scales with the GPUs of a worker);
* decode: one iteration (a token for every running sequence) costs a fixed step (HBM-bound: the weights are read
  once per step) + a share per sequence + a share per context token (MSA's index scan grows with context). The
  same figures as the simulator's engine model (simulator/m3fleet_simulator/fleet.py: 25 ms x the accelerator's
  scale, 5e-5 s per sequence, 3e-9 s per context token).
"""

from collections.abc import Mapping
from typing import Final

PREFILL_TOKENS_PER_GPU_SECOND: Final[Mapping[str, float]] = {"h200": 5000.0, "gb200": 11000.0, "mi355x": 9000.0}
MULTI_NODE_EFFICIENCY: Final = 0.85  # prefill throughput kept when a worker spans nodes
DECODE_STEP_SECONDS: Final[Mapping[str, float]] = {"h200": 0.025, "gb200": 0.01625, "mi355x": 0.01625}
DECODE_SECONDS_PER_SEQUENCE: Final = 5e-5
DECODE_SECONDS_PER_CONTEXT_TOKEN: Final = 3e-9
MULTI_NODE_DECODE_PENALTY: Final = 1.15  # a decode step over the network between nodes
MAX_DECODE_BATCH_PER_RANK: Final = 256  # the engines' default max running sequences per DP rank
