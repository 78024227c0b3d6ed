"""Benchmark: the CLI's verdict against a real kube-apiserver's, on many drawn documents.

    .venv/bin/python tests/bench/bench_contract.py [--examples 20000] [--seed 0]

Starts a private control plane (tests/support/cluster/controlplane.py), installs the CRD, and judges documents drawn
from the CRD's schema (valid and mutated; tests/support/cluster/contract.py) twice: with `parse_resource` (what
`m3fleet plan`/`render` and the operator run) and with the apiserver (`dryRun=All`,
`fieldValidation=Strict`). Prints the figures: documents, admitted/rejected, disagreements (exit status 1
when there is any), the fields the rejections named, and the time each side took per document. The CI
test (tests/cluster/test_contract.py) runs 2,500 of these. Not collected by pytest (bench_*.py).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tests.*` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hypothesis import HealthCheck, given, seed, settings

from tests.support.cluster.cluster import BIN, REPO
from tests.support.cluster.contract import Apiserver, cli_verdict, disagreement, documents, install_crd
from tests.support.cluster.controlplane import ControlPlane, build, wait_for


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="m3fleet-contract-bench-"))
    control_plane = ControlPlane(build(), workdir)
    control_plane.start()
    try:

        def kubectl(*argv: str) -> None:
            command = [str(BIN / "kubectl"), f"--kubeconfig={control_plane.admin_kubeconfig}", *argv]
            subprocess.run(command, check=True, capture_output=True, timeout=120)

        install_crd(kubectl, control_plane, str(REPO / "crds"))
        listing = "/apis/m3fleet.dev/v1alpha1/namespaces/contract/minimaxm3deployments"
        wait_for("the CRD served", lambda: control_plane.admin.request("GET", listing)[0] == 200, 30)
        server = Apiserver(control_plane)
        seen: Counter[str] = Counter()
        fields: Counter[str] = Counter()
        disagreements: list[str] = []
        timing = {"cli": 0.0, "apiserver": 0.0}

        @seed(args.seed)
        @settings(max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(documents())
        def check(document: dict[str, Any]) -> None:
            t0 = time.perf_counter()
            cli = cli_verdict(document)
            t1 = time.perf_counter()
            answer = server.verdict(document)
            timing["cli"] += t1 - t0
            timing["apiserver"] += time.perf_counter() - t1
            seen["admitted" if answer.admitted else "rejected"] += 1
            fields.update(answer.fields)
            why = disagreement(cli, answer)
            if why:
                disagreements.append(
                    f"{why}\n  document: {document}\n  CLI: {cli.detail}\n  apiserver: {answer.detail}"
                )

        start = time.monotonic()
        check()
        elapsed = time.monotonic() - start
    finally:
        control_plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    total = seen["admitted"] + seen["rejected"]
    print(f"documents:      {total} in {elapsed:.0f}s ({total / max(elapsed, 1e-9):.0f}/s)")
    print(f"admitted:       {seen['admitted']}")
    print(f"rejected:       {seen['rejected']}")
    print(f"disagreements:  {len(disagreements)}")
    print(f"CLI verdict:    {1000 * timing['cli'] / max(total, 1):.2f} ms/document")
    print(f"apiserver:      {1000 * timing['apiserver'] / max(total, 1):.2f} ms/document (dry run, one connection)")
    print("fields named by the apiserver's rejections (top 25):")
    for field, count in fields.most_common(25):
        print(f"  {count:6d}  {field}")
    for line in disagreements[:10]:
        print(line)
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
