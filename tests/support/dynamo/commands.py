"""The Dynamo commands (`python3 -m dynamo.<module> ...`) in rendered objects, as their processes receive them.

Pure: imports m3fleet and the engine grid's pod-template walk only, so the unit tier can use it too.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from m3fleet.render import labels
from tests.support.engines.grid import expand, pod_templates

PYTHONS = ("python", "python3")
DYNAMO_ROLE = f"{labels.PREFIX}dynamo-role"  # frontend | prefill | decode, on a disaggregated fleet's pods


@dataclass(frozen=True)
class DynamoCommand:
    """One container that runs a Dynamo module."""

    id: str  # "<label>/<workload>/<single|leader|worker>/<container>", unique
    workload: str  # the Deployment's or LeaderWorkerSet's metadata.name
    role: str  # the pod's m3fleet.dev/dynamo-role (frontend, prefill, decode), else its m3fleet.dev/role
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


SHELL_OPERATORS = {";", "&&", "||", "|", "&"}


def in_script(script: str) -> tuple[str, list[str]] | None:
    """(module, argv) of the `python3 -m dynamo.<x> ...` a launch script runs (the multi-node TensorRT-LLM leader
    runs it under mpirun and trtllm-llmapi-launch), or None. Words up to the end of that shell command."""
    for line in script.replace("\\\n", " ").splitlines():
        if "-m dynamo." not in line or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        for start in range(len(words)):
            found = module_of(words[start:])
            if found is not None:
                module, argv = found
                end = next((i for i, word in enumerate(argv) if word in SHELL_OPERATORS), len(argv))
                return module, argv[:end]
    return None


def dynamo_commands(label: str, objects: list[dict[str, Any]]) -> list[DynamoCommand]:
    """Every container in `objects`' workloads that runs a Dynamo module, directly or through a rendered script."""
    scripts = {
        key: value
        for obj in objects
        if obj["kind"] == "ConfigMap"
        for key, value in (obj.get("data") or {}).items()
        if key.endswith(".sh")
    }
    found: list[DynamoCommand] = []
    for obj in objects:
        if obj["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        for template, injected in pod_templates([obj]):
            pod_labels = template["metadata"].get("labels", {})
            place = pod_labels.get(labels.ROLE, "")  # single | leader | worker
            role = pod_labels.get(DYNAMO_ROLE) or place
            for container in template["spec"]["containers"]:
                full = [*container.get("command", []), *container.get("args", [])]
                parsed = module_of(full)
                for word in full if parsed is None else ():
                    script = scripts.get(word.rsplit("/", 1)[-1])
                    parsed = in_script(script) if script is not None else None
                    if parsed is not None:
                        break
                if parsed is None:
                    continue
                module, args = parsed
                env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
                variables = env | injected
                found.append(
                    DynamoCommand(
                        id=f"{label}/{obj['metadata']['name']}/{place}/{container['name']}",
                        workload=obj["metadata"]["name"],
                        role=role,
                        container=container["name"],
                        module=module,
                        argv=[expand(arg, variables) for arg in args],
                        env=env,
                    )
                )
    return found
