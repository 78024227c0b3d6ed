"""`spec.autoscaling`: the built-in autoscaler's bounds, Prometheus, target, behaviour, schedule, forecast,
gateway and SLO."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from m3fleet.api import children
from m3fleet.api.base import MAX_REPLICAS, AutoscalingMode, CamelModel
from m3fleet.api.rules import cel
from m3fleet.api.spec_model import SecretKeyRef

# Only an http(s) base URL with a host: no file:, gopher: or other schemes, no spaces (RE2 and Python agree).
PROMETHEUS_URL_PATTERN = r"^https?://[^\t\n\v\f\r /?#@]+(/[^\t\n\v\f\r ?#]*)?$"
PROMETHEUS_URL_PROBLEM = (
    "must be an http:// or https:// base URL with a host and an optional path (no other scheme, no user "
    "name, no query or fragment)"
)
PROMETHEUS_URL_FIX = "give Prometheus's base URL, e.g. https://prometheus-operated.monitoring:9090"
CA_AND_INSECURE_PROBLEM = "sets both caSecretRef and insecureSkipVerify: a CA is pointless when nothing is verified"
CA_AND_INSECURE_FIX = "keep caSecretRef (verify against that CA) and drop insecureSkipVerify"
CA_WITHOUT_TLS_PROBLEM = "sets caSecretRef or insecureSkipVerify for an http:// URL, which uses no TLS"
CA_WITHOUT_TLS_FIX = "use an https:// URL, or drop caSecretRef/insecureSkipVerify"


class CaSecretKeyRef(SecretKeyRef):
    key: str = Field(
        default="ca.crt",
        min_length=1,
        max_length=253,
        description="Key holding the PEM CA bundle (ca.crt).",
        json_schema_extra=children.key_rules("key"),
    )


class PrometheusSpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.url == '' || self.url.matches('{PROMETHEUS_URL_PATTERN.replace(chr(92), chr(92) * 2)}')",
                    f"url {PROMETHEUS_URL_PROBLEM}; fix: {PROMETHEUS_URL_FIX}",
                    ".url",
                ),
                cel(
                    "!has(self.caSecretRef) || !has(self.insecureSkipVerify) || !self.insecureSkipVerify",
                    f"prometheus {CA_AND_INSECURE_PROBLEM}; fix: {CA_AND_INSECURE_FIX}",
                    ".insecureSkipVerify",
                ),
                cel(
                    "!(has(self.caSecretRef) || (has(self.insecureSkipVerify) && self.insecureSkipVerify)) "
                    "|| !has(self.url) || !self.url.startsWith('http://')",
                    f"prometheus {CA_WITHOUT_TLS_PROBLEM}; fix: {CA_WITHOUT_TLS_FIX}",
                    ".url",
                ),
            ]
        }
    )
    url: str = Field(
        default="",
        max_length=1024,
        description="Prometheus base URL, http:// or https://, e.g. https://prometheus-operated.monitoring:9090. "
        "https is verified against the system CAs, or caSecretRef. Only the status code of a failed answer is "
        "reported, never its body.",
    )
    ca_secret_ref: CaSecretKeyRef | None = Field(
        default=None,
        description="Secret (and key, default ca.crt) holding the PEM CA that signed Prometheus's certificate; "
        "read by the operator when it queries Prometheus.",
    )
    insecure_skip_verify: bool = Field(
        default=False,
        description="Do not verify Prometheus's TLS certificate (testing only: anyone on the path can answer). "
        "The operator posts an InsecureSkipVerify warning Event.",
    )
    rate_window_seconds: int = Field(
        default=60,
        ge=10,
        le=900,
        description="Window of the rates read from Prometheus (rate(...[w])). It must hold at least two scrapes of "
        "each engine pod: keep it at 4x the scrape interval or more (60 for the chart's 15 s PodMonitor, 240 for "
        "Prometheus's default 1-minute interval). Longer windows see a burst later.",
    )
    query_overrides: dict[str, str] = Field(
        default_factory=dict, description="PromQL per signal name, replacing the engine adapter's query."
    )


class AutoscalingTarget(CamelModel):
    kv_cache_utilization: float = Field(
        default=0.8,
        gt=0.0,
        le=1.0,
        description="Share of each replica's KV-cache tokens the policy plans to use.",
    )


class ScaleUpBehavior(CamelModel):
    stabilization_window_seconds: int = Field(
        default=0, ge=0, le=3600, description="Lowest recommendation over this window wins when scaling up."
    )


class ScaleDownBehavior(CamelModel):
    stabilization_window_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="Highest recommendation over this window wins when scaling down.",
    )
    max_replicas_per_step: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "Most replicas removed in one step. Unset: one, and every replica the need no longer wants at once "
            "when a burst's long prompts stopped arriving and no request waits."
        ),
    )


class AutoscalingBehavior(CamelModel):
    scale_up: ScaleUpBehavior = Field(default_factory=ScaleUpBehavior, description="Scale-up behaviour.")
    scale_down: ScaleDownBehavior = Field(default_factory=ScaleDownBehavior, description="Scale-down behaviour.")


MIN_REPLICAS_PROBLEM = (
    "must be at least 1 without spec.gateway: at zero replicas no engine exports the metrics a scale-up needs and "
    "nothing holds the requests that arrive, so an idle fleet would stay at zero and its requests would fail"
)
MIN_REPLICAS_FIX = (
    "set minReplicas to 1 or more, or set spec.gateway (its endpoint picker holds requests and reports them, so the "
    "fleet scales from zero)"
)
WINDOW_BOUNDS_PROBLEM = "has a window whose minReplicas exceeds its maxReplicas"
WINDOW_BOUNDS_FIX = "lower that window's minReplicas or raise its maxReplicas"
WINDOW_EMPTY_PROBLEM = "has a window with neither minReplicas nor maxReplicas: it would change nothing"
WINDOW_EMPTY_FIX = "give the window a minReplicas and/or a maxReplicas"
WINDOW_LENGTH_PROBLEM = "has a window whose end equals its start: it would be empty"
WINDOW_LENGTH_FIX = "give an end other than the start (an end before the start runs past midnight)"
HHMM_PATTERN = "^([01][0-9]|2[0-3]):[0-5][0-9]$"


class Weekday(StrEnum):
    MON = "mon"
    TUE = "tue"
    WED = "wed"
    THU = "thu"
    FRI = "fri"
    SAT = "sat"
    SUN = "sun"


class ScheduleWindowSpec(CamelModel):
    name: str = Field(max_length=63, description="A name for the window, shown in status.autoscaling when it applies.")
    start: str = Field(pattern=HHMM_PATTERN, max_length=5, description="Start time of day, HH:MM in UTC.")
    end: str = Field(
        pattern=HHMM_PATTERN,
        max_length=5,
        description="End time of day, HH:MM in UTC (exclusive); before start = past midnight.",
    )
    days: list[Weekday] = Field(
        default_factory=list, max_length=7, description="Days the window starts on (mon..sun); empty = every day."
    )
    min_replicas: int = Field(
        default=0, ge=0, le=MAX_REPLICAS, description="Fewest replicas while the window is active; 0 = the spec's."
    )
    max_replicas: int = Field(
        default=0, ge=0, le=MAX_REPLICAS, description="Most replicas while the window is active; 0 = the spec's."
    )


class ForecastSpec(CamelModel):
    enabled: bool = Field(
        default=True,
        description="Hold a floor of the replicas this resource needed at the same time in each of the last "
        "two periods (its own recorded history); never the only input.",
    )
    period_seconds: int = Field(
        default=86400, ge=3600, le=604800, description="The period traffic repeats with (86400 = daily)."
    )
    margin_seconds: int = Field(
        default=300,
        ge=0,
        le=3600,
        description="How much earlier than one time-to-ready the floor rises: a peak does not come back at the "
        "same second every period.",
    )


PROMETHEUS_METRIC_PATTERN = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
PROMETHEUS_LABEL_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
GATEWAY_LABEL_PROBLEM = "has a label name that is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"
GATEWAY_LABEL_FIX = "use the label names the gateway's series carry, e.g. model_name"


class GatewaySpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.matchLabels.all(k, k.matches('{PROMETHEUS_LABEL_PATTERN}'))",
                    f"gateway.matchLabels {GATEWAY_LABEL_PROBLEM}; fix: {GATEWAY_LABEL_FIX}",
                    ".matchLabels",
                )
            ]
        }
    )
    request_sizes_metric: str = Field(
        default="inference_objective_request_sizes",
        max_length=200,
        pattern=PROMETHEUS_METRIC_PATTERN,
        description="Histogram of request sizes in bytes that the gateway records when a request arrives: the "
        "Gateway API Inference Extension's (llm-d's) endpoint picker exports inference_objective_request_sizes "
        "(inference_model_request_sizes before v1.0).",
    )
    match_labels: dict[str, str] = Field(
        min_length=1,
        max_length=8,
        description="Label values selecting this fleet's requests among the gateway's series, e.g. "
        "{model_name: MiniMaxAI/MiniMax-M3} (the model name clients send).",
    )


SLO_TTFT_EMPTY_PROBLEM = (
    "allows no time to first token: seconds, perPromptTokenSeconds and unloadedPrefillFactor are all 0"
)
SLO_TTFT_EMPTY_FIX = "give slo.ttft.seconds (e.g. 2) and/or a per-prompt-token allowance"
SLO_ITL_EMPTY_PROBLEM = "allows no inter-token latency: seconds and unloadedFactor are both 0"
SLO_ITL_EMPTY_FIX = "give slo.itl.seconds (e.g. 0.05) and/or unloadedFactor (e.g. 1.5)"


def _allows_something(bound: str, parts: tuple[str, ...], problem: str, fix: str) -> ConfigDict:
    """A bound whose parts add up must have one part above 0: a bound of 0 s would fail every request."""
    rule = " || ".join(f"self.{part} > 0.0" for part in parts)
    return ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [cel(rule, f"slo.{bound} {problem}; fix: {fix}", ".seconds")]}
    )


class TtftObjective(CamelModel):
    """A request's time-to-first-token bound: seconds + perPromptTokenSeconds x its prompt tokens +
    unloadedPrefillFactor x its prompt's prefill time on one idle replica (the parts add up)."""

    model_config = _allows_something(
        "ttft",
        ("seconds", "perPromptTokenSeconds", "unloadedPrefillFactor"),
        SLO_TTFT_EMPTY_PROBLEM,
        SLO_TTFT_EMPTY_FIX,
    )
    seconds: float = Field(default=2.0, ge=0.0, le=600.0, description="Fixed allowance, seconds.")
    per_prompt_token_seconds: float = Field(
        default=0.0,
        ge=0.0,
        le=0.01,
        description="Seconds allowed per prompt token (e.g. 0.0001: 10 s more for a 100k-token prompt).",
    )
    unloaded_prefill_factor: float = Field(
        default=1.5,
        ge=0.0,
        le=100.0,
        description="Multiple of the prompt's prefill time on one idle replica (the throughput the policy plans "
        "with: its prior, or what it learned). 0 makes the bound independent of the hardware.",
    )


