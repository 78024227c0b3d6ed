"""NVIDIA Dynamo's frontend and its prefill/decode workers for one disaggregated resource: their commands, env and
probes (docs/disaggregation.md). Render wraps them into pods (m3fleet.render.dynamo).

Every process finds the others through Dynamo's Kubernetes discovery (--discovery-backend kubernetes: the pods'
own DynamoWorkerMetadata and EndpointSlices), requests travel over TCP and KV events over ZMQ, so neither etcd nor
NATS is needed. Each worker runs its engine's M3 flags for its role (`python3 -m dynamo.<backend>`); KV moves from
prefill to decode over NIXL. A multi-node worker is launched as the aggregated engine's multi-node replica is
(TensorRT-LLM: mpirun over SSH from the leader; vLLM and SGLang: one process per node with the node rank).
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

import yaml

from m3fleet.api.models import DisaggregationPlan, EngineName, Strategy
from m3fleet.api.spec_pod import CONFIG_MOUNT, SSH_MOUNT
from m3fleet.catalog.dynamo import (
    BACKENDS,
    DISCOVERY_BACKEND,
    EVENT_PLANE,
    FRONTEND_PORT,
    M3_PARSER,
    REQUEST_PLANE,
    ROUTER_MODE,
    SYSTEM_PORT,
    DynamoBackend,
)
from m3fleet.engines import trtllm
from m3fleet.engines.base import (
    BASH,
    LWS_GROUP_SIZE,
    LWS_LEADER_ADDRESS,
    Container,
    Context,
    EngineLaunch,
    Probe,
    Probes,
    Role,
    compact_json,
    literal,
    node_rank_launch,
    templates,
)

SGLANG_DIST_INIT_PORT = 20000
SYSTEM = "system"  # the worker's system port name (health, metrics)
WORKER_PROBES = Probes(
    startup=Probe("/live", SYSTEM_PORT, 10, 540),  # 90 minutes for the weights, as the aggregated engines get
    readiness=Probe("/health", SYSTEM_PORT, 10, 3),
    liveness=Probe("/live", SYSTEM_PORT, 30, 5, 10),
)
FRONTEND_PROBES = Probes(
    startup=None, readiness=Probe("/health", FRONTEND_PORT, 10, 3), liveness=Probe("/live", FRONTEND_PORT, 30, 5)
)


def dynamo_namespace(ctx: Context) -> str:
    """Dynamo's own namespace for this fleet: its frontend only routes to workers registered under it."""
    return f"{ctx.namespace}-{ctx.name}"


def runtime_args(ctx: Context) -> list[str]:
    """How every process of the fleet finds the others (shared by the frontend and the workers)."""
    return [
        "--namespace",
        dynamo_namespace(ctx),
        "--discovery-backend",
        DISCOVERY_BACKEND,
        "--request-plane",
        REQUEST_PLANE,
        "--event-plane",
        EVENT_PLANE,
    ]


def runtime_env() -> dict[str, str]:
    """The worker's system server (health for the probes, metrics for Prometheus)."""
    return {
        "DYN_SYSTEM_ENABLED": "true",
        "DYN_SYSTEM_PORT": str(SYSTEM_PORT),
        "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]',
    }


# How many times the frontend may move a request to another worker when its worker is lost, times out or sheds load
# (Dynamo's `--migration-limit`, 0 = off by default). On: a fleet that loses a pod mid-request (a rollout, a node
# drain) otherwise answers 503 for what was in flight on it. Three bounds one request's retries at three lost workers.
MIGRATION_LIMIT = 3


def frontend_command(ctx: Context, plan: DisaggregationPlan) -> list[str]:
    backend = BACKENDS[EngineName(ctx.plan.engine)]
    events = [] if backend.engine != EngineName.TRTLLM else ["--no-router-kv-events"]  # M3 on TRT-LLM: no reuse
    return [
        "python3",
        "-m",
        "dynamo.frontend",
        "--http-host",
        "0.0.0.0",
        "--http-port",
        str(FRONTEND_PORT),
        "--router-mode",
        ROUTER_MODE,
        *events,
        "--kv-cache-block-size",
        str(backend.kv_block_size),
        "--migration-limit",
        str(MIGRATION_LIMIT),
        *runtime_args(ctx),
    ]


def frontend_container(ctx: Context, plan: DisaggregationPlan) -> Container:
    command = frontend_command(ctx, plan)
    return Container(command[:1], command[1:], {}, FRONTEND_PROBES, {"http": FRONTEND_PORT}, True)


