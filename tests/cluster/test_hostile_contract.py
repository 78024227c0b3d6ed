"""The hostile corpus (tests/fuzz/corpus/hostile) on the real apiserver: for every document in it that can reach
an apiserver at all (it decodes to JSON), the CLI's verdict (`m3fleet plan` on exactly that JSON) is the
apiserver's verdict (`dryRun=All`, `fieldValidation=Strict`, with the chart's validating webhook served by the
operator, so the planner's and the renderer's refusals count too), for MiniMaxM3Deployments and
MiniMaxM3ModelCaches alike; what cannot reach it (not YAML, not JSON: binary, NaN, non-string keys) is refused by
the CLI. Every `bad-*` file is refused somewhere, every `ok-*` file admitted everywhere.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.cluster.cluster import Cluster, eventually
from tests.support.cluster.contract import Apiserver

from m3fleet.api.parse import parse_cache, parse_resource
from m3fleet.cli import main
from m3fleet.documents import is_cache, read_inputs
from m3fleet.errors import SpecError, SpecErrors

HOSTILE = Path(__file__).resolve().parents[1] / "fuzz" / "corpus" / "hostile"
NAMESPACE = "hostile"
# A spec only the planner refuses: proves the webhook answers before the corpus is judged.
INFEASIBLE = HOSTILE / "bad-infeasible.yaml"


@pytest.fixture(scope="module")
def apiserver(chart: Cluster) -> Iterator[Apiserver]:
    chart.namespace(NAMESPACE)
    server = Apiserver(chart.control_plane)
    probe = json.loads(json.dumps(read_inputs([str(INFEASIBLE)])[0][0].body))
    with chart.operator("--all-namespaces", "--standalone", *chart.webhook_args(), name="operator-hostile"):
        eventually("the webhook refusing", lambda: "denied the request" in server.verdict(probe, NAMESPACE).detail, 60)
        yield server


def _json(body: Any) -> Any | None:
    """The document as the apiserver would receive it, or None when it has no JSON form."""
    try:
        return json.loads(json.dumps(body, allow_nan=False))
    except (TypeError, ValueError):
        return None


def cli_admits_unsendable(body: Any) -> bool:
    """The CLI's reading of a document with no JSON form (binary, NaN, a non-string key), as read from YAML."""
    try:
        (parse_cache if is_cache(body) else parse_resource)(body)
    except (SpecError, SpecErrors):
        return False
    return True


def cli_admits(body: Any, tmp: Path) -> bool:
    """`m3fleet plan -f` on the JSON document (the console script's own main); exit 0 admits, 2 refuses."""
    path = tmp / "document.json"
    path.write_text(json.dumps(body))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "-f", str(path)])
    assert code in (0, 2) and "Traceback" not in err.getvalue(), err.getvalue()
    return code == 0


def test_the_cli_and_the_apiserver_give_the_same_verdict_on_every_hostile_document(
    apiserver: Apiserver, tmp_path: Path
) -> None:
    docs, unreadable = read_inputs([str(HOSTILE)])
    refused_files = {str(e).split(": ", 1)[0].split("#")[0].rsplit("/", 1)[-1] for e in unreadable}
    admitted_files: set[str] = set()
    disagreements: list[str] = []
    sent = 0
    for doc in docs:
        name = doc.source.split("#")[0].rsplit("/", 1)[-1]
        body = _json(doc.body)
        if body is None:
            assert not cli_admits_unsendable(doc.body), f"{doc.source}: no JSON form, yet the CLI admits it"
            refused_files.add(name)
            continue
        if isinstance(body, dict) and isinstance(body.get("metadata"), dict):
            body["metadata"]["namespace"] = NAMESPACE  # what the apiserver's copy says too
        cli, server = cli_admits(body, tmp_path), apiserver.verdict(body, NAMESPACE)
        sent += 1
        if cli != server.admitted:
            disagreements.append(f"{doc.source}: CLI {'admits' if cli else 'refuses'}, apiserver: {server.detail}")
        (admitted_files if cli else refused_files).add(name)
    assert not disagreements, "\n".join(disagreements)
    files = {p.name for p in HOSTILE.iterdir()}
    bad = {f for f in files if f.startswith("bad-")}
    ok = files - bad
    assert bad <= refused_files, f"bad files no one refused: {sorted(bad - refused_files)}"
    assert ok <= admitted_files and not ok & refused_files, sorted(ok & refused_files)
    assert sent > 100, sent  # most of the corpus reaches the apiserver: the comparison is not vacuous


def test_the_webhook_judges_model_caches_too(chart: Cluster, apiserver: Apiserver) -> None:
    """A cache whose node label `<namespace>.<name>` would pass 63 characters: CEL cannot see the namespace, the
    webhook refuses it (with failurePolicy Ignore, only a refusal proves the webhook was asked)."""
    namespace = chart.namespace("hostile-" + "n" * 22)
    body = json.loads(json.dumps(read_inputs([str(HOSTILE / "ok-cache.yaml")])[0][0].body))
    body["metadata"]["name"] = "c" * 40
    verdict = apiserver.verdict(body, namespace)
    assert not verdict.admitted and "denied the request" in verdict.detail and "63" in verdict.detail, verdict
    body["metadata"]["name"] = "c" * 20
    assert apiserver.verdict(body, namespace).admitted
