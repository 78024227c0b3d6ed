"""The GitOps health checks for MiniMaxM3Deployment, evaluated against statuses the operator writes.

* Argo CD: manifests/gitops/argocd/health.lua, run with Lua 5.1 (lupa), the language version of
  Argo CD's gopher-lua, exactly as Argo CD calls it: a chunk with a global `obj` that returns
  {status, message}.
* Flux: the healthCheckExprs of manifests/gitops/flux/m3fleet.yaml, evaluated with cel-python in
  Flux's order (inProgress, failed, current; the first true decides).

The conditions come from m3fleet.controller.status.conditions, the function the operator uses, so a
change in the operator's reasons or polarity shows up here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import celpy
import lupa.lua51 as lua51
import pytest
import yaml

from m3fleet.controller.status import Blocked, PodFailure, Workload, conditions
from tests.support.chart import KUBECTL, ROOT, generate

LUA = ROOT / "manifests" / "gitops" / "argocd" / "health.lua"
FLUX = ROOT / "manifests" / "gitops" / "flux" / "m3fleet.yaml"
NOW = "2026-01-01T00:00:00Z"


def resource(generation: int, status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "chat", "namespace": "llm", "generation": generation},
        "spec": {"accelerator": "h200", "engine": {"name": "vllm"}},
    }
    if status is not None:
        obj["status"] = status
    return obj


def status(observed: int, workload: Workload, blocked: Blocked | None = None) -> dict[str, Any]:
    return {
        "observedGeneration": observed,
        "conditions": conditions([], observed, NOW, workload, blocked),
        "replicas": workload.replicas,
        "readyReplicas": workload.ready,
    }


READY = Workload(desired=2, replicas=2, ready=2, updated=2, observed_current=True)
ROLLING = Workload(desired=2, replicas=2, ready=1, updated=1, observed_current=True)
LWS_MISSING = Blocked("LeaderWorkerSetNotInstalled", "a replica spans 2 nodes and needs the LeaderWorkerSet API")
INVALID = Blocked("InvalidSpec", "spec.context.maxModelLen: 1048576 needs 1.05M KV tokens per replica")
DRA_MISSING = Blocked("ComputeDomainNotInstalled", "multi-node GB200 replicas need the NVIDIA DRA driver")
CRASHING = Workload(
    desired=1,
    replicas=1,
    updated=1,
    observed_current=True,
    failure=PodFailure("CrashLoopBackOff", "1 of 1 pods failing: pod chat-0, container engine: restarted 5 times"),
)
REFUSED = Workload(
    desired=1,
    observed_current=True,
    failure=PodFailure("FailedCreate", 'StatefulSet chat cannot create pods: violates PodSecurity "restricted"'),
)

# name -> (resource, Argo CD health, a substring of its message, Flux outcome)
CASES: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "healthy": (resource(3, status(3, READY)), "Healthy", "AllReplicasReady: all 2 replicas ready", "current"),
    "scaled-to-zero": (
        resource(3, status(3, Workload(desired=0, observed_current=True))),
        "Healthy",
        "ScaledToZero",
        "current",
    ),
    "rollout": (
        resource(3, status(3, ROLLING)),
        "Progressing",
        "RolloutInProgress: 1 of 2 replicas ready",
        "inProgress",
    ),
    "first-pods-starting": (
        resource(1, status(1, Workload(desired=1))),
        "Progressing",
        "0 of 1 replicas ready",
        "inProgress",
    ),
    "generation-lags": (resource(4, status(3, READY)), "Progressing", "observe generation 4", "inProgress"),
    "invalid-spec": (
        resource(3, status(3, READY, INVALID)),
        "Degraded",
        "InvalidSpec: spec.context.maxModelLen",
        "failed",
    ),
    "lws-missing": (
        resource(2, status(2, Workload(desired=1), LWS_MISSING)),
        "Degraded",
        "LeaderWorkerSetNotInstalled",
        "failed",
    ),
    "dra-missing": (
        resource(2, status(2, Workload(desired=1), DRA_MISSING)),
        "Degraded",
        "ComputeDomainNotInstalled",
        "failed",
    ),
    # Engine pods that fail do not heal by waiting: Degraded, not Progressing for ever.
    "crash-loop": (resource(2, status(2, CRASHING)), "Degraded", "CrashLoopBackOff: 0 of 1 replicas ready", "failed"),
    "pods-refused": (resource(2, status(2, REFUSED)), "Degraded", "FailedCreate", "failed"),
    # A fix the operator has not seen yet: Progressing, not Degraded.
    "degraded-but-lagging": (
        resource(5, status(4, READY, INVALID)),
        "Progressing",
        "observe generation 5",
        "inProgress",
    ),
    # Before the operator's first reconcile. cel-go (Flux) errors on the absent top-level `status`
    # and cel-python treats has() on it as false; either way Flux keeps waiting, never "current".
    "missing-status": (resource(1, None), "Progressing", "Waiting for the m3fleet operator", "inProgress|error"),
    "status-without-conditions": (
        resource(1, {"observedGeneration": 1}),
        "Progressing",
        "Waiting for the m3fleet operator",
        "none",
    ),
}


def argocd_health(obj: dict[str, Any]) -> dict[str, Any]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = runtime.table_from(obj, recursive=True)
    result = runtime.execute(LUA.read_text())
    return dict(result.items())


@pytest.mark.parametrize("case", CASES, ids=CASES.keys())
def test_argocd_lua_health(case: str) -> None:
    obj, health, message, _ = CASES[case]
    result = argocd_health(obj)
    assert set(result) == {"status", "message"}
    assert result["status"] == health
    assert message in result["message"]


def flux_exprs() -> dict[str, str]:
    kustomization = next(d for d in yaml.safe_load_all(FLUX.read_text()) if d["metadata"]["name"] == "m3fleet-fleet")
    (check,) = kustomization["spec"]["healthCheckExprs"]
    assert (check["apiVersion"], check["kind"]) == ("m3fleet.dev/v1alpha1", "MiniMaxM3Deployment")
    return {k: check[k] for k in ("inProgress", "failed", "current")}


def flux_health(obj: dict[str, Any]) -> str:
    """Flux's evaluation order; the object's top-level fields are the variables."""
    env = celpy.Environment()
    activation = {key: celpy.json_to_cel(value) for key, value in obj.items()}
    for name, expr in flux_exprs().items():
        result = env.program(env.compile(expr)).evaluate(activation)
        if isinstance(result, celpy.CELEvalError):
            return "error"  # Flux keeps waiting (until its timeout), i.e. in progress
        if bool(result):
            return name
    return "none"  # none true: not ready yet


@pytest.mark.parametrize("case", CASES, ids=CASES.keys())
def test_flux_health_check_exprs(case: str) -> None:
    obj, _, _, outcome = CASES[case]
    assert flux_health(obj) in outcome.split("|")


def test_argocd_patch_carries_the_script(tmp_path: Path) -> None:
    """docs/install.md's `kubectl patch configmap argocd-cm --patch-file ...`, offline (--local)."""
    argocd_cm = tmp_path / "argocd-cm.yaml"
    argocd_cm.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "argocd-cm", "namespace": "argocd"},
                "data": {"url": "https://argocd.example.com"},
            }
        )
    )
    patch = ROOT / "manifests" / "gitops" / "argocd" / "argocd-cm-patch.yaml"
    result = subprocess.run(
        [
            str(KUBECTL),
            "patch",
            "--local",
            "-f",
            str(argocd_cm),
            "--type",
            "merge",
            "--patch-file",
            str(patch),
            "-o",
            "yaml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(result.stdout)["data"]
    assert data["url"] == "https://argocd.example.com"  # other settings are kept
    assert data[generate().ARGOCD_HEALTH_KEY] == LUA.read_text()