def _parsers() -> list[str]:
    return ["--dyn-tool-call-parser", M3_PARSER, "--dyn-reasoning-parser", M3_PARSER]


def vllm_args(ctx: Context, role: str) -> list[str]:
    plan = ctx.plan
    layout = ["--tensor-parallel-size", str(plan.tensor_parallel_size)]
    if plan.strategy == Strategy.DP_EP:
        layout += ["--data-parallel-size", str(plan.data_parallel_size)]
    if plan.expert_parallel_size > 1:
        layout.append("--enable-expert-parallel")
    return [
        "--model",
        ctx.model_path,
        "--served-model-name",
        ctx.served_model_name,
        "--trust-remote-code",
        *layout,
        "--block-size",
        str(BACKENDS[EngineName.VLLM].kv_block_size),
        "--max-model-len",
        str(plan.max_model_len),
        "--gpu-memory-utilization",
        str(plan.gpu_memory_utilization),
        "--kv-cache-dtype",
        "fp8" if plan.kv_cache_dtype == "fp8" else "auto",
        "--disaggregation-mode",
        role,
        "--kv-transfer-config",
        compact_json({"kv_connector": "NixlConnector", "kv_role": "kv_both"}),
        "--kv-events-config",
        compact_json({"enable_kv_cache_events": True, "publisher": "zmq"}),
        *_parsers(),
    ]


def sglang_args(ctx: Context, role: str) -> list[str]:
    plan = ctx.plan
    layout = ["--tp-size", str(plan.tensor_parallel_size * plan.data_parallel_size)]
    if plan.strategy == Strategy.DP_EP:
        layout += ["--dp-size", str(plan.data_parallel_size), "--enable-dp-attention"]
    if plan.expert_parallel_size > 1:
        layout += ["--ep-size", str(plan.expert_parallel_size)]
    return [
        "--model-path",
        ctx.model_path,
        "--served-model-name",
        ctx.served_model_name,
        "--trust-remote-code",
        *layout,
        "--page-size",
        str(BACKENDS[EngineName.SGLANG].kv_block_size),
        "--context-length",
        str(plan.max_model_len),
        "--mem-fraction-static",
        str(plan.gpu_memory_utilization),
        "--disaggregation-mode",
        role,
        "--disaggregation-transfer-backend",
        "nixl",
        *_parsers(),
    ]


def trtllm_options(ctx: Context, role: str) -> dict[str, Any]:
    """The aggregated LLM API options of the role's layout, plus the KV hand-over between the roles."""
    options = trtllm.llm_api_options(ctx)
    options["cache_transceiver_config"] = {"backend": "NIXL", "max_tokens_in_buffer": ctx.plan.max_model_len}
    if role == "prefill":
        options["disable_overlap_scheduler"] = True  # a prefill worker emits one token: nothing to overlap
    return options


def trtllm_args(ctx: Context, role: str) -> list[str]:
    """dynamo.trtllm's flags: the engine YAML carries the layout; the flags repeat what Dynamo would otherwise
    default on the command line over the YAML."""
    options = trtllm_options(ctx, role)
    return [
        "--model",
        ctx.model_path,
        "--served-model-name",
        ctx.served_model_name,
        "--extra-engine-args",
        f"{CONFIG_MOUNT}/{role}-{trtllm.CONFIG_FILE}",
        "--tensor-parallel-size",
        str(options["tensor_parallel_size"]),
        "--expert-parallel-size",
        str(options["moe_expert_parallel_size"]),
        "--enable-attention-dp" if options["enable_attention_dp"] else "--no-enable-attention-dp",
        "--max-batch-size",
        str(options["max_batch_size"]),
        "--max-num-tokens",
        str(options["max_num_tokens"]),
        "--max-seq-len",
        str(options["max_seq_len"]),
        "--free-gpu-memory-fraction",
        str(options["kv_cache_config"]["free_gpu_memory_fraction"]),
        "--kv-block-size",
        str(BACKENDS[EngineName.TRTLLM].kv_block_size),
        "--disaggregation-mode",
        role,
        *_parsers(),
    ]


def worker_command(ctx: Context, role: str) -> list[str]:
    """The worker's argv (`python3 -m dynamo.<backend> ...`), before the user's extraArgs."""
    return [*dynamo_command_without_runtime(ctx, role), *runtime_args(ctx)]


def dynamo_command_without_runtime(ctx: Context, role: str) -> list[str]:
    """The worker's argv without the discovery and transport flags (which the Dynamo operator sets itself)."""
    backend = BACKENDS[EngineName(ctx.plan.engine)]
    args = {EngineName.VLLM: vllm_args, EngineName.SGLANG: sglang_args, EngineName.TRTLLM: trtllm_args}
    return ["python3", "-m", backend.module, *args[backend.engine](ctx, role), *ctx.spec.engine.extra_args]


