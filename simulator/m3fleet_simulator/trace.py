"""Workloads from outside the scenarios: a user's request trace, or the demand a resource recorded. Pure but for
`read_trace`, which reads the file.

**Trace file** (`m3fleet simulate --trace FILE`): one request per row, as CSV with this header or as JSON Lines
with these keys (a file whose first line starts with `{` is JSON Lines)::

    time,promptTokens,outputTokens          {"time": 0, "promptTokens": 3000, "outputTokens": 250}
    0,3000,250                              {"time": 0.4, "promptTokens": 120000, "outputTokens": 800}
    0.4,120000,800

`time` is when the request arrived, in seconds: since the trace's start, or since the Unix epoch (from 1e9 on),
in which case the simulated clock reads that time (scheduled bounds and the forecast see the real hour). Rows may
come in any order. `promptTokens` and `outputTokens` are whole numbers from 1 (a gateway's or engine's request log
has both). At most MAX_REQUESTS rows.

**Recorded demand** (`--recorded`): what the operator keeps in `status.autoscaling.demand` (`DemandRecord`) is the
policy's own need in replicas per minute, not the requests. It is replayed as chat-shaped requests (the scenarios'
chat prompt and output lengths) arriving, in each recorded minute, at need x the request rate one replica of the
plan serves at the policy's targets (`whatif.replica_request_rate`); a minute with nothing recorded has no requests.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from m3fleet.autoscaling.forecast import DemandRecord
from m3fleet.documents import InputError
from m3fleet_simulator.scenarios import MINUTE, Request

COLUMNS: Final = ("time", "promptTokens", "outputTokens")
MAX_REQUESTS: Final = 1_000_000  # a day at more than 10 requests/s: a longer trace is cut with --minutes first
MAX_TRACE_BYTES: Final = 128 * 1024 * 1024
EPOCH_FROM: Final = 1e9  # a time from here on is seconds since the Unix epoch (2001-09-09 and later)
FIX: Final = "give one request per row: time (seconds), promptTokens and outputTokens (whole numbers from 1)"


@dataclass(frozen=True)
class Trace:
    """A fixed list of requests, as the scenarios' workload (the same interface: every seed sees these requests;
    the seed draws only the cold starts)."""

    kind: ClassVar[str] = "trace"
    name: str  # where it came from: the file
    description: str
    fixed: tuple[Request, ...] = field(repr=False)
    duration: float
    min_replicas: int
    max_replicas: int
    initial_replicas: int
    clock_start: float | None = None  # epoch seconds of t = 0 when the trace says
    max_model_len: int | None = None
    days: int = 1

    def requests(self, seed: int, duration: float | None = None, day: int | None = None) -> list[Request]:
        end = self.duration if duration is None else min(duration, self.duration)
        return [r for r in self.fixed if r.arrival < end]

    def start_of_window(self, seed: int) -> float:
        return 0.0

    def describe_workload(self, seed: int) -> list[dict[str, Any]]:
        """Per 10 minutes: requests, requests/s, and mean and largest prompt and output."""
        out: list[dict[str, Any]] = []
        span = 10 * MINUTE
        for start in range(0, max(1, math.ceil(self.duration / span))):
            inside = [r for r in self.fixed if start * span <= r.arrival < (start + 1) * span]
            if not inside:
                continue
            out.append(
                {
                    "fromMinute": start * 10,
                    "toMinute": min(self.duration / MINUTE, (start + 1) * 10),
                    "requests": len(inside),
                    "requestsPerSecond": round(len(inside) / span, 3),
                    "promptTokens": _spread([r.prompt for r in inside]),
                    "outputTokens": _spread([r.output for r in inside]),
                }
            )
        return out


def _spread(values: Sequence[int]) -> str:
    return f"mean {sum(values) / len(values):.0f}, max {max(values)}"


def trace_of(
    name: str,
    rows: Sequence[tuple[float, int, int]],
    bounds: tuple[int, int],
    description: str = "",
    origin: float | None = None,
    duration: float | None = None,
) -> Trace:
    """A trace from (time, prompt, output) rows, t = 0 at `origin` (default: the first arrival), over `duration`
    seconds (default: to the end of the last arrival's minute); `bounds` the
    replica range a resource that does not enable autoscaling is given (its spec's). Times from EPOCH_FROM on set
    the simulated clock."""
    first = min(t for t, _, _ in rows) if origin is None else origin
    ordered = sorted(rows, key=lambda row: row[0])
    requests = tuple(Request(i, t - first, p, o) for i, (t, p, o) in enumerate(ordered))
    if duration is None:  # the minutes the requests arrive in
        duration = max(MINUTE, math.ceil((requests[-1].arrival + 1) / MINUTE) * MINUTE)
    low, high = bounds
    return Trace(
        name=name,
        description=description
        or f"{len(requests)} requests over {duration / MINUTE:g} minutes, replayed as recorded (arrival, prompt and "
        "output tokens)",
        fixed=requests,
        duration=duration,
        min_replicas=low,
        max_replicas=high,
        initial_replicas=max(1, low),
        clock_start=first if first >= EPOCH_FROM else None,
    )


def read_trace(path: str, bounds: tuple[int, int]) -> Trace:
    """The trace in FILE (CSV with a header, or JSON Lines). Raises InputError naming the row and field."""
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_TRACE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"--trace {path}", f"cannot be read ({exc.strerror or exc})", FIX) from None
    if len(data) > MAX_TRACE_BYTES:
        raise InputError(f"--trace {path}", f"is larger than {MAX_TRACE_BYTES // 2**20} MiB", "give a shorter trace")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"--trace {path}", "is not UTF-8 text", FIX) from None
    rows = list(_rows(path, text))
    if not rows:
        raise InputError(f"--trace {path}", "holds no request", FIX)
    return trace_of(path, rows, bounds)


def _rows(path: str, text: str) -> Iterator[tuple[float, int, int]]:
    lines = text.splitlines()
    first = next((line.strip() for line in lines if line.strip()), "")
    if first.startswith("{"):
        records: Iterator[tuple[int, Any]] = (
            (number, _json(path, number, line)) for number, line in enumerate(lines, start=1) if line.strip()
        )
    else:
        reader = csv.DictReader(io.StringIO(text))
        header = [name.strip() for name in reader.fieldnames or []]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise InputError(f"--trace {path}:1", f"the header lacks {', '.join(missing)}", FIX, field="header")
        reader.fieldnames = header
        records = ((reader.line_num, row) for row in reader)
    for count, (number, record) in enumerate(records, start=1):
        if count > MAX_REQUESTS:
            raise InputError(f"--trace {path}", f"holds more than {MAX_REQUESTS} requests", "give a shorter trace")
        yield _request(f"--trace {path}:{number}", record)


def _json(path: str, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"--trace {path}:{number}", f"is not a JSON object ({exc.msg})", FIX, field="(row)") from None


def _request(where: str, record: Any) -> tuple[float, int, int]:
    if not isinstance(record, dict):
        raise InputError(where, "is not an object with time, promptTokens and outputTokens", FIX, field="(row)")
    values: list[float] = []
    for column in COLUMNS:
        raw = record.get(column)
        try:
            value = float(raw) if isinstance(raw, int | float | str) and not isinstance(raw, bool) else math.nan
        except ValueError:
            value = math.nan
        whole = column == "time" or value == int(value) if math.isfinite(value) else False
        if not (math.isfinite(value) and whole and value >= (0 if column == "time" else 1)):
            wanted = "seconds, 0 or more" if column == "time" else "a whole number from 1"
            raise InputError(where, f"{raw!r} is not {wanted}", FIX, field=column)
        values.append(value)
    return values[0], int(values[1]), int(values[2])


@dataclass(frozen=True)
class RecordedDemand:
    """`status.autoscaling.demand` read back: (bucket start in epoch seconds, need in replicas), oldest first."""

    bucket: float
    needs: tuple[tuple[float, float], ...]

    @classmethod
    def from_status(cls, status: Any, where: str) -> RecordedDemand:
        """Raises InputError naming the field when there is no record to replay."""
        field_name = "status.autoscaling.demand"
        fix = (
            "give the resource as `kubectl get m3d NAME -o yaml` prints it, after its autoscaler ran with "
            "spec.autoscaling.forecast on (the demand it records); or replay a request log with --trace"
        )
        autoscaling = status.get("autoscaling") if isinstance(status, dict) else None
        data = autoscaling.get("demand") if isinstance(autoscaling, dict) else None
        if not isinstance(data, dict) or not isinstance(data.get("bucketSeconds"), int) or data["bucketSeconds"] < 1:
            raise InputError(where, "holds no recorded demand", fix, field=field_name)
        record = DemandRecord.from_status(data, float(data["bucketSeconds"]))
        if not record.samples:
            raise InputError(where, "records no minute of demand yet", fix, field=field_name)
        return cls(record.bucket, record.samples)
