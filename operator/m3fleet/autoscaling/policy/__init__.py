"""The context-length-aware scaling policy. Pure: no I/O, no clock (time is `FleetState.now`).

One call per tick: `decide(config, state, snapshot, fleet) -> (Decision, PolicyState)`. The need,
in (fractional) replicas, is the largest of four terms (policy/constants.py lists them and every constant, with
why):

* **kv** — KV-token demand over KV-token supply: resident tokens + queued prompt tokens + the
  expected decode growth of running requests, against `kvCacheUtilization` x the per-replica
  capacity (the plan's, corrected by the capacity the engines report). Queued tokens count by how
  often the KV turns over within the cold-start horizon (Little's law: a backlog drains in waves,
  it never has to be resident all at once).
* **bin** — long requests: a request needing more than half a rank's usable KV cannot share it
  with another such request; two between a third and a half can share one. Sizes come from the
  engines' prompt-length histograms (finished requests, so they lag) or, when a gateway exports
  them, from the queued requests themselves. A request larger than any rank can hold is reported
  and never scaled on: more replicas of the same shape cannot serve it.
* **prefill** — arriving prompt tokens against the replicas' prefill throughput at a utilisation
  derived from the TTFT objective (processor-sharing prefill: TTFT ~ t/(1-u)), plus the replicas
  kept busy by backlogs. A request queued in an engine waits for that engine (routers dispatch at
  arrival and never move it), so each engine's queue — and the pile-up it gathers until replicas
  ordered now or already starting are ready, the cold-start look-ahead — occupies at most its own
  replica; new replicas only serve what arrives after they are ready. Only a gateway that holds
  requests (`gateway_holds_requests`, or its exported queue) has a backlog any replica can drain.
  Arrivals come from conservation (requests finishing + growth of those in flight over the rate
  window) times the arrival-side prompt length: prompt tokens per first token on replicas without
  a queue (the router sends new requests there; a queued replica prefills the past), smoothed over
  two minutes. A doubling of the rate (once a whole rate window has been seen: a new fleet's rate
  climbs from near zero as its first finishes lag), or resident requests suddenly far longer than
  anything seen recently, is a burst, taken at once; long prompts no longer arriving are taken at
  once too, so the estimate adds no lag of its own to a scale-down. With a gateway in front
  (spec.autoscaling.gateway), arrivals are what it recorded as requests arrived, their bytes over the
  bytes per prompt token measured against what the engines prefilled: a burst of long prompts is sized
  from its first scrape, while the engines have prefilled none of it (they count a prompt at its first
  token).
* **decode** — arriving output tokens (the request rate x the output per request: tokens decoded over the larger of
  the requests finishing and arriving, as a new fleet's first finishes are its shortest answers) against what a
  replica decodes: the batch a rank runs (MAX_DECODE_BATCH_PER_RANK, or fewer where a step would give
  each token more than the ITL objective; the catalog's step model) times the acceptance length with
  speculative decoding (each target step emits that many tokens a sequence, measured by the engines'
  counters, the plan's cited prior before, and computes every drafted token, which makes it dearer).

Then HPA semantics: a tolerance band, stabilization windows (highest recommendation in the
scale-down window wins; the window forgets a burst once its long prompts stopped arriving, and until
the next burst does not hold the forecast floor a second time), at most `maxReplicasPerStep` removed per
step (unset: one, and no limit once a burst has ended and nothing waits), scale-up limited to max(+4,
+100%) per step except in panic (need >= panicThreshold x ready: jump, and no scale-down until the panic
has been quiet for `panic_hold_seconds`). Replicas still starting count as supply, so a tick never
re-orders what is already on its way; while long prompts arrive, and once they stopped arriving, those
the need has not wanted for a minute are released (the windows keep ready replicas, not a first
estimate's order).
Missing, stale or unreachable metrics hold; partial metrics can scale up but never down. A
burst of chat, shorter than a cold start and so served only by replicas already there, stands from the
first by the standing rule (`burst_hold`: until the SLO's error budget covers a recurrence); a burst of
long prompts is served by the replicas it orders and not held after it.
A scale-down prices each measured replica by its resident KV (`removal_costs`), so the operator can
have the replicas holding the least work removed first.

The modules, in the order a tick reads them: `config` and `state` (what it is given and what it keeps), `estimates`,
`gateway` and `capacity` (arrivals and supply from the metrics), `terms` and `demand` (the four needs), `floors`
(the forecast and the standing capacity), `hpa` and `scale_down` (how far a tick moves), `decision` (the record and its
reason), `tick` (`decide`) and `apply` (what the operator writes from a decision); `constants` lists every term and
constant with its unit and why (docs/autoscaling.md is generated from it).
"""

