"""Benchmark results: out of the Job's log, into one summary per concurrency, a table and a document. Pure.

The three clients write different JSON (vLLM `--save-result`, SGLang `--output-file` JSONL, TensorRT-LLM's
vLLM-derived `--save-result`); `summarize` maps each onto one `RunSummary`. `BenchResult` is what
`m3fleet bench` keeps (a ConfigMap owned by the resource, or stdout with `-o json|yaml`) and what
`m3fleet simulate --throughput-from` reads back.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from m3fleet.bench.job import BEGIN, END, BenchOptions
from m3fleet.errors import SpecError

FORMAT: Final = "m3fleet.dev/benchmark-result/v1"
RESULT_KEY: Final = "result.json"  # the ConfigMap key holding the document
SUMMARY_KEY: Final = "summary.txt"  # ... and the table, for `kubectl get cm -o jsonpath`
METRICS: Final = ("ttft", "tpot", "itl", "e2el")
MAX_RAW_LIST: Final = 32  # per-request arrays (latencies of every request) are dropped from the kept raw results

_BEGIN_RE = re.compile(re.escape(BEGIN).replace(re.escape("{concurrency}"), r"(\d+)"))


class ResultError(ValueError):
    """The client's output is not what this version of m3fleet reads."""


@dataclass(frozen=True)
class Stat:
    """One latency metric of one run, in milliseconds."""

    mean: float
    median: float
    p99: float

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "median": self.median, "p99": self.p99}


