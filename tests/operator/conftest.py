"""The real m3fleet operator (kopf, in-process) against the apiserver emulator in tests/kube."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import kopf
import kubernetes
import pytest
import yaml

from m3fleet.controller.handlers import register
from m3fleet.controller.kube import KubeApi
from m3fleet.controller.reconcile import Reconciler
from tests.conftest import SAMPLES_DIR
from tests.kube.conftest_helpers import run_operator
from tests.kube.emulator import ApiServerEmulator

NS = "llm"
M3D = "m3fleet.dev/v1alpha1/minimaxm3deployments"
LWS = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
COMPUTE_DOMAINS = "resource.nvidia.com/v1beta1/computedomains"
DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
CONFIGMAPS = "v1/configmaps"
SECRETS = "v1/secrets"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here talks to the apiserver emulator, not to plain kmock."""
    for item in items:
        if "tests/operator/" in str(item.path):
            item.add_marker(pytest.mark.kmock(cls=ApiServerEmulator))


def declare_cluster(kmock: ApiServerEmulator, *, lws: bool = True, compute_domains: bool = True) -> None:
    kmock.declare_builtin()
    kmock.declare(
        M3D,
        "MiniMaxM3Deployment",
        subresources=("status", "scale"),
        shortnames=("m3d",),
        scale_paths=None,  # the defaults: .spec.replicas, .status.replicas, .status.selector
    )
    if lws:
        kmock.declare(LWS, "LeaderWorkerSet", subresources=("status", "scale"))
    if compute_domains:
        kmock.declare(COMPUTE_DOMAINS, "ComputeDomain", subresources=("status",))


def sample(name: str, **spec_changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES_DIR / f"{name}.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = NS
    doc["spec"].update(spec_changes)
    return doc


def api_for(kmock: ApiServerEmulator) -> KubeApi:
    config = kubernetes.client.Configuration(host=str(kmock.url).rstrip("/"))
    return KubeApi(kubernetes.client.ApiClient(config))


@dataclass
class Operator:
    kmock: ApiServerEmulator
    reconciler: Reconciler

    def get(self, resource: str, name: str) -> dict[str, Any] | None:
        return self.kmock.get_object(resource, NS, name)

    async def create(self, doc: dict[str, Any]) -> None:
        resp = await self.kmock.post(f"/apis/m3fleet.dev/v1alpha1/namespaces/{NS}/minimaxm3deployments", json=doc)
        assert resp.status == 201, await resp.text()

    async def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        resp = await self.kmock.patch(
            f"/apis/m3fleet.dev/v1alpha1/namespaces/{NS}/minimaxm3deployments/{name}",
            json={"spec": spec},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert resp.status == 200, await resp.text()


async def start(kmock: ApiServerEmulator, resync: float = 600) -> AsyncIterator[Operator]:
    registry = kopf.OperatorRegistry()
    reconciler = register(registry, api_for(kmock), resync_seconds=resync)
    async with run_operator(kmock, registry, namespaces=[NS]):
        yield Operator(kmock, reconciler)


@pytest.fixture
async def operator(kmock: ApiServerEmulator) -> AsyncIterator[Operator]:
    declare_cluster(kmock)
    async for op in start(kmock):
        yield op