from m3fleet.autoscaling.policy.apply import (
    INT32_MAX,
    POD_DELETION_COST,
    RECORD_HEARTBEAT_SECONDS,
    removal_costs,
    replicas_to_apply,
    worth_recording,
)
from m3fleet.autoscaling.policy.capacity import FINISHED_PROMPT_SKEW, LEARN_CLAMP, LEARNED_AFTER, LEARNING_SECONDS
from m3fleet.autoscaling.policy.config import (
    MULTI_NODE_EFFICIENCY,
    PREFILL_TOKENS_PER_GPU_SECOND,
    WEEKDAYS,
    PolicyConfig,
)
from m3fleet.autoscaling.policy.decision import MEASURED, PRIOR, Action, Decision
from m3fleet.autoscaling.policy.estimates import (
    LEVEL_JUMP,
    RISE_EVIDENCE,
    RISE_WINDOWS,
    SHIFT,
    SHIFT_EVIDENCE,
    SMOOTHING_SECONDS,
    Shift,
)
from m3fleet.autoscaling.policy.gateway import (
    BYTES_PER_TOKEN_BOUNDS,
    BYTES_PER_TOKEN_PRIOR,
    BYTES_PER_TOKEN_SECONDS,
    GATEWAY_JUMP,
    GATEWAY_WARMING_UP,
)
from m3fleet.autoscaling.policy.hpa import HPA_SCALE_UP_PODS, Behavior, prune_history, recommend, stabilize
from m3fleet.autoscaling.policy.scale_down import (
    DEFAULT_SCALE_DOWN_PER_STEP,
    RELEASE_STARTING_AFTER_SECONDS,
    WINDOW_RELEASED,
)
from m3fleet.autoscaling.policy.state import Burst, PolicyState
from m3fleet.autoscaling.policy.tick import decide

__all__ = [
    "BYTES_PER_TOKEN_BOUNDS",
    "BYTES_PER_TOKEN_PRIOR",
    "BYTES_PER_TOKEN_SECONDS",
    "DEFAULT_SCALE_DOWN_PER_STEP",
    "FINISHED_PROMPT_SKEW",
    "GATEWAY_JUMP",
    "GATEWAY_WARMING_UP",
    "HPA_SCALE_UP_PODS",
    "INT32_MAX",
    "LEARNED_AFTER",
    "LEARNING_SECONDS",
    "LEARN_CLAMP",
    "LEVEL_JUMP",
    "MEASURED",
    "MULTI_NODE_EFFICIENCY",
    "POD_DELETION_COST",
    "PREFILL_TOKENS_PER_GPU_SECOND",
    "PRIOR",
    "RECORD_HEARTBEAT_SECONDS",
    "RELEASE_STARTING_AFTER_SECONDS",
    "RISE_EVIDENCE",
    "RISE_WINDOWS",
    "SHIFT",
    "SHIFT_EVIDENCE",
    "SMOOTHING_SECONDS",
    "WEEKDAYS",
    "WINDOW_RELEASED",
    "Action",
    "Behavior",
    "Burst",
    "Decision",
    "PolicyConfig",
    "PolicyState",
    "Shift",
    "decide",
    "prune_history",
    "recommend",
    "removal_costs",
    "replicas_to_apply",
    "stabilize",
    "worth_recording",
]
