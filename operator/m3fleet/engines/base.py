"""What every engine module produces, and the pieces they share.

An engine module turns (spec, plan) into an `EngineLaunch`: the container command per pod role,
its environment, the config files it needs (rendered into a ConfigMap), its port and probes.
It knows nothing about Kubernetes objects; `m3fleet.render` wraps launches into pods.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any

import jinja2

from m3fleet.api.models import MiniMaxM3DeploymentSpec, Plan
from m3fleet.api.spec_pod import MODEL_LINK_DIR, MODEL_MOUNT  # the container's paths are the API's
from m3fleet.catalog import ACCELERATORS, ENGINES, ROPE, AcceleratorFacts, EngineFacts

MODEL_LINK = f"{MODEL_LINK_DIR}/checkpoint"
# Launch scripts run with no startup files and in privileged mode (-p): bash then ignores BASH_ENV, ENV, exported
# functions and SHELLOPTS/BASHOPTS from the environment, whoever set them.
BASH = ("/bin/bash", "--noprofile", "--norc", "-p")


# The name of the serving container port in every engine pod (the Service and the PodMonitor address it by name).
SERVING_PORT = "http"

# How an engine pod stops (a scale-down, a rollout, a drained node): during the preStop sleep the endpoints stop
# routing to it; then SIGTERM. SGLang then finishes what it has in flight; vLLM aborts it unless --shutdown-timeout
# gives it time to drain. The kubelet kills the pod at the grace period, so vLLM's drain ends early enough to free
# its GPUs before that.
TERMINATION_GRACE_SECONDS = 600  # let in-flight long-context requests finish (a 1M-token decode takes minutes)
DRAIN_SECONDS = 15  # endpoints stop routing before the engine gets SIGTERM
TEARDOWN_SECONDS = 30  # after the drain, for the engine to release its GPUs before the kill
SHUTDOWN_TIMEOUT_SECONDS = TERMINATION_GRACE_SECONDS - DRAIN_SECONDS - TEARDOWN_SECONDS  # vLLM --shutdown-timeout
IN_FLIGHT_DEADLINE_SECONDS = DRAIN_SECONDS + SHUTDOWN_TIMEOUT_SECONDS  # from deletion until what runs is cut off


class Role(StrEnum):
    SINGLE = "single"  # the whole replica in one pod (Deployment)
    LEADER = "leader"  # LWS worker index 0: serves HTTP
    WORKER = "worker"  # LWS worker index >= 1: headless ranks


# The LeaderWorkerSet controller injects these into every container (LWS-REF); Kubernetes expands
# $(VAR) references in args from the container's environment.
LWS_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
LWS_GROUP_SIZE = "$(LWS_GROUP_SIZE)"
LWS_WORKER_INDEX = "$(LWS_WORKER_INDEX)"


@dataclass(frozen=True)
class CacheMount:
    """The MiniMaxM3ModelCache a resource serves from, as far as its pods need to know it."""

    name: str
    path: str  # the node-local directory
    node_label: str  # <key>=ready on nodes holding a verified copy
    required: bool  # nodeAffinity Required (else Preferred)


@dataclass(frozen=True)
class Context:
    """Everything an engine needs to know about one resource."""

    name: str
    namespace: str
    spec: MiniMaxM3DeploymentSpec
    plan: Plan
    cache: CacheMount | None = None
    tier: str = ""  # a context tier of spec.gateway (its own workload); "" is the spec's own context

    @property
    def engine(self) -> EngineFacts:
        return ENGINES[self.plan.engine]

    @property
    def accelerator(self) -> AcceleratorFacts:
        return ACCELERATORS[self.plan.accelerator]

    @property
    def multi_node(self) -> bool:
        return self.plan.nodes_per_replica > 1

    @property
    def model_path(self) -> str:
        """What the engine loads: the mounted checkpoint directory, or the hub id (downloaded into the cache).
        With a model cache: the node-local copy (Required), or a symlink to it or to the pvc (Preferred)."""
        if self.cache is not None:
            return MODEL_MOUNT if self.cache.required else MODEL_LINK
        pvc = self.spec.model.source.pvc
        if pvc is None:
            return self.plan.checkpoint
        return f"{MODEL_MOUNT}/{pvc.sub_path.strip('/')}".rstrip("/") if pvc.sub_path else MODEL_MOUNT

    @property
    def served_model_name(self) -> str:
        return self.plan.checkpoint

    def resource_name(self, suffix: str) -> str:
        return f"{self.name}-{suffix}"

    @property
    def workload_name(self) -> str:
        """The Deployment or LeaderWorkerSet: `<name>`, a context tier's `<name>-<tier>`."""
        return self.resource_name(self.tier) if self.tier else self.name

    @property
    def config_map_name(self) -> str:
        """The engine-config ConfigMap of this workload."""
        return f"{self.workload_name}-engine-config"


@dataclass(frozen=True)
class Probe:
    path: str | None  # HTTP GET path; None for a TCP check
    port: int
    period_seconds: int
    failure_threshold: int
    timeout_seconds: int = 5


@dataclass(frozen=True)
class Probes:
    startup: Probe | None
    readiness: Probe | None
    liveness: Probe | None


@dataclass(frozen=True)
class KeyGuard:
    """The authenticating proxy (`m3fleet.keyguard`) a container of its own runs in front of an engine that holds
    no key: it listens on the engine's port, the engine on 127.0.0.1 only."""

    config: str  # keyguard's one argument (JSON): ports and the engine's API-key routes
    secret_env: dict[str, tuple[str, str]]  # the keys, as for Container.secret_env (only this container has them)


