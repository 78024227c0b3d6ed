"""TensorRT-LLM (`trtllm-serve`) for MiniMax-M3, as its deployment guide runs it (TRT-GUIDE, TRT-YAML).

Parallelism, batching, KV cache and the sparse-attention backend live in the
`extra_llm_api_options` YAML (a ConfigMap). A multi-node replica is one MPI job, launched the way NVIDIA
Dynamo's operator launches multi-node TensorRT-LLM (DYN-TRT, DYN-MN): the leader runs `mpirun` over SSH
(port 2222, keys in a Secret the controller generates; offline render only names it) to start
`trtllm-llmapi-launch trtllm-serve` once per GPU, forwarding the environment with `-x`; workers run only sshd
with a TCP readiness check. The LeaderWorkerSet TensorRT-LLM example (LWS-EX) is not followed: it starts ranks
through `kubectl exec` (`plm_rsh_agent kubessh`) and needs a ServiceAccount allowed to exec into pods. Where
m3fleet differs from Dynamo is in templates/trtllm-leader.sh.j2.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from m3fleet.api.models import Strategy
from m3fleet.api.spec_pod import CONFIG_MOUNT, SSH_MOUNT
from m3fleet.catalog import TRTLLM_VERSION
from m3fleet.engines import flags
from m3fleet.engines.base import (
    BASH,
    Container,
    Context,
    EngineLaunch,
    Probe,
    Probes,
    Role,
    http_probes,
    literal,
    templates,
)
from m3fleet.engines.flags import OwnedFlag
from m3fleet.errors import SpecError

# trtllm-serve (click) cannot be imported here (PyPI holds no installable wheel of the pinned TRTLLM_VERSION), so
# its owned options are declared: both spellings click may define, matched with prefixes to stay on the safe side.
PLAN = flags.PLANNER
CATALOG = flags.CATALOG
_OWNED_SPELLINGS = {
    "tp_size": PLAN,
    "ep_size": PLAN,
    "pp_size": PLAN,
    "moe_expert_parallel_size": PLAN,
    "cluster_size": PLAN,
    "gpus_per_node": PLAN,
    "max_seq_len": "set spec.context.maxModelLen instead",
    "max_batch_size": PLAN,
    "max_num_tokens": PLAN,
    "kv_cache_free_gpu_memory_fraction": PLAN,
    "reasoning_parser": CATALOG,
    "tool_parser": CATALOG,
    "chat_template": CATALOG,
    "extra_llm_api_options": "nothing: m3fleet renders the LLM API options file from the plan",
    "config": "nothing: m3fleet renders the LLM API options file from the plan",
    "host": CATALOG,
    "port": CATALOG,
    "trust_remote_code": CATALOG,
}
OWNED = tuple(
    OwnedFlag(f"--{name.replace('_', sep)}", instead) for name, instead in _OWNED_SPELLINGS.items() for sep in "_-"
)
OPTION_TABLE = flags.declared_table("trtllm", TRTLLM_VERSION, (flag.flag for flag in OWNED))

CONFIG_FILE = "extra-llm-api-options.yaml"
LEADER_SCRIPT = "launch-leader.sh"
WORKER_SCRIPT = "launch-worker.sh"
SINGLE_SCRIPT = "launch.sh"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # shipped with the checkpoint, passed explicitly (TRT-GUIDE)
CHAT_TEMPLATE_VAR = "chat_template"  # the launch scripts' shell variable when the path is only known at start
SSH_PORT = 2222
# sshd (run as root, as the TensorRT-LLM image does) switches users and chroots for privilege separation.
SSHD_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "SETGID", "SETUID", "SYS_CHROOT")
MAX_BATCH_SIZE = 256  # the curated throughput config (TRT-YAML)
MAX_NUM_TOKENS = 8192
# The request length the curated config sizes its batch for: 256 sequences of up to max_seq_len 2068 tokens
# (TRT-YAML), the guide's benchmark sending 1024 + 1024 tokens at concurrency 32..1024 (TRT-GUIDE).
CURATED_SEQUENCE_TOKENS = 2068


def ssh_secret_name(ctx: Context) -> str:
    return ctx.resource_name("mpi-ssh")


def max_batch_size(ctx: Context) -> int:
    """Sequences one rank's KV pool holds at the curated request length, as a power of two capped at the curated 256.

    max_batch_size caps how many requests TensorRT-LLM schedules at once (per attention-DP rank under DEP, for the
    whole TP group under TEP); its KV-cache manager then admits only what its blocks hold, so a long max_seq_len needs
    the pool to hold one full-length sequence (the plan's minSequencesAtMaxLen), not max_batch_size of them. Sizing
    it by full-length sequences instead left a TEP replica at 131072 tokens with 8 while the guide's benchmark sweeps
    concurrency 32..1024. What breaks CUDA-graph warmup is a max_seq_len left at the checkpoint's default (512k;
    UNVERIFIED on the pinned image), and m3fleet always sets max_seq_len to the plan's maxModelLen."""
    per_sequence = min(ctx.plan.max_model_len, CURATED_SEQUENCE_TOKENS)
    fit = max(1, ctx.plan.kv_cache_tokens_per_rank // per_sequence)
    return min(MAX_BATCH_SIZE, 1 << (fit.bit_length() - 1))


def llm_api_options(ctx: Context) -> dict[str, Any]:
    plan = ctx.plan
    world = plan.tensor_parallel_size * plan.data_parallel_size
    batch = max_batch_size(ctx)
    return {
        "tensor_parallel_size": world,  # the rank count must equal tensor_parallel_size (TRT-GUIDE)
        "pipeline_parallel_size": 1,
        "moe_expert_parallel_size": plan.expert_parallel_size,
        "enable_attention_dp": plan.strategy == Strategy.DP_EP,  # DEP; TEP otherwise
        "max_batch_size": batch,
        "max_num_tokens": MAX_NUM_TOKENS,
        "max_seq_len": plan.max_model_len,
        # Without chunked prefill the PyTorch backend rejects any prompt longer than max_num_tokens.
        # The M3 guide only runs short prompts (max_seq_len 2068); chunking on the sparse path is UNVERIFIED.
        "enable_chunked_prefill": plan.max_model_len > MAX_NUM_TOKENS,
        "trust_remote_code": True,
        "kv_cache_config": {
            "enable_block_reuse": False,  # not supported on the sparse-attention path
            "free_gpu_memory_fraction": plan.gpu_memory_utilization,
        },
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": batch},
        "sparse_attention_config": {"algorithm": ctx.engine.sparse_attention_algorithm},  # no dense fallback
        "return_perf_metrics": True,  # Prometheus gauges on /prometheus/metrics
        "enable_iter_perf_stats": True,  # queue, KV and memory gauges
        "stream_interval": 10,
        "num_postprocess_workers": 4,
    }


def chat_template_path(ctx: Context) -> str | None:
    """The checkpoint's chat template when its path is known at render time: a mounted checkpoint directory.
    A Hugging Face source has none (the file lands in a snapshot directory of the cache), so the launch script
    fetches it into the shared cache first and passes the cached path (`hub_chat_template_lookup`)."""
    if ctx.spec.model.source.pvc is None and ctx.cache is None:
        return None
    return f"{ctx.model_path}/{CHAT_TEMPLATE_FILE}"


def hub_chat_template_lookup(ctx: Context) -> str:
    """Shell that sets $chat_template to the hub checkpoint's template, downloaded into HF_HOME (the shared cache
    claim every pod of the group mounts at the same path) with the image's huggingface_hub and HF_TOKEN."""
    code = "import sys; from huggingface_hub import hf_hub_download; print(hf_hub_download(sys.argv[1], sys.argv[2]))"
    words = ["python3", "-c", code, ctx.plan.checkpoint, CHAT_TEMPLATE_FILE]
    return f'{CHAT_TEMPLATE_VAR}="$({shlex.join(words)})"'


def serve_command(ctx: Context) -> list[str]:
    """trtllm-serve's argv; the chat template is `$chat_template` when only the launch script can know it."""
    model = ctx.model_path
    return [
        "trtllm-serve",
        model,
        "--host",
        "0.0.0.0",
        "--port",
        str(ctx.engine.port),
        "--trust_remote_code",
        "--reasoning_parser",
        ctx.engine.reasoning_parser,
        "--tool_parser",
        ctx.engine.tool_parser,
        "--chat_template",
        chat_template_path(ctx) or f"${CHAT_TEMPLATE_VAR}",
        "--extra_llm_api_options",
        f"{CONFIG_MOUNT}/{CONFIG_FILE}",
        *ctx.spec.engine.extra_args,
    ]


def shell_words(argv: list[str]) -> str:
    """argv as shell words: each quoted, except the chat-template variable, which the shell must expand."""
    variable = f"${CHAT_TEMPLATE_VAR}"
    return " ".join(f'"${{{CHAT_TEMPLATE_VAR}}}"' if arg == variable else shlex.quote(arg) for arg in argv)


def env(ctx: Context) -> dict[str, str]:
    return {"OMPI_MCA_orte_keep_fqdn_hostnames": "1"}  # mpirun must address pods by their DNS names


def launch(ctx: Context) -> EngineLaunch:
    flags.check_extra_args(ctx.spec.engine.extra_args, OPTION_TABLE, OWNED)
    if ctx.spec.engine.api_key_secret_ref is not None:
        raise SpecError(
            "spec.engine.apiKeySecretRef",
            f"the pinned trtllm-serve ({TRTLLM_VERSION}) has no API key option, so the key could not be enforced",
            "remove it and put an authenticating gateway in front of the Service, or use engine vllm or sglang",
        )
    port = ctx.engine.port
    config = {CONFIG_FILE: yaml.safe_dump(llm_api_options(ctx), sort_keys=False)}
    probes = http_probes(port, ctx.engine.live_path, ctx.engine.ready_path)
    cmd = serve_command(ctx)
    lookup = hub_chat_template_lookup(ctx) if chat_template_path(ctx) is None else ""
    if not ctx.multi_node:
        # One node: trtllm-serve spawns its own MPI ranks.
        if not lookup:
            args = [literal(arg) for arg in cmd[1:]]  # exec'd directly: only the kubelet's $(VAR) to escape
            single = Container(cmd[:1], args, env(ctx), probes, {"http": port}, True)
        else:
            script = {"chat_template_lookup": lookup, "serve": shell_words(cmd)}
            config[SINGLE_SCRIPT] = templates().get_template("trtllm-single.sh.j2").render(script)
            single = Container([*BASH], [f"{CONFIG_MOUNT}/{SINGLE_SCRIPT}"], env(ctx), probes, {"http": port}, True)
        return EngineLaunch({Role.SINGLE: single}, config)
    plan = ctx.plan
    values: dict[str, Any] = {
        "nodes": plan.nodes_per_replica,
        "gpus_per_node": plan.gpus_per_node,
        "world": plan.gpus_per_replica,
        "ssh_port": SSH_PORT,
        "ssh_mount": SSH_MOUNT,
        "serve": shell_words(cmd),
        "chat_template_lookup": lookup,
    }
    config[LEADER_SCRIPT] = templates().get_template("trtllm-leader.sh.j2").render(values)
    config[WORKER_SCRIPT] = templates().get_template("trtllm-worker.sh.j2").render(values)
    # Root: the workers' sshd switches users, and mpirun logs in to them as the leader's user (root, which the
    # image knows; a bare UID has no passwd entry for ssh). Pod Security level baseline (docs/security.md).
    script = {Role.LEADER: LEADER_SCRIPT, Role.WORKER: WORKER_SCRIPT}
    # sshd is up as soon as it listens: a TCP readiness check, no startup/liveness budget needed.
    ssh_ready = Probes(startup=None, readiness=Probe(None, SSH_PORT, 10, 3), liveness=None)
    shape = {
        Role.LEADER: (probes, {"http": port}, True, ()),
        Role.WORKER: (ssh_ready, {"ssh": SSH_PORT}, False, SSHD_CAPABILITIES),
    }
    containers = {
        role: Container(
            [*BASH], [f"{CONFIG_MOUNT}/{script[role]}"], env(ctx), role_probes, ports, http, caps, runs_as_root=True
        )
        for role, (role_probes, ports, http, caps) in shape.items()
    }
    return EngineLaunch(containers, config, ssh_secret=ssh_secret_name(ctx))
