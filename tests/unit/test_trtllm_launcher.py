"""The rendered TensorRT-LLM launch scripts, run by bash with recording stubs in place of mpirun, ssh and sshd.

Offline and bash-only: every command that would reach another node or start a server (mpirun, ssh, sshd,
ssh-keygen, python3, trtllm-serve) and every write outside the test's directory (install, mkdir) is a stub on
PATH that records its argv and environment. From what mpirun receives the test derives the exact command and
environment each rank gets (the ranks on the worker node see only what mpirun forwards: sshd starts them with a
bare environment).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from m3fleet.api import parse_resource
from m3fleet.engines.base import BASH as LAUNCH_SHELL
from m3fleet.engines.trtllm import LEADER_SCRIPT, SINGLE_SCRIPT, SSH_PORT, WORKER_SCRIPT
from m3fleet.planner import plan
from m3fleet.render import render
from tests.support.stubs import install_stubs

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")

# What a recording stub does: argv (NUL-separated) and environment of its last call, and a call count.
STUB = """#!/bin/bash
name="$(basename "$0")"
printf '%s\\0' "$@" > "${STUB_LOG}/${name}.argv"
env -0 > "${STUB_LOG}/${name}.env"
echo >> "${STUB_LOG}/${name}.calls"
if [ "${name}" = python3 ]; then echo "${FAKE_TEMPLATE_PATH}"; fi
exit 0
"""
STUBS = ("mpirun", "ssh", "sshd", "ssh-keygen", "install", "mkdir", "python3", "trtllm-serve")

# The NGC image's environment (Docker ENV) as the kubelet starts the container with it, and its shell init.
IMAGE_ENV = {
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64:/opt/hpcx/ompi/lib:/opt/hpcx/ucx/lib",
    "OPAL_PREFIX": "/opt/hpcx/ompi",
    "BASH_ENV": "/etc/bash.bashrc",
    "HOME": "/root",
    "HOSTNAME": "m3-trtllm-0",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb",
}
SHELL_INIT = 'export LD_LIBRARY_PATH="/usr/local/cuda/compat/lib:${LD_LIBRARY_PATH}"\nexport NGC_SHELL_INIT=1\n'
SECRET_PLACEHOLDER = "<from secretKeyRef>"
TEMPLATE_IN_CACHE = "/hf-cache/hub/models--MiniMaxAI--MiniMax-M3/snapshots/0123abcd/chat_template.jinja"
USER_ENV = [
    {"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_1"},
    {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
    {"name": "UCX_TLS", "value": "rc,cuda_copy"},
    {"name": "HF_HUB_ENABLE_HF_TRANSFER", "value": "1"},
    {"name": "TLLM_LOG_LEVEL", "valueFrom": {"configMapKeyRef": {"name": "trt", "key": "log-level"}}},
]


def trtllm_resource(accel: str, hf: bool) -> dict[str, Any]:
    source: dict[str, Any] = (
        {"huggingFace": {"cacheClaimName": "hf-cache", "tokenSecretRef": {"name": "hf", "key": "token"}}}
        if hf
        else {"pvc": {"claimName": "m3-weights"}}
    )
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": "m3-trtllm", "namespace": "llm"},
        "spec": {
            "model": {"variant": "bf16", "source": source},
            "engine": {"name": "trtllm", "env": USER_ENV},
            "accelerator": accel,
            "parallelism": {"strategy": "tp-ep"},
            "context": {"maxModelLen": 131072},
        },
    }


@dataclass(frozen=True)
class Rendered:
    scripts: dict[str, str]
    containers: dict[str, dict[str, Any]]  # role label -> container


def render_trtllm(accel: str, hf: bool) -> Rendered:
    resource = parse_resource(trtllm_resource(accel, hf))
    objs = render(resource, plan(resource.spec))
    config = next(o for o in objs if o["kind"] == "ConfigMap")["data"]
    workload = next(o for o in objs if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    if workload["kind"] == "Deployment":
        templates = [workload["spec"]["template"]]
    else:
        lwt = workload["spec"]["leaderWorkerTemplate"]
        templates = [lwt["leaderTemplate"], lwt["workerTemplate"]]
    containers = {t["metadata"]["labels"]["m3fleet.dev/role"]: t["spec"]["containers"][0] for t in templates}
    return Rendered({k: v for k, v in config.items() if k.endswith(".sh")}, containers)


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The env the kubelet gives the container (secret/config references resolved to a placeholder)."""
    return {e["name"]: e.get("value", SECRET_PLACEHOLDER) for e in container["env"]}


@dataclass
class Run:
    log: Path

    def argv(self, stub: str) -> list[str]:
        return (self.log / f"{stub}.argv").read_text().split("\0")[:-1]

    def env(self, stub: str) -> dict[str, str]:
        pairs = (self.log / f"{stub}.env").read_text().split("\0")[:-1]
        return dict(p.split("=", 1) for p in pairs)

    def calls(self, stub: str) -> int:
        path = self.log / f"{stub}.calls"
        return len(path.read_text().splitlines()) if path.exists() else 0