class ItlObjective(CamelModel):
    """A request's mean inter-token latency bound: seconds + unloadedFactor x one idle replica's decode step
    at the request's context."""

    model_config = _allows_something("itl", ("seconds", "unloadedFactor"), SLO_ITL_EMPTY_PROBLEM, SLO_ITL_EMPTY_FIX)
    seconds: float = Field(default=0.0, ge=0.0, le=10.0, description="Fixed allowance, seconds per output token.")
    unloaded_factor: float = Field(
        default=1.5,
        ge=0.0,
        le=100.0,
        description="Multiple of the unloaded inter-token latency at the request's context (prompt + half its "
        "output). 0 makes the bound absolute (seconds alone).",
    )


class SloSpec(CamelModel):
    """The service level the fleet is sized for and judged by: a request meets it when its TTFT and its mean
    inter-token latency are both within bounds; the objective is that `percentile` % of requests do."""

    percentile: float = Field(
        default=95.0,
        ge=50.0,
        le=99.99,
        description="Share of requests, in percent, that must meet the TTFT and ITL bounds (95: the p95 "
        "TTFT and ITL are within them). Status reports the measured share against it.",
    )
    ttft: TtftObjective = Field(default_factory=TtftObjective, description="Time-to-first-token bound.")
    itl: ItlObjective = Field(default_factory=ItlObjective, description="Mean inter-token latency bound.")

    def ttft_seconds(self, prompt_tokens: float, unloaded_prefill_seconds: float) -> float:
        """The TTFT a prompt of this length is allowed, given its prefill time on one idle replica."""
        ttft = self.ttft
        return (
            ttft.seconds
            + ttft.per_prompt_token_seconds * prompt_tokens
            + (ttft.unloaded_prefill_factor * unloaded_prefill_seconds)
        )

    def itl_seconds(self, unloaded_itl_seconds: float) -> float:
        """The mean inter-token latency a request is allowed, given the idle decode step at its context."""
        return self.itl.seconds + self.itl.unloaded_factor * unloaded_itl_seconds