def role_config_files(ctx: Context, role: str) -> dict[str, str]:
    """The ConfigMap files a role's workers read (TensorRT-LLM's engine YAML), by file name."""
    if EngineName(ctx.plan.engine) != EngineName.TRTLLM:
        return {}
    return {f"{role}-{trtllm.CONFIG_FILE}": yaml.safe_dump(trtllm_options(ctx, role), sort_keys=False)}


def _as_worker(container: Container, serves: bool) -> Container:
    """A Dynamo worker pod: probed and scraped on its system port (the leader of a group), never behind the
    Service (the frontend is)."""
    env = {**container.env, **runtime_env()}
    if not serves:
        return dataclasses.replace(container, env=env)
    return dataclasses.replace(
        container, env=env, probes=WORKER_PROBES, ports={SYSTEM: SYSTEM_PORT}, serves_http=False, exports_metrics=True
    )


def worker_launch(ctx: Context, role: str) -> EngineLaunch:
    """One role's worker: `ctx.plan` is the role's plan."""
    backend = BACKENDS[EngineName(ctx.plan.engine)]
    command = worker_command(ctx, role)
    if backend.engine == EngineName.TRTLLM:
        return _trtllm_launch(ctx, role, command, backend)
    if backend.engine == EngineName.VLLM:
        group = ["--nnodes", LWS_GROUP_SIZE, "--master-addr", LWS_LEADER_ADDRESS]
        launch = node_rank_launch(ctx, command[:1], command[1:], {}, WORKER_PROBES, group, ("--headless",))
    else:
        group = ["--dist-init-addr", f"{LWS_LEADER_ADDRESS}:{SGLANG_DIST_INIT_PORT}", "--nnodes", LWS_GROUP_SIZE]
        launch = node_rank_launch(ctx, command[:1], command[1:], {}, WORKER_PROBES, group)
    serving = {Role.SINGLE, Role.LEADER}
    return dataclasses.replace(
        launch, containers={r: _as_worker(c, r in serving) for r, c in launch.containers.items()}
    )


def _trtllm_launch(ctx: Context, role: str, command: list[str], backend: DynamoBackend) -> EngineLaunch:
    """TensorRT-LLM's worker: its YAML in the ConfigMap; one node runs the worker directly, several run it once per
    GPU through mpirun from the leader (trtllm-llmapi-launch), as the aggregated TensorRT-LLM replica does."""
    files = role_config_files(ctx, role)
    argv = command
    if not ctx.multi_node:
        single = Container(argv[:1], [literal(a) for a in argv[1:]], trtllm.env(ctx), WORKER_PROBES, {}, True)
        return EngineLaunch({Role.SINGLE: _as_worker(single, True)}, files)
    plan = ctx.plan
    values: dict[str, Any] = {
        "nodes": plan.nodes_per_replica,
        "gpus_per_node": plan.gpus_per_node,
        "world": plan.gpus_per_replica,
        "ssh_port": trtllm.SSH_PORT,
        "ssh_mount": SSH_MOUNT,
        "serve": shlex.join(argv),
        "chat_template_lookup": "",
    }
    leader_script, worker_script = f"{role}-{trtllm.LEADER_SCRIPT}", f"{role}-{trtllm.WORKER_SCRIPT}"
    files[leader_script] = templates().get_template("trtllm-leader.sh.j2").render(values)
    files[worker_script] = templates().get_template("trtllm-worker.sh.j2").render(values)
    ssh_ready = Probes(startup=None, readiness=Probe(None, trtllm.SSH_PORT, 10, 3), liveness=None)
    leader = Container([*BASH], [f"{CONFIG_MOUNT}/{leader_script}"], trtllm.env(ctx), WORKER_PROBES, {}, True)
    worker = Container(
        [*BASH],
        [f"{CONFIG_MOUNT}/{worker_script}"],
        trtllm.env(ctx),
        ssh_ready,
        {"ssh": trtllm.SSH_PORT},
        False,
        trtllm.SSHD_CAPABILITIES,
        runs_as_root=True,
    )
    leader = dataclasses.replace(_as_worker(leader, True), runs_as_root=True)
    return EngineLaunch(
        {Role.LEADER: leader, Role.WORKER: _as_worker(worker, False)}, files, ssh_secret=trtllm.ssh_secret_name(ctx)
    )