def run_script(tmp_path: Path, text: str, env: dict[str, str]) -> Run:
    """`bash -n`, then run the script with every stub first on PATH and only `env` (plus PATH) in its environment."""
    script = tmp_path / "script.sh"
    script.write_text(text)
    assert BASH is not None
    syntax = subprocess.run([BASH, "-n", str(script)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr
    stubs, log = install_stubs(tmp_path / "stubs", STUBS, STUB), tmp_path / "log"
    log.mkdir()
    shell_init = tmp_path / "shinit_v2"
    shell_init.write_text(SHELL_INIT)
    full = {
        **IMAGE_ENV,
        "ENV": str(shell_init),  # NGC: ENV=/etc/shinit_v2
        "PATH": f"{stubs}:/usr/local/mpi/bin:/usr/local/cuda/bin:/usr/bin:/bin",
        "STUB_LOG": str(log),
        "FAKE_TEMPLATE_PATH": TEMPLATE_IN_CACHE,
        **env,
    }
    result = subprocess.run(
        # The container's own command (bash with no startup files, -p), with the local bash binary.
        [BASH, *LAUNCH_SHELL[1:], str(script)],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return Run(log)


@dataclass(frozen=True)
class Rank:
    rank: int
    host: str
    command: list[str]
    env: dict[str, str]


def ranks_from_mpirun(argv: list[str], mpirun_env: dict[str, str]) -> tuple[list[Rank], dict[str, str]]:
    """Each rank's host, command and forwarded environment as Open MPI would start them (-H host:slots filled
    in order), plus mpirun's own options."""
    options: dict[str, str] = {}
    forwarded: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-x":
            forwarded.append(argv[i + 1])
            i += 2
        elif arg in ("--prefix", "-np", "-H", "--bind-to"):
            options[arg] = argv[i + 1]
            i += 2
        elif arg == "--mca":
            options[f"--mca {argv[i + 1]}"] = argv[i + 2]
            i += 3
        elif arg.startswith("-"):
            options[arg] = ""
            i += 1
        else:
            break
    command = argv[i:]
    slots = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in options["-H"].split(",")]
    hosts = [host for host, n in slots for _ in range(n)]
    env = {name: mpirun_env[name] for name in forwarded}
    return [Rank(r, hosts[r], command, env) for r in range(int(options["-np"]))], options


def describe(ranks: list[Rank]) -> str:
    lines = []
    for rank in ranks:
        lines.append(f"rank {rank.rank} on {rank.host}: {' '.join(rank.command)}")
        lines += [f"    {k}={v}" for k, v in sorted(rank.env.items())]
    return "\n".join(lines)


LWS = {
    "LWS_LEADER_ADDRESS": "m3-trtllm-0.m3-trtllm.llm",
    "LWS_GROUP_SIZE": "2",
    "LWS_WORKER_INDEX": "0",
}


@pytest.mark.parametrize("hf", [False, True], ids=["pvc", "hugging-face"])
def test_leader_starts_every_rank_with_the_pods_environment(tmp_path: Path, hf: bool) -> None:
    rendered = render_trtllm("gb200", hf)
    leader = rendered.containers["leader"]
    assert leader["command"] == list(LAUNCH_SHELL) and leader["args"] == [f"/etc/m3fleet/{LEADER_SCRIPT}"]
    pod_env = container_env(leader)
    run = run_script(tmp_path, rendered.scripts[LEADER_SCRIPT], {**pod_env, **LWS})
    ranks, options = ranks_from_mpirun(run.argv("mpirun"), run.env("mpirun"))
    print(describe(ranks))  # pytest -s shows what each rank gets

    # mpirun: the image's, with --prefix so the sshd session on the worker finds orted and its libraries.
    assert options["--prefix"] == "/opt/hpcx/ompi"
    assert options["-np"] == "8" and options["--bind-to"] == "none" and "--allow-run-as-root" in options
    assert options["-H"] == "m3-trtllm-0.m3-trtllm.llm:4,m3-trtllm-0-1.m3-trtllm.llm:4"
    assert options["--mca plm_rsh_args"].startswith(f"-p {SSH_PORT} -i /tmp/ssh/id_ed25519 ")
    # The leader waited for the worker's sshd (and its key) before starting mpirun.
    assert run.calls("ssh") == 1 and run.argv("ssh")[-2:] == ["m3-trtllm-0-1.m3-trtllm.llm", "true"]

    # 4 ranks per node, every one running the same command.
    assert [r.host for r in ranks] == ["m3-trtllm-0.m3-trtllm.llm"] * 4 + ["m3-trtllm-0-1.m3-trtllm.llm"] * 4
    template = TEMPLATE_IN_CACHE if hf else "/models/chat_template.jinja"
    model = "MiniMaxAI/MiniMax-M3" if hf else "/models"
    for rank in ranks:
        assert rank.command == [
            "trtllm-llmapi-launch", "trtllm-serve", model, "--host", "0.0.0.0", "--port", "8000",
            "--trust_remote_code", "--reasoning_parser", "minimax_m3", "--tool_parser", "minimax_m3",
            "--chat_template", template, "--extra_llm_api_options", "/etc/m3fleet/extra-llm-api-options.yaml",
        ]  # fmt: skip

    # Every rank on every node gets the image's environment (after its shell init) and every variable of the
    # pod spec, the user's spec.engine.env included; nothing that describes the leader pod itself.
    for rank in ranks:
        env = rank.env
        assert env["PATH"].split(":")[1:] == ["/usr/local/mpi/bin", "/usr/local/cuda/bin", "/usr/bin", "/bin"]
        assert env["LD_LIBRARY_PATH"] == "/usr/local/cuda/compat/lib:" + IMAGE_ENV["LD_LIBRARY_PATH"]
        assert env["OPAL_PREFIX"] == "/opt/hpcx/ompi" and env["NGC_SHELL_INIT"] == "1"
        for name, value in pod_env.items():
            if not name.startswith("OMPI_") and name not in ("HOME", "USER"):  # these describe the leader's shell
                assert env[name] == value, name
        for user in USER_ENV:
            assert user["name"] in env
        assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["UCX_TLS"] == "rc,cuda_copy"
        assert env["NCCL_MNNVL_ENABLE"] == "1"  # rendered for GB200 multi-node
        if hf:
            assert env["HF_HOME"] == "/hf-cache" and env["HF_TOKEN"] == SECRET_PLACEHOLDER
        for private in ("HOSTNAME", "HOME", "LWS_WORKER_INDEX", "KUBERNETES_SERVICE_HOST", "NVIDIA_VISIBLE_DEVICES"):
            assert private not in env, private
        assert not [n for n in env if n.startswith("OMPI_")]  # mpirun propagates its MCA settings itself
    # mpirun itself ran with the FQDN setting the pod carries.
    assert run.env("mpirun")["OMPI_MCA_orte_keep_fqdn_hostnames"] == "1"

    if hf:  # the template was fetched into the shared cache with the image's huggingface_hub
        assert run.calls("python3") == 1
        assert run.argv("python3")[-2:] == ["MiniMaxAI/MiniMax-M3", "chat_template.jinja"]
        assert "hf_hub_download" in run.argv("python3")[1]
    else:
        assert run.calls("python3") == 0


def test_worker_runs_only_sshd(tmp_path: Path) -> None:
    rendered = render_trtllm("gb200", False)
    worker = rendered.containers["worker"]
    assert worker["args"] == [f"/etc/m3fleet/{WORKER_SCRIPT}"]
    run = run_script(
        tmp_path, rendered.scripts[WORKER_SCRIPT], {**container_env(worker), **LWS, "LWS_WORKER_INDEX": "1"}
    )
    sshd = run.argv("sshd")
    assert run.calls("ssh-keygen") == 1 and run.argv("mkdir") == ["-p", "/run/sshd"]
    assert sshd[:4] == ["-D", "-e", "-p", str(SSH_PORT)]
    assert "AuthorizedKeysFile=/tmp/sshd/authorized_keys" in sshd and "PasswordAuthentication=no" in sshd
    assert run.calls("mpirun") == 0


def test_single_node_hugging_face_launch_passes_the_cached_template(tmp_path: Path) -> None:
    rendered = render_trtllm("h200", True)
    (single,) = rendered.containers.values()
    assert single["args"] == [f"/etc/m3fleet/{SINGLE_SCRIPT}"]
    run = run_script(tmp_path, rendered.scripts[SINGLE_SCRIPT], container_env(single))
    serve = run.argv("trtllm-serve")
    assert serve[serve.index("--chat_template") + 1] == TEMPLATE_IN_CACHE
    assert serve[0] == "MiniMaxAI/MiniMax-M3" and run.env("trtllm-serve")["HF_HOME"] == "/hf-cache"


def test_without_opal_prefix_mpiruns_own_installation_is_the_prefix(tmp_path: Path) -> None:
    rendered = render_trtllm("gb200", False)
    env = {**container_env(rendered.containers["leader"]), **LWS, "OPAL_PREFIX": ""}
    run = run_script(tmp_path, rendered.scripts[LEADER_SCRIPT], env)
    _, options = ranks_from_mpirun(run.argv("mpirun"), run.env("mpirun"))
    assert options["--prefix"] == str(tmp_path)  # the stub mpirun lives in <tmp>/stubs