@dataclass(frozen=True)
class Container:
    command: list[str]
    args: list[str]
    env: dict[str, str]
    probes: Probes
    ports: dict[str, int]  # name -> containerPort
    serves_http: bool  # behind the Service, scraped for metrics
    capabilities: tuple[str, ...] = ()  # added to the dropped-ALL set, only where the engine needs them
    # env name -> (Secret, key): values the kubelet reads from a Secret (never in the pod spec or a ConfigMap)
    secret_env: dict[str, tuple[str, str]] = field(default_factory=dict)
    runs_as_root: bool = False  # the image's launch needs root (sshd); otherwise the pod runs as NON_ROOT_UID
    # Scraped for metrics without serving (SGLang's worker nodes: their DP ranks' schedulers export there).
    exports_metrics: bool = False
    key_guard: KeyGuard | None = None  # the proxy that owns `ports` and the keys (SGLang)


@dataclass(frozen=True)
class EngineLaunch:
    containers: dict[Role, Container]
    config_files: dict[str, str] = field(default_factory=dict)  # ConfigMap data, mounted at CONFIG_MOUNT
    ssh_secret: str | None = None  # the Secret with the SSH key mpirun needs (TensorRT-LLM multi-node)


# --- helpers shared by the engine modules ----------------------------------------------------

WEIGHT_LOAD_BUDGET_SECONDS = 90 * 60  # 427B parameters from network storage can take the better part of an hour


def http_probes(port: int, live: str, ready: str, ready_period: int = 10, ready_timeout: int = 5) -> Probes:
    """Startup gives the weight load its budget; readiness/liveness only start once it passes."""
    period = 10
    return Probes(
        startup=Probe(live, port, period, WEIGHT_LOAD_BUDGET_SECONDS // period),
        readiness=Probe(ready, port, ready_period, 3, ready_timeout),
        liveness=Probe(live, port, 30, 5, 10),
    )


NO_PROBES = Probes(None, None, None)


def literal(value: str) -> str:
    """A user's string as a container arg: the kubelet expands $(VAR) in args (`$$` is a literal `$`), so a value
    like `$(HF_TOKEN)` would otherwise put the token on the command line."""
    return value.replace("$", "$$")


def secret_env(ctx: Context, variable: str, admin_variable: str | None = None) -> dict[str, tuple[str, str]]:
    """The API key (and SGLang's admin key) as env read from their Secrets by the kubelet."""
    refs: dict[str, tuple[str, str]] = {}
    engine = ctx.spec.engine
    if engine.api_key_secret_ref is not None:
        refs[variable] = (engine.api_key_secret_ref.name, engine.api_key_secret_ref.key)
    if admin_variable is not None and engine.admin_api_key_secret_ref is not None:
        refs[admin_variable] = (engine.admin_api_key_secret_ref.name, engine.admin_api_key_secret_ref.key)
    return refs


def node_rank_launch(
    ctx: Context,
    command: list[str],
    args: list[str],
    env: dict[str, str],
    probes: Probes,
    group_args: list[str],
    worker_args: tuple[str, ...] = (),
    secrets: dict[str, tuple[str, str]] | None = None,
    worker_health: Probes | None = None,
    key_guard: KeyGuard | None = None,
) -> EngineLaunch:
    """The launch shape vLLM and SGLang share: one pod per replica, or a leader (node rank 0, serves
    HTTP) plus workers (node rank from the LWS environment). With `worker_health` a worker runs its own health
    server on the engine port (SGLang): probed with those probes, and its node's metrics are scraped there;
    otherwise a worker is headless, opens no port and has no probes."""
    extra = [literal(arg) for arg in ctx.spec.engine.extra_args]
    port = ctx.engine.port
    refs = secrets or {}
    if not ctx.multi_node:
        single = Container(
            command, [*args, *extra], env, probes, {SERVING_PORT: port}, True, secret_env=refs, key_guard=key_guard
        )
        return EngineLaunch({Role.SINGLE: single})
    leader_args = [*args, *group_args, "--node-rank", "0", *extra]
    worker_args_all = [*args, *group_args, "--node-rank", LWS_WORKER_INDEX, *worker_args, *extra]
    return EngineLaunch(
        {
            Role.LEADER: Container(
                command, leader_args, env, probes, {SERVING_PORT: port}, True, secret_env=refs, key_guard=key_guard
            ),
            Role.WORKER: Container(
                command,
                worker_args_all,
                env,
                worker_health or NO_PROBES,
                {SERVING_PORT: port} if worker_health else {},
                False,
                exports_metrics=worker_health is not None,
                secret_env=refs,
                key_guard=key_guard if worker_health else None,
            ),
        }
    )


def yarn_overrides(plan: Plan) -> dict[str, Any]:
    """YaRN on the text decoder's config (a top-level override misses it, VLLM-RCP-AMD), as the whole RoPE block.

    Under transformers 5 setting `rope_scaling` replaces `rope_parameters` wholesale. SGLang 0.5.23 applies a
    nested override with `text_config.update(...)` and then reads `rope_parameters.get("rope_theta", 10000)`, so
    a YaRN dict without the checkpoint's theta (5,000,000) silently rotates with 10,000 and every position past
    the native context is wrong. vLLM merges the same dict and back-fills theta, so carrying it is harmless there.
    """
    return {
        "text_config": {
            "rope_scaling": {
                "rope_type": "yarn",
                "rope_theta": ROPE.theta,
                "partial_rotary_factor": ROPE.partial_rotary_factor,
                "factor": plan.rope_scaling_factor,
                "original_max_position_embeddings": plan.native_max_model_len,
            }
        }
    }


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@cache
def templates() -> jinja2.Environment:
    """Launch scripts are jinja2 templates shipped with the package (read once, never written)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("m3fleet.engines", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["shquote"] = shlex.quote
    return env
