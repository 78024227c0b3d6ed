"""The Dynamo commands (`python3 -m dynamo.<module> ...`) in rendered objects, as their processes receive them.

Pure: imports m3fleet and the engine grid's pod-template walk only, so the unit tier can use it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from m3fleet.render import labels
from tests.support.engines.grid import expand, pod_templates

PYTHONS = ("python", "python3")


@dataclass(frozen=True)
class DynamoCommand:
    """One container that runs a Dynamo module."""

    id: str  # "<label>/<workload>/<role>/<container>", unique
    workload: str  # the Deployment's or LeaderWorkerSet's metadata.name
    role: str  # the pod's m3fleet.dev/role label
    container: str
    module: str  # dynamo.frontend | dynamo.trtllm | dynamo.vllm | dynamo.sglang | ...
    argv: list[str]  # after `python3 -m <module>`, $(VAR) references expanded
    env: dict[str, str]  # the container's literal environment (Dynamo's options default from DYN_* variables)

    def item(self) -> dict[str, Any]:
        """What tests/support/dynamo/checker.py reads."""
        return {"id": self.id, "module": self.module, "argv": self.argv, "env": self.env}


def module_of(full: list[str]) -> tuple[str, list[str]] | None:
    """(module, argv) when `full` is `python[3] -m dynamo.<x> ...`, else None."""
    if len(full) >= 3 and full[0].rsplit("/", 1)[-1] in PYTHONS and full[1] == "-m" and full[2].startswith("dynamo."):
        return full[2], full[3:]
    return None


def dynamo_commands(label: str, objects: list[dict[str, Any]]) -> list[DynamoCommand]:
    """Every container in `objects`' workloads that runs a Dynamo module."""
    found: list[DynamoCommand] = []
    for obj in objects:
        if obj["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        for template, injected in pod_templates([obj]):
            role = template["metadata"].get("labels", {}).get(labels.ROLE, "")
            for container in template["spec"]["containers"]:
                parsed = module_of([*container.get("command", []), *container.get("args", [])])
                if parsed is None:
                    continue
                module, args = parsed
                env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
                variables = env | injected
                found.append(
                    DynamoCommand(
                        id=f"{label}/{obj['metadata']['name']}/{role}/{container['name']}",
                        workload=obj["metadata"]["name"],
                        role=role,
                        container=container["name"],
                        module=module,
                        argv=[expand(arg, variables) for arg in args],
                        env=env,
                    )
                )
    return found
