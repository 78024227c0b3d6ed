"""Engine releases m3fleet renders flags for — pinned here and nowhere else.

The catalog's default images are tags of exactly these releases, and the engine-parser test tier
(`.ci/engine-envs.sh`, `tests/engine_parsers/`) installs exactly these versions to check every
rendered command line with the engine's own argument parser.
"""

from typing import Final

VLLM_VERSION: Final = "0.33.0"
SGLANG_VERSION: Final = "0.5.23"
# TensorRT-LLM has no installable wheel on PyPI; its YAML is checked against a schema of the
# options its MiniMax-M3 deployment guide documents (TRT-GUIDE).
TRTLLM_VERSION: Final = "1.3.0rc20"
