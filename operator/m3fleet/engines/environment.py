"""Which variables `spec.engine.env` may not set, and why.

Two kinds are refused:

- Variables that change HOW the launcher or the engine is executed rather than what it does: they make a shell,
  the dynamic loader, Python or Open MPI run code that is not the image's (a file on a mounted volume, a command in
  the value). A cluster that admits engine pods by image (a policy on `image`) must not be bypassed through `env`,
  and a launch script must mean what it says. Tuning variables (NCCL_IB_HCA, VLLM_LOGGING_LEVEL, ...) stay allowed.
- Variables m3fleet sets itself (the renderers' environment, the LeaderWorkerSet wiring, the API key, HOME and the
  caches): a second value would silently override the plan or the pod's security settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from m3fleet.api.models import EnvVar
from m3fleet.errors import SpecError

ENV_FIELD = "spec.engine.env"

# name -> why it changes how programs are executed
EXECUTION_VARIABLES: Mapping[str, str] = {
    "BASH_ENV": "bash runs the file it names before every script, the launch scripts included",
    "ENV": "sh (and bash in POSIX mode) runs the file it names at start",
    "SHELLOPTS": "it switches shell options (xtrace, ...) on in every bash the launcher starts",
    "BASHOPTS": "it switches shell options on in every bash the launcher starts",
    "PS4": "bash expands it, command substitutions included, for every traced line",
    "PATH": "it decides which program runs as the engine, python3, mpirun or ssh",
    "GCONV_PATH": "glibc loads character-set modules (shared libraries) from it",
    "PYTHONPATH": "Python imports modules from it before the image's own (a mounted file would replace the engine)",
    "PYTHONHOME": "it replaces the Python standard library the engine runs on",
    "PYTHONSTARTUP": "Python runs the file it names",
    "PYTHONUSERBASE": "Python imports modules and .pth files (which run code) from it",
    "PYTHONINSPECT": "it leaves an interactive interpreter reading stdin after the engine exits",
    "NCCL_NET_PLUGIN": "NCCL loads the shared library it names",
    "NCCL_TUNER_PLUGIN": "NCCL loads the shared library it names",
    "NCCL_PROFILER_PLUGIN": "NCCL loads the shared library it names",
    # The engines' own (vLLM 0.33.0 vllm/envs.py, SGLang 0.5.23 sglang/srt/environ.py and where each is read):
    "VLLM_LOGGING_CONFIG_PATH": "vLLM hands the file to logging.config.dictConfig, which imports and calls any "
    "factory it names (vllm/logger.py)",
    "SGLANG_LOGGING_CONFIG_PATH": "SGLang hands the file to logging.config.dictConfig, which imports and calls any "
    "factory it names (srt/utils/common.py)",
    "VLLM_PLUGINS": "it picks which installed plugins vLLM imports and runs in every process (vllm/plugins)",
    "SGLANG_PLUGINS": "it picks which installed plugins SGLang imports and runs (runtime/platforms/plugins.py)",
    "VLLM_NCCL_SO_PATH": "vLLM loads NCCL from the shared library it names (utils/nccl.py)",
    "VLLM_CUDART_SO_PATH": "vLLM loads the CUDA runtime from the shared library it names (cuda_wrapper.py)",
    "SGLANG_NCCL_SO_PATH": "SGLang loads NCCL from the shared library it names (pynccl_wrapper.py)",
    "SGLANG_DIFFUSION_NCCL_SO_PATH": "SGLang loads NCCL from the shared library it names",
    "VLLM_RUST_FRONTEND_PATH": "vLLM runs the program it names as its API server (entrypoints/cli/serve.py)",
    "VLLM_MODEL_REDIRECT_PATH": "vLLM reads the model to load from the file it names (transformers_utils/utils.py), "
    "and that model's remote code runs",
    "SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE": "SGLang imports the Python package it names (tokenizer_manager.py)",
    "SGLANG_EXTERNAL_MODEL_PACKAGE": "SGLang imports the Python package it names (external_model_package.py)",
    "SGLANG_TEST_SCRIPTED_RUNTIME_SYS_PATH_ENTRY": "SGLang's test hook puts the directory it names on sys.path",
}
EXECUTION_PREFIXES: Mapping[str, str] = {
    "LD_": "the dynamic loader reads LD_* (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...) to load code into every program",
    "BASH_FUNC_": "bash imports exported functions from it, replacing commands in every bash the launcher starts",
    "OMPI_": "Open MPI reads its launch agent (plm_rsh_agent), prefix and parameters from OMPI_* variables",
    "OPAL_": "Open MPI reads its install prefix (which orted the workers run) from OPAL_* variables",
    "PRTE_": "the PMIx runtime reads its launch parameters from PRTE_* variables",
    "PMIX_": "the PMIx runtime reads its launch parameters from PMIX_* variables",
}
# Set by m3fleet (or the LeaderWorkerSet controller) on every engine pod that needs them.
OWNED_VARIABLES: Mapping[str, str] = {
    "HOME": "m3fleet points it at a writable emptyDir (the pod runs as a non-root user)",
    "XDG_CACHE_HOME": "m3fleet points it at a writable emptyDir (the pod runs as a non-root user)",
    "HF_HOME": "m3fleet sets it from spec.model.source",
    "HF_TOKEN": "set spec.model.source.huggingFace.tokenSecretRef instead",
    "VLLM_API_KEY": "set spec.engine.apiKeySecretRef instead",
    **dict.fromkeys(
        # The device plugin gives the pod the plan's GPUs and the engine's ranks use every one: hiding some leaves
        # ranks without a GPU (or two on one). Set spec.parallelism or spec.nodePool.extraResources instead.
        ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
        "the device plugin gives the pod the plan's GPUs and every engine rank uses one; change "
        "spec.parallelism instead",
    ),
}
OWNED_PREFIXES: Mapping[str, str] = {
    "LWS_": "the LeaderWorkerSet controller sets LWS_* to wire the group",
    "M3FLEET_": "m3fleet's launchers use M3FLEET_* variables",
}


def refusal(name: str, rendered: Mapping[str, str]) -> str | None:
    """Why `spec.engine.env` may not set `name`, or None. `rendered`: what m3fleet sets on this pod -> reason."""
    if name in EXECUTION_VARIABLES:
        return f"changes how the engine is executed: {EXECUTION_VARIABLES[name]}"
    for prefix, why in EXECUTION_PREFIXES.items():
        if name.startswith(prefix):
            return f"changes how the engine is executed: {why}"
    if name in OWNED_VARIABLES:
        return f"is set by m3fleet: {OWNED_VARIABLES[name]}"
    for prefix, why in OWNED_PREFIXES.items():
        if name.startswith(prefix):
            return f"is set by m3fleet: {why}"
    if name in rendered:
        return f"is set by m3fleet: {rendered[name]}"
    return None


def check_user_env(env: Iterable[EnvVar], rendered: Mapping[str, str]) -> None:
    for index, variable in enumerate(env):
        why = refusal(variable.name, rendered)
        if why is not None:
            raise SpecError(
                f"{ENV_FIELD}[{index}].name",
                f"{variable.name} {why}",
                f"remove it from {ENV_FIELD}",
            )
