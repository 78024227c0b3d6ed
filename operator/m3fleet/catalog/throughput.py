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

# HGX B200, B300 and GB300 carry the GB200's Blackwell GPU (B300/GB300: Blackwell Ultra, the same dense BF16/FP8
# rate): GB200's figures. The other pools scale H200's figures by dense BF16 rate (prefill) and HBM bandwidth (the
# decode step) from their spec sheets: H100 989 TFLOPS / 3.35 TB/s, H20 148 / 4.0, MI300X 1307 / 5.3, MI325X
# 1307 / 6.0, MI350X 2.3 PFLOPS / 8 TB/s (MI355X's bandwidth at a lower clock).
PREFILL_TOKENS_PER_GPU_SECOND: Final[Mapping[str, float]] = {
    "h200": 5000.0,
    "h100": 5000.0,
    "h20": 750.0,
    "gb200": 11000.0,
    "gb300": 11000.0,
    "b200": 11000.0,
    "b300": 11000.0,
    "mi300x": 6600.0,
    "mi325x": 6600.0,
    "mi350x": 8300.0,
    "mi355x": 9000.0,
}
MULTI_NODE_EFFICIENCY: Final = 0.85  # prefill throughput kept when a worker spans nodes
DECODE_STEP_SECONDS: Final[Mapping[str, float]] = {
    "h200": 0.025,
    "h100": 0.03575,
    "h20": 0.03,
    "gb200": 0.01625,
    "gb300": 0.01625,
    "b200": 0.01625,
    "b300": 0.01625,
    "mi300x": 0.0225,
    "mi325x": 0.02,
    "mi350x": 0.01625,
    "mi355x": 0.01625,
}
DECODE_SECONDS_PER_SEQUENCE: Final = 5e-5
DECODE_SECONDS_PER_CONTEXT_TOKEN: Final = 3e-9
MULTI_NODE_DECODE_PENALTY: Final = 1.15  # a decode step over the network between nodes
MAX_DECODE_BATCH_PER_RANK: Final = 256  # the engines' default max running sequences per DP rank