@dataclass(frozen=True)
class RunSummary:
    """One run (one concurrency): the seeds' summary figures."""

    concurrency: int
    requests: int
    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: Stat
    tpot: Stat
    itl: Stat
    e2el: Stat

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "durationSeconds": self.duration_s,
            "totalInputTokens": self.input_tokens,
            "totalOutputTokens": self.output_tokens,
            "requestThroughput": self.request_throughput,
            "outputThroughput": self.output_throughput,
            "totalTokenThroughput": self.total_token_throughput,
            **{f"{m}Ms": getattr(self, m).to_dict() for m in METRICS},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> RunSummary:
        try:
            stats = {m: Stat(*(float(data[f"{m}Ms"][k]) for k in ("mean", "median", "p99"))) for m in METRICS}
            return cls(
                concurrency=int(data["concurrency"]),
                requests=int(data["requests"]),
                completed=int(data["completed"]),
                failed=int(data["failed"]),
                duration_s=float(data["durationSeconds"]),
                input_tokens=int(data["totalInputTokens"]),
                output_tokens=int(data["totalOutputTokens"]),
                request_throughput=float(data["requestThroughput"]),
                output_throughput=float(data["outputThroughput"]),
                total_token_throughput=float(data["totalTokenThroughput"]),
                **stats,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(
                where, f"is not a benchmark run ({type(exc).__name__}: {exc})", "pass what m3fleet bench wrote"
            ) from None

    @property
    def mean_input_len(self) -> float:
        return self.input_tokens / self.completed if self.completed else 0.0

    @property
    def mean_output_len(self) -> float:
        return self.output_tokens / self.completed if self.completed else 0.0


# --- the Job's log -------------------------------------------------------------------------------


def _lines(log: str) -> Iterable[str]:
    for line in log.split("\n"):
        yield line.rsplit("\r", 1)[-1].strip()  # a progress bar redraws with \r: keep what is shown last


def extract(log: str) -> dict[int, dict[str, Any]]:
    """{concurrency: the client's JSON result} for every complete result block in the log, in log order."""
    results: dict[int, dict[str, Any]] = {}
    current: int | None = None
    chunks: list[str] = []
    for line in _lines(log):
        begin = _BEGIN_RE.search(line)
        if begin:
            current, chunks = int(begin.group(1)), []
        elif line == END and current is not None:
            results[current] = _decode("".join(chunks), current)
            current = None
        elif current is not None:
            chunks.append(line)
    return results


def without_results(log: str) -> str:
    """The log minus the encoded result blocks: what a person reads when a run went wrong."""
    kept, inside = [], False
    for line in log.split("\n"):
        shown = line.rsplit("\r", 1)[-1].strip()
        if _BEGIN_RE.search(shown):
            inside = True
        elif inside and shown == END:
            inside = False
        elif not inside:
            kept.append(line)
    return "\n".join(kept)


def _decode(text: str, concurrency: int) -> dict[str, Any]:
    try:
        content = base64.b64decode(text, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ResultError(f"the result of concurrency {concurrency} in the log is not base64 text: {exc}") from None
    records = [line for line in content.splitlines() if line.strip()]  # SGLang appends JSON lines
    if not records:
        raise ResultError(f"the client wrote an empty result file for concurrency {concurrency}")
    try:
        value = json.loads(records[-1] if len(records) > 1 else content)
    except json.JSONDecodeError as exc:
        raise ResultError(f"the result of concurrency {concurrency} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ResultError(f"the result of concurrency {concurrency} is not a JSON object")
    return value


# --- one run ---------------------------------------------------------------------------------------


def _number(raw: Mapping[str, Any], *keys: str) -> float:
    for key in keys:
        value = raw.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    raise ResultError(f"the client's result has no {' or '.join(keys)} (keys: {', '.join(sorted(raw)[:40])})")


def _stat(raw: Mapping[str, Any], metric: str) -> Stat:
    names = [metric, "e2e_latency"] if metric == "e2el" else [metric]  # SGLang spells E2EL its own way
    return Stat(*(_number(raw, *(f"{p}_{n}_ms" for n in names)) for p in ("mean", "median", "p99")))


def summarize(concurrency: int, prompts: int, raw: Mapping[str, Any]) -> RunSummary:
    """One run's figures from the client's own JSON: vLLM's, SGLang's and TensorRT-LLM's keys overlap enough
    for one mapping (SGLang names E2EL `e2e_latency` and total throughput `total_throughput`, and has no
    `num_prompts`/`failed`: `prompts` is the number the run was asked to send)."""
    completed = int(_number(raw, "completed"))
    requests = int(raw["num_prompts"]) if isinstance(raw.get("num_prompts"), int) else prompts
    failed = int(raw["failed"]) if isinstance(raw.get("failed"), int) else max(0, requests - completed)
    return RunSummary(
        concurrency=concurrency,
        requests=requests,
        completed=completed,
        failed=failed,
        duration_s=_number(raw, "duration"),
        input_tokens=int(_number(raw, "total_input_tokens")),
        output_tokens=int(_number(raw, "total_output_tokens")),
        request_throughput=_number(raw, "request_throughput"),
        output_throughput=_number(raw, "output_throughput"),
        total_token_throughput=_number(raw, "total_token_throughput", "total_throughput"),
        ttft=_stat(raw, "ttft"),
        tpot=_stat(raw, "tpot"),
        itl=_stat(raw, "itl"),
        e2el=_stat(raw, "e2el"),
    )


def runs_from_log(log: str, options: BenchOptions) -> tuple[list[RunSummary], dict[str, dict[str, Any]]]:
    """Every completed run in a benchmark Job's log, in the order asked, and the trimmed raw results."""
    found = extract(log)
    runs = [summarize(c, options.prompts.at(c), found[c]) for c in options.concurrency if c in found]
    raw = {str(c): trim_raw(found[c]) for c in options.concurrency if c in found}
    return runs, raw


def problems(runs: Sequence[RunSummary]) -> list[str]:
    """Runs whose requests failed: a client exits 0 even when the endpoint refused every request."""
    found = []
    for r in runs:
        if r.completed == 0:
            found.append(
                f"concurrency {r.concurrency}: all {r.requests} requests failed (a missing or wrong API key, "
                "or an engine error: the client's errors are in the Job's log)"
            )
        elif r.failed:
            found.append(f"concurrency {r.concurrency}: {r.failed} of {r.requests} requests failed")
    return found


def trim_raw(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The client's JSON without per-request arrays (a 5,000-prompt run would not fit a ConfigMap)."""
    kept = {k: v for k, v in raw.items() if not (isinstance(v, list) and len(v) > MAX_RAW_LIST)}
    dropped = sorted(set(raw) - set(kept))
    if dropped:
        kept["m3fleetDroppedPerRequestFields"] = dropped
    return kept


# --- the table -------------------------------------------------------------------------------------

_ROWS: Final[tuple[tuple[str, str], ...]] = (
    ("Successful requests:", "completed"),
    ("Failed requests:", "failed"),
    ("Benchmark duration (s):", "duration_s"),
    ("Total input tokens:", "input_tokens"),
    ("Total generated tokens:", "output_tokens"),
    ("Request throughput (req/s):", "request_throughput"),
    ("Output token throughput (tok/s):", "output_throughput"),
    ("Total Token throughput (tok/s):", "total_token_throughput"),
)
_SECTIONS: Final[tuple[tuple[str, str, str], ...]] = (
    ("Time to First Token", "ttft", "TTFT"),
    ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
    ("Inter-token Latency", "itl", "ITL"),
    ("End-to-end Latency", "e2el", "E2EL"),
)
_WIDTH: Final = 50


def _cell(value: float | int) -> str:
    return str(value) if isinstance(value, int) else f"{value:.2f}"


def format_table(runs: Sequence[RunSummary]) -> str:
    """The seeds' "Serving Benchmark Result" table, one column per concurrency."""
    rows: list[tuple[str, list[str]] | str] = [("Max concurrency:", [str(r.concurrency) for r in runs])]
    rows += [(label, [_cell(getattr(r, attr)) for r in runs]) for label, attr in _ROWS]
    for header, attr, short in _SECTIONS:
        rows.append(f"{header:-^{_WIDTH}}")
        for stat, word in (("mean", "Mean"), ("median", "Median"), ("p99", "P99")):
            rows.append((f"{word} {short} (ms):", [_cell(getattr(getattr(r, attr), stat)) for r in runs]))
    width = max([10, *(len(c) for row in rows if isinstance(row, tuple) for c in row[1])])
    lines = [f"{' Serving Benchmark Result ':=^{_WIDTH}}"]
    for row in rows:
        if isinstance(row, str):
            lines.append(row)
        else:
            label, cells = row
            lines.append(f"{label:<40}" + " ".join(c.rjust(width) for c in cells).rstrip())
    lines.append("=" * _WIDTH)
    return "\n".join(lines) + "\n"


# --- the document ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchResult:
    """Everything one `m3fleet bench` measured, and against what."""

    resource: dict[str, str]  # name, namespace, uid
    job: str
    target: dict[str, Any]  # engine, client, image, service, url, model
    parameters: dict[str, Any]
    spec: dict[str, Any]
    plan: dict[str, Any]
    ready_replicas: int
    started: str
    finished: str
    complete: bool
    runs: tuple[RunSummary, ...]
    raw: dict[str, dict[str, Any]]  # concurrency (as a string) -> the client's JSON, trimmed

    def to_document(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "resource": self.resource,
            "job": self.job,
            "target": self.target,
            "parameters": self.parameters,
            "readyReplicas": self.ready_replicas,
            "startTime": self.started,
            "completionTime": self.finished,
            "complete": self.complete,
            "runs": [r.to_dict() for r in self.runs],
            "spec": self.spec,
            "plan": self.plan,
            "raw": self.raw,
        }

    @classmethod
    def from_document(cls, doc: Any, where: str = "result") -> BenchResult:
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise SpecError(
                where,
                f"is not an m3fleet benchmark result (no format: {FORMAT})",
                "pass the output of `m3fleet bench -o json`, or its ConfigMap (`kubectl get configmap NAME -o yaml`)",
            )
        runs = doc.get("runs")
        if not isinstance(runs, list) or not runs:
            raise SpecError(f"{where}: runs", "is empty", "benchmark again; at least one run must have completed")
        try:
            return cls(
                resource=dict(doc["resource"]),
                job=str(doc["job"]),
                target=dict(doc["target"]),
                parameters=dict(doc["parameters"]),
                spec=dict(doc["spec"]),
                plan=dict(doc["plan"]),
                ready_replicas=int(doc["readyReplicas"]),
                started=str(doc["startTime"]),
                finished=str(doc["completionTime"]),
                complete=bool(doc["complete"]),
                runs=tuple(RunSummary.from_dict(r, f"{where}: runs[{i}]") for i, r in enumerate(runs)),
                raw=dict(doc.get("raw") or {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SpecError):
                raise
            raise SpecError(where, f"is missing {exc}", "pass the document m3fleet bench wrote, unedited") from None


def load(text: str, where: str) -> BenchResult:
    """A result document (JSON or YAML), or the ConfigMap holding one."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = f"{getattr(exc, 'problem', None) or 'invalid syntax'}{at}"
        raise SpecError(
            where, f"is neither JSON nor YAML ({problem})", "pass what m3fleet bench -o json wrote"
        ) from None
    if isinstance(doc, Mapping) and doc.get("kind") == "ConfigMap":
        data = doc.get("data") or {}
        if RESULT_KEY not in data:
            raise SpecError(where, f"is a ConfigMap without {RESULT_KEY}", "pass the ConfigMap m3fleet bench created")
        return load(str(data[RESULT_KEY]), f"{where} ({RESULT_KEY})")
    return BenchResult.from_document(doc, where)


def config_map(result: BenchResult, owner_reference: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """The ConfigMap that keeps a result, owned by the resource (deleted with it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": result.job,
            "namespace": result.resource["namespace"],
            "labels": labels,
            "ownerReferences": [owner_reference],
        },
        "data": {
            RESULT_KEY: json.dumps(result.to_document(), indent=1, sort_keys=False),
            SUMMARY_KEY: format_table(result.runs),
        },
    }
