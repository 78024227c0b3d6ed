"""Rendered resources over the samples and a fixed spec grid, and the engine argv each container runs.

Pure: imports m3fleet only (never an engine), so the unit tier can use it too. Deterministic: the
grid is an enumerated cross product, not a random draw, so every run checks the same commands.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from m3fleet.api import parse_resource
from m3fleet.api.models import Accelerator, EngineName, MoeBackend, Variant
from m3fleet.catalog import ENGINES
from m3fleet.engines import sglang
from m3fleet.errors import SpecError
from m3fleet.planner import plan
from m3fleet.render import labels, render

SAMPLES_DIR = Path(__file__).resolve().parents[3] / "manifests" / "samples"
NAMESPACE = "ns"

# What each engine's container runs before the argv its own parser sees (the engines' images: VLLM-RCP, SGL-CB).
LAUNCHERS: dict[str, tuple[str, ...]] = {
    EngineName.VLLM: ("vllm", "serve"),
    EngineName.SGLANG: tuple(sglang.COMMAND),  # python3 -m sglang.launch_server (it holds no key)
}
ENGINE_CONTAINER = "engine"

# The grid's axes. Contexts: short (below every long-context switch), the default, and 1M, which is
# past the BF16/MXFP4 native 512K (YaRN) and plans to two nodes on H200 and GB200 (leader + worker).
STRATEGIES = ("tp", "tp-ep", "dp-ep")
# Pools rendered with another pool's flags (same vendor, architecture and GPUs a node, the same engine facts; only GPU
# memory differs, which the planner's tests cover): left out of the cross product to keep the tier's time, checked
# through their twin (tests/unit/test_pools.py proves the flags equal). MI300X is not one: gfx942 takes SGLang flags
# MI355X's gfx950 does not.
FLAG_TWINS = {
    Accelerator.B300: Accelerator.B200,
    Accelerator.GB300: Accelerator.GB200,
    Accelerator.H100: Accelerator.H200,
    Accelerator.H20: Accelerator.H200,
    Accelerator.MI325X: Accelerator.MI300X,
    Accelerator.MI350X: Accelerator.MI355X,
}
# The same for one engine only: vLLM runs the recipe's one AMD command on gfx942 and gfx950 (MI300X serves BF16 only,
# whose flags are MI355X's BF16 flags), while SGLang's MI300X flags are its own.
ENGINE_FLAG_TWINS = {(EngineName.VLLM.value, Accelerator.MI300X): Accelerator.MI355X}


def flag_twin(engine: str, accelerator: Accelerator) -> Accelerator | None:
    """The pool whose commands stand for `accelerator`'s on `engine` in the parser grid, if any (followed through a
    twin that is itself twinned: vLLM's MI325X -> MI300X -> MI355X)."""
    twin = FLAG_TWINS.get(accelerator) or ENGINE_FLAG_TWINS.get((engine, accelerator))
    return None if twin is None else flag_twin(engine, twin) or twin


CONTEXTS = (8_192, 131_072, 1_048_576)
KV_DTYPES = ("bf16", "fp8")


@dataclass(frozen=True)
class Spec:
    """One point of the grid."""

    engine: str
    accelerator: str
    variant: str
    strategy: str
    max_model_len: int
    kv_cache_dtype: str
    language_model_only: bool = False
    moe_backend: str = MoeBackend.AUTO.value
    min_sequences: int = 1

    @property
    def label(self) -> str:
        parts = [self.engine, self.accelerator, self.variant, self.strategy, str(self.max_model_len)]
        parts += [f"kv-{self.kv_cache_dtype}", "text" if self.language_model_only else "mm"]
        if self.variant == Variant.MXFP4:
            parts.append(f"moe-{self.moe_backend}")
        if self.min_sequences > 1:
            parts.append(f"x{self.min_sequences}")
        return "-".join(parts)

    def document(self) -> dict[str, Any]:
        # The model path takes both rendered forms (a PVC sub-path, a hub id) without doubling the grid.
        source: dict[str, Any] = (
            {"huggingFace": {"cacheClaimName": "hf-cache"}}
            if self.language_model_only
            else {"pvc": {"claimName": "weights", "subPath": "m3"}}
        )
        return {
            "apiVersion": "m3fleet.dev/v1alpha1",
            "kind": "MiniMaxM3Deployment",
            "metadata": {"name": "grid", "namespace": NAMESPACE},
            "spec": {
                "model": {"variant": self.variant, "source": source, "languageModelOnly": self.language_model_only},
                "engine": {"name": self.engine, "moeBackend": self.moe_backend},
                "accelerator": self.accelerator,
                "parallelism": {"strategy": self.strategy},
                "context": {
                    "maxModelLen": self.max_model_len,
                    "kvCacheDtype": self.kv_cache_dtype,
                    "minSequencesAtMaxLen": self.min_sequences,
                },
            },
        }


# Shapes the cross product does not reach: two H200 nodes as TP8 x PP2 (vLLM holds one 512k sequence on one
# node, and refuses YaRN on NVIDIA, so only two full-length sequences take it past a node), for both engines.
PIPELINE_SPECS = [
    Spec(engine, "h200", "bf16", strategy, 524_288, "bf16", min_sequences=2)
    for engine in ("vllm", "sglang")
    for strategy in ("tp", "tp-ep")
]