class AutoscalingSpec(CamelModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.minReplicas <= self.maxReplicas",
                    "autoscaling.minReplicas must not exceed autoscaling.maxReplicas; fix: lower minReplicas or raise "
                    "maxReplicas",
                    ".minReplicas",
                ),
                cel(
                    "!has(self.schedule) || self.schedule.all(w, "
                    "w.minReplicas == 0 || w.maxReplicas == 0 || w.minReplicas <= w.maxReplicas)",
                    f"schedule {WINDOW_BOUNDS_PROBLEM}; fix: {WINDOW_BOUNDS_FIX}",
                    ".schedule",
                ),
                cel(
                    "!has(self.schedule) || self.schedule.all(w, w.minReplicas > 0 || w.maxReplicas > 0)",
                    f"schedule {WINDOW_EMPTY_PROBLEM}; fix: {WINDOW_EMPTY_FIX}",
                    ".schedule",
                ),
                cel(
                    "!has(self.schedule) || self.schedule.all(w, w.end != w.start)",
                    f"schedule {WINDOW_LENGTH_PROBLEM}; fix: {WINDOW_LENGTH_FIX}",
                    ".schedule",
                ),
            ]
        }
    )
    enabled: bool = Field(default=False, description="Scale replicas on token and KV-cache demand.")
    mode: AutoscalingMode = Field(
        default=AutoscalingMode.ACT, description="act (apply decisions) or advisory (decide and report only)."
    )
    min_replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_REPLICAS,
        description="Fewest replicas; at least 1, or 0 with spec.gateway (scale to zero after "
        "scaleToZeroAfterSeconds idle; the endpoint picker holds requests during the scale-up).",
    )
    max_replicas: int = Field(default=4, ge=1, le=MAX_REPLICAS, description="Most replicas.")
    scale_to_zero_after_seconds: int = Field(
        default=600,
        ge=60,
        le=86400,
        description="With minReplicas 0 (spec.gateway): scale to zero once no request has run, waited or been "
        "held for this long.",
    )
    interval_seconds: int = Field(default=15, ge=5, le=3600, description="Seconds between decisions.")
    prometheus: PrometheusSpec = Field(default_factory=PrometheusSpec, description="Where engine metrics are read.")
    target: AutoscalingTarget = Field(default_factory=AutoscalingTarget, description="Utilisation targets.")
    tolerance: float = Field(
        default=0.1, ge=0.0, le=1.0, description="No change while demand/capacity is within this share of 1."
    )
    behavior: AutoscalingBehavior = Field(
        default_factory=AutoscalingBehavior, description="Stabilization and step limits (HPA vocabulary)."
    )
    panic_threshold: float = Field(
        default=2.0,
        ge=1.0,
        le=10.0,
        description="Demand at this multiple of ready capacity scales up at once and holds scale-down.",
    )
    cold_start_seconds: int = Field(
        default=600,
        ge=0,
        le=7200,
        description="Expected pod-create-to-ready time; measured values take over.",
    )
    schedule: list[ScheduleWindowSpec] = Field(
        default_factory=list,
        max_length=16,
        description="Known peaks: daily UTC windows that raise minReplicas and/or set maxReplicas while active.",
    )
    forecast: ForecastSpec = Field(
        default_factory=ForecastSpec, description="A floor from this resource's own need in earlier periods."
    )
    gateway: GatewaySpec | None = Field(
        default=None,
        description="An inference gateway in front of the fleet whose request sizes, read from the same Prometheus "
        "when requests arrive, size a burst of long prompts before any engine has prefilled one.",
    )
    slo: SloSpec = Field(
        default_factory=SloSpec,
        description="The latency objective: what the policy sizes prefill for, what m3fleet simulate scores, "
        "and what status.autoscaling.slo measures. The default is 2 s + 1.5x the unloaded prefill time for "
        "TTFT and 1.5x the unloaded inter-token latency, for 95% of requests.",
    )
