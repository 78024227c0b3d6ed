"""A disaggregated fleet, run for real on CPU: the operator renders NVIDIA Dynamo's frontend, prefill and decode
workers onto the real control plane (kwok runs the pods as far as the API can tell), and the rendered pods' own
commands are started on loopback with the pinned Dynamo, dynamo.mocker standing in for the GPU engine
(tests/support/dynamo/run.py lists each substitution). They find each other through Dynamo's Kubernetes discovery
against the real apiserver, as the rendered ServiceAccount: each process records itself in a DynamoWorkerMetadata
(Dynamo's CRD, installed here as Dynamo's platform chart would) and reads the rendered Service's EndpointSlices.

Shown: requests to the frontend's OpenAI endpoint are served by a prefill worker and then a decode worker (each
worker's own request counters); the KV router sends a repeated prompt to the prefill worker that holds its prefix
(that worker's counter, and the blocks reported cached); losing a worker of either role (its pod deleted, its
process killed) is survived.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tests.support.cluster.cluster import Cluster, eventually
from tests.support.cluster.controlplane import Process
from tests.support.cluster.fleet import operated_namespace
from tests.support.dynamo import env as dynamo_env
from tests.support.dynamo.run import (
    Launch,
    blocks_indexed,
    by_role,
    plan_launch,
    prefix_tokens_routed_to_cache,
    served_by,
    stand_in_model,
    worker_id,
)

NAMESPACE = "dynamo-run"
NAME = "m3-disagg"
ROLE_LABEL = "m3fleet.dev/dynamo-role"
CRD = Path(__file__).resolve().parents[1] / "support" / "dynamo" / "dynamoworkermetadatas.yaml"
BLOCK = 128  # the M3 KV block size the vLLM workers render (--block-size)
FLEET: dict[str, Any] = {
    "apiVersion": "m3fleet.dev/v1alpha1",
    "kind": "MiniMaxM3Deployment",
    "metadata": {"name": NAME, "namespace": NAMESPACE},
    "spec": {
        "model": {"variant": "bf16", "source": {"pvc": {"claimName": "m3-weights"}}},
        "engine": {"name": "vllm"},
        "accelerator": "h200",
        "replicas": 2,  # decode workers; prefill pinned to 2: one of each is lost below, and the router has a choice
        "context": {"maxModelLen": 131072},
        "disaggregation": {"inputTokens": 8192, "outputTokens": 1024, "prefill": {"replicas": 2}},
    },
}


def words(seed: int, count: int) -> str:
    """A prompt of `count` tokens of the stand-in tokenizer (one word, one token), different per seed."""
    return " ".join(f"w{(seed * 7919 + i * 31) % 2000}" for i in range(count))


def served_model(fleet: list[Launch]) -> str:
    """The name the workers serve the model under (their rendered --served-model-name, one for the fleet)."""
    names = {launch.served_model_name for launch in fleet if launch.role != "frontend"}
    assert len(names) == 1, names
    return names.pop()


def chat(fleet: list[Launch], prompt: str, max_tokens: int = 4) -> dict[str, Any]:
    launch = by_role(fleet)["frontend"][0]
    body = {"model": served_model(fleet), "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    request = urllib.request.Request(
        f"http://127.0.0.1:{launch.system_port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: dict[str, Any] = json.load(response)
    assert answer["usage"]["completion_tokens"] == max_tokens, answer
    return answer


def counters(launches: list[Launch], counter: str = "dynamo_component_requests_total") -> dict[str, float]:
    """Each live worker's own `generate` counter, by pod."""
    return {
        launch.pod: served_by(launch, counter)
        for launch in launches
        if launch.role != "frontend" and launch.process is not None and launch.process.alive()
    }


def moved(before: dict[str, float], after: dict[str, float], launches: list[Launch]) -> float:
    return sum(after[launch.pod] - before[launch.pod] for launch in launches if launch.pod in after)