def spec_grid(
    engines: tuple[str, ...],
    strategies: tuple[str, ...] = STRATEGIES,
    contexts: tuple[int, ...] = CONTEXTS,
    kv_dtypes: tuple[str, ...] = KV_DTYPES,
    text_only: tuple[bool, ...] = (False, True),
) -> list[Spec]:
    """Every engine x supported accelerator x supported variant x the given axes (MXFP4 x every MoE backend)."""
    specs: list[Spec] = []
    for engine in engines:
        for accelerator, variants in ENGINES[EngineName(engine)].support.items():
            if flag_twin(engine, accelerator) is not None:
                continue
            for variant in variants:
                backends = [b.value for b in MoeBackend] if variant == Variant.MXFP4 else [MoeBackend.AUTO.value]
                for strategy, context, kv, lmo, backend in itertools.product(
                    strategies, contexts, kv_dtypes, text_only, backends
                ):
                    specs.append(Spec(engine, accelerator.value, variant.value, strategy, context, kv, lmo, backend))
    return specs


@dataclass(frozen=True)
class Rendered:
    """One resource and every object m3fleet renders for it."""

    label: str  # "sample/<file stem>" or "grid/<spec label>"
    name: str  # metadata.name
    engine: str
    accelerator: Accelerator
    objects: list[dict[str, Any]]


def render_document(label: str, doc: dict[str, Any]) -> Rendered:
    """Parse, plan and render one resource document; SpecError propagates."""
    resource = parse_resource(doc)
    planned = plan(resource.spec)
    return Rendered(label, resource.metadata.name, planned.engine, planned.accelerator, render(resource, planned))


def samples() -> list[Rendered]:
    """Every sample manifest, rendered (a sample the planner rejects is a bug: it raises)."""
    return [
        render_document(f"sample/{p.stem}", yaml.safe_load(p.read_text())) for p in sorted(SAMPLES_DIR.glob("*.yaml"))
    ]


def grid(specs: list[Spec]) -> list[Rendered]:
    """The specs the planner accepts, rendered; the rest are impossible by design (e.g. dp-ep at 1M)."""
    rendered: list[Rendered] = []
    for spec in specs:
        try:
            rendered.append(render_document(f"grid/{spec.label}", spec.document()))
        except SpecError:
            continue
    return rendered


# --- from pod templates to the argv the engine process receives ------------------------------


@dataclass(frozen=True)
class Command:
    """One container's engine argv, as the process would receive it."""

    id: str  # "<resource label>/<role>", unique
    resource: str  # label and metadata.name, for failure messages
    role: str  # single | leader | worker (the pod's m3fleet.dev/role)
    container: str
    engine: str
    argv: list[str]  # after LAUNCHERS[engine], with $(VAR) references expanded


def pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """(pod template, the variables LeaderWorkerSet injects into its containers) of every workload."""
    for obj in objects:
        if obj["kind"] == "Deployment":
            yield obj["spec"]["template"], {}
        elif obj["kind"] == "LeaderWorkerSet":
            name, size = obj["metadata"]["name"], obj["spec"]["leaderWorkerTemplate"]["size"]
            # LWS-REF: the leader's DNS name is <lws>-<group>.<lws>.<namespace>; group 0 here.
            injected = {
                "LWS_LEADER_ADDRESS": f"{name}-0.{name}.{obj['metadata']['namespace']}",
                "LWS_GROUP_SIZE": str(size),
            }
            lwt = obj["spec"]["leaderWorkerTemplate"]
            yield lwt["leaderTemplate"], {**injected, "LWS_WORKER_INDEX": "0"}
            # The last worker: node rank nnodes - 1 is the edge a wrong rank formula would break.
            yield lwt["workerTemplate"], {**injected, "LWS_WORKER_INDEX": str(size - 1)}


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(arg: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of container args: `$$` escapes, unknown references stay as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return variables.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, arg)


def commands(rendered: Rendered) -> list[Command]:
    """The vLLM/SGLang argv of every container in `rendered` (none for other engines)."""
    launcher = LAUNCHERS.get(rendered.engine)
    if launcher is None:
        return []
    found: list[Command] = []
    for template, injected in pod_templates(rendered.objects):
        pod_labels = template["metadata"]["labels"]
        if labels.ROLE not in pod_labels:
            continue  # not an engine pod: spec.gateway's endpoint picker
        role = pod_labels[labels.ROLE]
        tier = f"/{pod_labels[labels.TIER]}" if labels.TIER in pod_labels else ""  # a context tier's own workload
        # The engine's container; SGLang's pods also run the key guard beside it (test_key_guard.py covers it).
        for container in (c for c in template["spec"]["containers"] if c["name"] == ENGINE_CONTAINER):
            full = [*container.get("command", []), *container.get("args", [])]
            if tuple(full[: len(launcher)]) != launcher:
                raise AssertionError(
                    f"{rendered.label} {role}/{container['name']}: expected {' '.join(launcher)!r}, got {full[:4]}"
                )
            # The args hold $(LWS_...) references that the kubelet expands from the container's
            # environment (LWS injects those variables); the engine only ever sees the values.
            variables = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e} | injected
            argv = [expand(arg, variables) for arg in full[len(launcher) :]]
            found.append(
                Command(
                    id=f"{rendered.label}/{role}{tier}",
                    resource=f"{rendered.label} (metadata.name {rendered.name})",
                    role=role,
                    container=container["name"],
                    engine=rendered.engine,
                    argv=argv,
                )
            )
    return found
