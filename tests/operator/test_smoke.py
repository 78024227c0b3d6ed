from __future__ import annotations

from tests.kube.conftest_helpers import eventually
from tests.operator.conftest import CONFIGMAPS, DEPLOYMENTS, M3D, SERVICES, Operator, sample


async def test_create_applies_children_and_writes_status(operator: Operator) -> None:
    await operator.create(sample("vllm-h200-tp8"))
    name = "m3-vllm-h200-tp8"
    await eventually(lambda: operator.get(DEPLOYMENTS, name) is not None)
    await eventually(lambda: (operator.get(M3D, name) or {}).get("status", {}).get("plan") is not None)
    m3d = operator.get(M3D, name)
    assert m3d is not None
    deployment = operator.get(DEPLOYMENTS, name)
    assert deployment is not None and operator.get(SERVICES, name) is not None
    assert operator.get(CONFIGMAPS, f"{name}-engine-config") is None
    print(m3d["status"])
    print(deployment["metadata"]["managedFields"])