@pytest.fixture(scope="module")
def fleet(chart: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Launch]]:
    python = dynamo_env.require_python()
    chart.apply(CRD)
    # The stand-in model directory is made in the Dynamo venv while the operator and kwok do their part.
    with ThreadPoolExecutor(1) as pool, operated_namespace(chart, NAMESPACE, "operator-dynamo"):
        making_model = pool.submit(stand_in_model, tmp_path_factory.mktemp("model"), python)
        chart.apply(FLEET)
        pods = eventually(
            "the frontend, 2 prefill and 2 decode pods Running",
            lambda: (
                found
                if len(found := [p for p in chart.list("pods", NAMESPACE, ROLE_LABEL) if running(p)]) == 5
                else None
            ),
            180,
        )
        account = {p["spec"].get("serviceAccountName") for p in pods}
        assert len(account) == 1 and None not in account, f"the fleet's pods run as {account}"
        kubeconfig, _, _ = chart.service_account_kubeconfig(NAMESPACE, account.pop())
        model = making_model.result()
        launches = [plan_launch(p, p["metadata"]["labels"][ROLE_LABEL], model) for p in pods]
        # Workers first: the frontend then finds them as it starts.
        launches.sort(key=lambda launch: launch.role == "frontend")
        logs = tmp_path_factory.mktemp("logs")
        try:
            for launch in launches:
                launch.process = Process(launch.pod, [python, *launch.argv], logs / f"{launch.pod}.log")
                launch.process.start(env={**launch.env, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"})
            eventually("the frontend serving the model", lambda: served(launches), 120)
            yield launches
        finally:
            started = [launch.process for launch in launches if launch.process is not None and launch.process.alive()]
            for process in started:  # all at once: each takes a few seconds to unregister from discovery
                os.killpg(process.pid, signal.SIGTERM)
            for process in started:
                process.stop(grace=10)
            chart.kubectl("delete", "m3d", NAME, "-n", NAMESPACE, "--wait=false", check=False)


def running(pod: dict[str, Any]) -> bool:
    return pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def served(fleet: list[Launch]) -> bool:
    """The frontend lists the model and answers a chat through both roles."""
    frontend = by_role(fleet)["frontend"][0]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{frontend.system_port}/v1/models", timeout=5) as response:
            models = [m["id"] for m in json.load(response)["data"]]
        return served_model(fleet) in models and bool(chat(fleet, words(0, 2 * BLOCK)))
    except (OSError, urllib.error.HTTPError, KeyError):
        return False


def test_the_rendered_commands_run_as_dynamo_frontend_and_workers(chart: Cluster, fleet: list[Launch]) -> None:
    roles = by_role(fleet)
    # Each worker recorded itself through the apiserver, as its pod, with the rendered ServiceAccount's rights.
    workers = {launch.pod for launch in fleet if launch.role != "frontend"}
    eventually(
        "a DynamoWorkerMetadata per worker pod",
        lambda: {r["metadata"]["name"] for r in chart.list("dynamoworkermetadatas", NAMESPACE)} == workers,
        60,
    )
    assert {role: len(launches) for role, launches in roles.items()} == {"frontend": 1, "prefill": 2, "decode": 2}
    assert roles["frontend"][0].module == "dynamo.frontend"
    assert {launch.module for launch in roles["prefill"] + roles["decode"]} == {"dynamo.vllm"}
    for launch in fleet:
        assert launch.process is not None
        launch.process.check_alive()


def test_requests_are_served_through_a_prefill_and_a_decode_worker(fleet: list[Launch]) -> None:
    roles = by_role(fleet)
    before, answered = counters(fleet), counters(fleet, "dynamo_component_response_bytes_total")
    sent = 4
    for seed in range(1, sent + 1):
        chat(fleet, words(seed, 3 * BLOCK))
    after, answered_after = counters(fleet), counters(fleet, "dynamo_component_response_bytes_total")
    # Each request: one prefill worker computes the prompt's KV and answers the router with the hand-off, then one
    # decode worker takes it and streams the tokens. Each worker's own counters show its part.
    for role in ("prefill", "decode"):
        assert moved(before, after, roles[role]) == sent, f"{role}: {before} -> {after}"
        assert moved(answered, answered_after, roles[role]) > 0, f"{role} answered nothing: {answered_after}"


def test_the_kv_router_sends_a_repeated_prefix_to_the_worker_that_holds_it(fleet: list[Launch]) -> None:
    roles = by_role(fleet)
    frontend = roles["frontend"][0]
    prompt = words(100, 5 * BLOCK)
    before = counters(fleet)
    indexed = {w.pod: blocks_indexed(frontend, worker_id(w)) for w in roles["prefill"]}
    first = chat(fleet, prompt)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, first["usage"]
    after_first = counters(fleet)
    holders = [launch for launch in roles["prefill"] if after_first[launch.pod] > before[launch.pod]]
    assert len(holders) == 1, (before, after_first)
    holder = holders[0]
    # The router learns what a worker holds from the worker's KV events (ZMQ event plane): wait until it has.
    indexed = blocks_indexed(frontend, worker_id(holder))
    eventually(
        "the router indexing the prompt's blocks", lambda: blocks_indexed(frontend, worker_id(holder)) >= indexed, 30
    )
    routed_to_cache = prefix_tokens_routed_to_cache(frontend)
    repeats = [chat(fleet, prompt) for _ in range(3)]
    after = counters(fleet)
    # The router's own account: for each repeat, the worker it picked held the whole prompt.
    assert prefix_tokens_routed_to_cache(frontend) - routed_to_cache == 3 * 5 * BLOCK
    # The prefill workers' own counters: every repeat went to the one that prefilled it first.
    served = {w.pod: after[w.pod] - after_first[w.pod] for w in roles["prefill"]}
    assert served == {w.pod: (3 if w is holder else 0) for w in roles["prefill"]}, served
    # And that worker reused the prompt's full blocks rather than recomputing them (its usage report).
    cached = [again["usage"]["prompt_tokens_details"]["cached_tokens"] for again in repeats]
    assert max(cached) >= 4 * BLOCK, cached


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_losing_a_worker_of_either_role_is_survived(chart: Cluster, fleet: list[Launch], role: str) -> None:
    roles = by_role(fleet)
    lost = next(launch for launch in roles[role] if launch.process is not None and launch.process.alive())
    assert lost.process is not None
    # A node lost: its process dies at once and its pod goes (the Deployment makes a new pod, which never starts
    # here: no process is launched for it, so it never registers).
    os.killpg(lost.process.pid, signal.SIGKILL)
    lost.process.popen.wait(10)  # type: ignore[union-attr]
    chart.kubectl("delete", "pod", lost.pod, "-n", NAMESPACE, "--grace-period=0", "--force", check=False)
    survivors = [launch for launch in roles[role] if launch is not lost]
    before = counters(fleet)
    # The frontend drops the lost worker from its routing (a failed connection, then discovery); from then on every
    # request is served by the workers left.
    eventually("6 requests in a row served without the lost worker", lambda: all_served(fleet, 6), 60)
    assert moved(before, counters(fleet), survivors) >= 6
    assert lost.pod not in counters(fleet)


def all_served(fleet: list[Launch], count: int) -> bool:
    try:
        for seed in range(count):
            chat(fleet, words(500 + seed, 2 * BLOCK))
    except urllib.error.HTTPError:
        return False
    return True
