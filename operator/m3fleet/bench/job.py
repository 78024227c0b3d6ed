"""The benchmark Job of one MiniMaxM3Deployment: options, recipe defaults, checks, rendering. Pure.

The Job runs the engine's own benchmark client from the engine's own image (the plan's), on the
accelerator pool (where that image is already pulled, and whose architecture it is built for), against
the resource's Service, once per concurrency:

* vLLM: `vllm bench serve --backend vllm --endpoint /v1/completions` (the vLLM recipe's benchmark);
* SGLang: `python3 -m sglang.benchmark.serving --backend sglang-oai` (the same OpenAI completions
  endpoint, so an API key works the same way as for the other two);
* TensorRT-LLM: `python3 -m tensorrt_llm.serve.scripts.benchmark_serving --backend openai` with the
  flags of its deployment guide's sweep.

Each run's JSON result file is printed to the container log base64-encoded between two marker lines
(`results.BEGIN`/`results.END`): no shared volume is needed, and the kubelet's line splitting cannot
corrupt it. `m3fleet.bench.results` reads it back.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from m3fleet.api.models import EngineName, MiniMaxM3Deployment, Plan, SecretKeyRef
from m3fleet.api.spec_pod import MODEL_MOUNT
from m3fleet.engines.base import Context
from m3fleet.errors import SpecError, SpecErrors
from m3fleet.render import context_for, service_name
from m3fleet.render.pod import model_env, model_volumes, placement

# The container's environment: the script refers to these, so a test can run the very same script
# against a stand-in server (a different URL, tokenizer and result directory).
URL_ENV: Final = "M3FLEET_BENCH_URL"
TOKENIZER_ENV: Final = "M3FLEET_BENCH_TOKENIZER"
RESULTS_ENV: Final = "M3FLEET_BENCH_RESULTS"
API_KEY_ENV: Final = "OPENAI_API_KEY"  # what all three clients read for `Authorization: Bearer`
RESULTS_DIR: Final = "/results"
PROGRESS: Final = "m3fleet-bench:"  # prefix of the script's own log lines
BEGIN: Final = "<<<m3fleet-bench-result concurrency={concurrency}>>>"
END: Final = "<<<m3fleet-bench-result-end>>>"

COMPONENT: Final = "benchmark"
MANAGER: Final = "m3fleet-bench"  # not the operator's "m3fleet": its pruning must never select these objects
RUN_LABEL: Final = "m3fleet.dev/benchmark"
PARAMETERS_ANNOTATION: Final = "m3fleet.dev/benchmark-parameters"
DEFAULT_TIMEOUT_SECONDS: Final = 3 * 60 * 60
TTL_SECONDS_AFTER_FINISHED: Final = 24 * 60 * 60  # the CLI deletes it once the result is kept; this is the backstop
MAX_NAME: Final = 63  # the Job's name is also a label value on its pods
PERCENTILE_METRICS: Final = "ttft,tpot,itl,e2el"


class Dataset(StrEnum):
    RANDOM = "random"  # random token ids of exactly --input-len (no download)
    SHAREGPT = "sharegpt"  # a ShareGPT JSON file reachable from the Job (--dataset-path)


@dataclass(frozen=True)
class Prompts:
    """`--num-prompts`: a fixed count per run ("100"), or so many per concurrency slot ("5x")."""

    count: int
    per_slot: bool = False

    def at(self, concurrency: int) -> int:
        return self.count * concurrency if self.per_slot else self.count

    def __str__(self) -> str:
        return f"{self.count}x" if self.per_slot else str(self.count)

    @classmethod
    def parse(cls, text: str) -> Prompts:
        raw = text.strip()
        per_slot = raw.lower().endswith("x")
        digits = raw[:-1] if per_slot else raw
        if not digits.isdigit() or int(digits) < 1:
            raise SpecError(
                "--num-prompts",
                f"{text!r} is not a positive count",
                "give prompts per run (e.g. 100) or per concurrency slot (e.g. 5x)",
            )
        return cls(int(digits), per_slot)


@dataclass(frozen=True)
class Recipe:
    """A deployment guide's benchmark: the defaults `m3fleet bench` uses for that engine."""

    source: str
    input_len: int
    output_len: int
    concurrency: tuple[int, ...]
    prompts: Prompts


VLLM_RECIPE: Final = Recipe(
    "the vLLM recipe: vllm bench serve --random-input 2048 --random-output 1024 --max-concurrency 10 --num-prompt 100",
    2048,
    1024,
    (10,),
    Prompts(100),
)
RECIPES: Final[dict[EngineName, Recipe]] = {
    EngineName.VLLM: VLLM_RECIPE,
    # No SGLang guide benchmarks M3; the vLLM recipe's workload makes the two engines comparable.
    EngineName.SGLANG: VLLM_RECIPE,
    EngineName.TRTLLM: Recipe(
        "the TensorRT-LLM guide: concurrency 32..1024, 5 prompts per slot, 1024/1024 tokens",
        1024,
        1024,
        (32, 64, 128, 256, 512, 1024),
        Prompts(5, per_slot=True),
    ),
}

CLIENTS: Final[dict[EngineName, str]] = {
    EngineName.VLLM: "vllm bench serve",
    EngineName.SGLANG: "python3 -m sglang.benchmark.serving",
    EngineName.TRTLLM: "python3 -m tensorrt_llm.serve.scripts.benchmark_serving",
}


@dataclass(frozen=True)
class BenchOptions:
    """What one benchmark runs. Lengths are None for ShareGPT (its prompts keep their own lengths)."""

    dataset: Dataset
    dataset_path: str
    input_len: int | None
    output_len: int | None
    concurrency: tuple[int, ...]
    prompts: Prompts
    api_key: SecretKeyRef | None = None
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS

    def describe(self) -> dict[str, Any]:
        """The parameters as the result document and the Job's annotation record them."""
        return {
            "dataset": self.dataset.value,
            "datasetPath": self.dataset_path,
            "inputLen": self.input_len,
            "outputLen": self.output_len,
            "concurrency": list(self.concurrency),
            "numPrompts": str(self.prompts),
            "promptsPerRun": [self.prompts.at(c) for c in self.concurrency],
            "ignoreEos": True,
            "apiKeySecret": None if self.api_key is None else f"{self.api_key.name}/{self.api_key.key}",
        }


def parse_concurrency(text: str) -> tuple[int, ...]:
    """`--concurrency 10` or `32,64,128` (run in the order given; duplicates dropped)."""
    values: list[int] = []
    for part in text.split(","):
        item = part.strip()
        if not item.lstrip("-").isdigit() or int(item) < 1:
            raise SpecError(
                "--concurrency",
                f"{item or text!r} is not a positive integer",
                "give one or more concurrencies >= 1, e.g. --concurrency 10 or --concurrency 32,64,128",
            )
        if int(item) not in values:
            values.append(int(item))
    return tuple(values)


_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def parse_secret_ref(text: str, option: str = "--api-key-secret") -> SecretKeyRef:
    """NAME/KEY: a Secret in the resource's namespace and the key holding the API key."""
    name, sep, key = text.partition("/")
    if not sep or not _DNS_NAME.match(name) or not _SECRET_KEY.match(key):
        raise SpecError(
            option,
            f"{text!r} is not NAME/KEY",
            "give the Secret's name and the key holding the API key, e.g. --api-key-secret m3-api-key/token",
        )
    return SecretKeyRef(name=name, key=key)


def api_key_ref(resource: MiniMaxM3Deployment, override: SecretKeyRef | None) -> SecretKeyRef | None:
    """The Secret with the endpoint's API key: the option, else `spec.engine.apiKeySecretRef` when the API has it."""
    if override is not None:
        return override
    ref = getattr(resource.spec.engine, "api_key_secret_ref", None)
    return ref if isinstance(ref, SecretKeyRef) else None


def options_for(
    engine: EngineName,
    *,
    dataset: Dataset = Dataset.RANDOM,
    dataset_path: str = "",
    input_len: int | None = None,
    output_len: int | None = None,
    concurrency: tuple[int, ...] | None = None,
    prompts: Prompts | None = None,
    api_key: SecretKeyRef | None = None,
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
) -> BenchOptions:
    """The engine's recipe defaults, overridden by what was given. Raises SpecErrors."""
    recipe = RECIPES[EngineName(engine)]
    errors: list[SpecError] = []
    if dataset == Dataset.SHAREGPT:
        if not dataset_path:
            errors.append(
                SpecError(
                    "--dataset-path",
                    "is required with --dataset sharegpt",
                    "give the path of a ShareGPT JSON file as the Job sees it, e.g. on the model volume "
                    f"({MODEL_MOUNT}/sharegpt.json), or use --dataset random",
                )
            )
        if input_len is not None:
            errors.append(
                SpecError(
                    "--input-len",
                    "applies to --dataset random only (ShareGPT prompts keep their own lengths)",
                    "drop --input-len, or use --dataset random",
                )
            )
    elif dataset_path:
        errors.append(SpecError("--dataset-path", "applies to --dataset sharegpt only", "drop --dataset-path"))
    for option, value in (("--input-len", input_len), ("--output-len", output_len)):
        if value is not None and value < 1:
            errors.append(SpecError(option, f"{value} is not a positive token count", "give a length >= 1"))
    if timeout_seconds < 60:
        errors.append(SpecError("--timeout", f"{timeout_seconds} s is too short", "give at least 60 seconds"))
    if errors:
        raise SpecErrors(errors)
    random = dataset == Dataset.RANDOM
    return BenchOptions(
        dataset=dataset,
        dataset_path=dataset_path,
        input_len=(input_len or recipe.input_len) if random else None,
        output_len=(output_len or recipe.output_len) if random else output_len,
        concurrency=concurrency or recipe.concurrency,
        prompts=prompts or recipe.prompts,
        api_key=api_key,
        timeout_seconds=timeout_seconds,
    )


def check(resource: MiniMaxM3Deployment, plan: Plan, options: BenchOptions) -> None:
    """What the deployment cannot serve. Raises SpecError naming the option, the reason and the fix."""
    if options.input_len is not None and options.output_len is not None:
        total = options.input_len + options.output_len
        if total > plan.max_model_len:
            where = f"{resource.metadata.namespace}/{resource.metadata.name}"
            raise SpecError(
                "--input-len",
                f"{options.input_len} + --output-len {options.output_len} = {total} tokens exceeds "
                f"spec.context.maxModelLen {plan.max_model_len} of {where}, so the engine would reject every request",
                "lower --input-len/--output-len, or raise spec.context.maxModelLen",
            )


# --- rendering -------------------------------------------------------------------------------


def served_model(ctx: Context) -> str:
    """The model name requests carry: vLLM and SGLang serve the checkpoint id; trtllm-serve its path."""
    return ctx.model_path if ctx.plan.engine == EngineName.TRTLLM else ctx.served_model_name


def url(ctx: Context) -> str:
    return f"http://{service_name(ctx.name)}.{ctx.namespace}.svc:{ctx.engine.port}"


def result_file(engine: EngineName, concurrency: int) -> str:
    return f"concurrency-{concurrency}.{'jsonl' if engine == EngineName.SGLANG else 'json'}"


def _env_ref(name: str) -> str:
    return f"${{{name}}}"


def client_argv(ctx: Context, options: BenchOptions, concurrency: int) -> list[str]:
    """The client's command line for one run (`${VAR}` words are the container's environment)."""
    engine = EngineName(ctx.plan.engine)
    prompts = str(options.prompts.at(concurrency))
    out_dir, out_file = _env_ref(RESULTS_ENV), result_file(engine, concurrency)
    common = ["--base-url", _env_ref(URL_ENV), "--model", served_model(ctx), "--tokenizer", _env_ref(TOKENIZER_ENV)]
    random = options.dataset == Dataset.RANDOM
    in_len, out_len = str(options.input_len), str(options.output_len)
    if engine == EngineName.VLLM:
        argv = ["vllm", "bench", "serve", "--backend", "vllm", "--endpoint", "/v1/completions", *common]
        argv.append("--trust-remote-code")
        if random:
            argv += ["--dataset-name", "random", "--random-input-len", in_len, "--random-output-len", out_len]
        else:
            argv += ["--dataset-name", "sharegpt", "--dataset-path", options.dataset_path]
            argv += ["--sharegpt-output-len", out_len] if options.output_len else []
        return [
            *argv,
            *("--max-concurrency", str(concurrency), "--num-prompts", prompts, "--ignore-eos"),
            *("--percentile-metrics", PERCENTILE_METRICS, "--metric-percentiles", "50,99"),
            *("--save-result", "--result-dir", out_dir, "--result-filename", out_file),
        ]
    if engine == EngineName.SGLANG:
        # `random-ids` draws random token ids (`random` would sample ShareGPT text, downloading it); a range
        # ratio of 1 makes every length exactly the one asked for, as vLLM's random dataset does.
        argv = ["python3", "-m", "sglang.benchmark.serving", "--backend", "sglang-oai", *common]
        if random:
            argv += ["--dataset-name", "random-ids", "--random-input-len", in_len, "--random-output-len", out_len]
            argv += ["--random-range-ratio", "1.0"]
        else:
            argv += ["--dataset-name", "sharegpt", "--dataset-path", options.dataset_path]
            argv += ["--sharegpt-output-len", out_len] if options.output_len else []
        return [
            *argv,
            *("--max-concurrency", str(concurrency), "--num-prompts", prompts),
            *("--output-file", f"{out_dir}/{out_file}"),
        ]
    # TensorRT-LLM: the guide's bench.sh plus its "save results" options.
    argv = ["python3", "-m", "tensorrt_llm.serve.scripts.benchmark_serving", "--backend", "openai", *common]
    argv.append("--trust-remote-code")
    if random:
        argv += ["--dataset-name", "random", "--random-ids", "--random-input-len", in_len]
        argv += ["--random-output-len", out_len, "--random-prefix-len", "0", "--tokenize-on-client"]
    else:
        argv += ["--dataset-name", "sharegpt", "--dataset-path", options.dataset_path]
        argv += ["--sharegpt-output-len", out_len] if options.output_len else []
    return [
        *argv,
        *("--max-concurrency", str(concurrency), "--num-prompts", prompts, "--ignore-eos"),
        *("--percentile-metrics", PERCENTILE_METRICS, "--metric-percentiles", "50,99"),
        *("--save-result", "--result-dir", out_dir, "--result-filename", out_file),
    ]


def _word(token: str) -> str:
    """Shell-quote one word; `${VAR}` (optionally followed by a path) stays expandable."""
    if re.fullmatch(r"\$\{[A-Z_][A-Z0-9_]*\}(/[-.\w]+)*", token):
        return f'"{token}"'
    return shlex.quote(token)


def script(ctx: Context, options: BenchOptions) -> str:
    """The container's POSIX shell script: each run, then its result file between the markers."""
    engine = EngineName(ctx.plan.engine)
    runs = len(options.concurrency)
    lines = [
        "set -eu",
        f'mkdir -p "${{{RESULTS_ENV}}}"',
        f'echo "{PROGRESS} {CLIENTS[engine]} against ${{{URL_ENV}}}: {runs} run(s)"',
    ]
    for index, concurrency in enumerate(options.concurrency, start=1):
        prompts = options.prompts.at(concurrency)
        lines += [
            f'echo "{PROGRESS} run {index}/{runs}: concurrency {concurrency}, {prompts} prompts"',
            " ".join(_word(t) for t in client_argv(ctx, options, concurrency)),
            f"echo '{BEGIN.format(concurrency=concurrency)}'",
            f'base64 "${{{RESULTS_ENV}}}/{result_file(engine, concurrency)}"',
            f"echo '{END}'",
        ]
    lines.append(f'echo "{PROGRESS} done"')
    return "\n".join(lines) + "\n"


def job_name(resource_name: str, run_id: str) -> str:
    """`<resource>-bench-<run id>`, the resource part shortened to fit a label value."""
    suffix = f"-bench-{run_id}"
    return f"{resource_name[: MAX_NAME - len(suffix)].rstrip('-.')}{suffix}"


def labels(resource_name: str, run_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "minimax-m3",
        "app.kubernetes.io/instance": resource_name,
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/managed-by": MANAGER,
        "m3fleet.dev/name": resource_name,
        RUN_LABEL: run_id,
    }


def _env(ctx: Context, options: BenchOptions) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": URL_ENV, "value": url(ctx)},
        {"name": TOKENIZER_ENV, "value": ctx.model_path},
        {"name": RESULTS_ENV, "value": RESULTS_DIR},
        {"name": "TQDM_MININTERVAL", "value": "10"},  # a progress line every 10 s, not ten a second, in the log
    ]
    env += model_env(ctx)
    if options.api_key is not None:
        ref = {"name": options.api_key.name, "key": options.api_key.key}
        env.append({"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": ref}})
    return env


def _volumes(ctx: Context) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The tokenizer comes from the checkpoint the engine serves (read-only); results go to scratch space."""
    model, model_mounts = model_volumes(ctx)
    volumes = [{"name": "results", "emptyDir": {"sizeLimit": "1Gi"}}, *model]
    return volumes, [{"name": "results", "mountPath": RESULTS_DIR}, *model_mounts]


@dataclass(frozen=True)
class Target:
    """Where the Job sends requests and what it runs (shown to the user and kept in the result)."""

    engine: EngineName
    client: str
    image: str
    service: str
    url: str
    model: str


def target(resource: MiniMaxM3Deployment, plan: Plan) -> Target:
    ctx = context_for(resource, plan)
    engine = EngineName(plan.engine)
    return Target(engine, CLIENTS[engine], plan.image, service_name(ctx.name), url(ctx), served_model(ctx))


def render_job(resource: MiniMaxM3Deployment, plan: Plan, options: BenchOptions, run_id: str) -> dict[str, Any]:
    """The benchmark Job (no owner reference: `set_owner` adds it once the resource's uid is known)."""
    ctx = context_for(resource, plan)
    name = job_name(ctx.name, run_id)
    meta_labels = labels(ctx.name, run_id)
    volumes, mounts = _volumes(ctx)
    container = {
        "name": "bench",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", script(ctx, options)],
        "env": _env(ctx, options),
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "16Gi"}},
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": ctx.namespace,
            "labels": meta_labels,
            "annotations": {PARAMETERS_ANNOTATION: json.dumps(options.describe(), sort_keys=True)},
        },
        "spec": {
            "backoffLimit": 0,  # a failed benchmark is reported, never re-run: a retry would load the fleet twice
            "activeDeadlineSeconds": options.timeout_seconds,
            "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
            "template": {
                "metadata": {"labels": dict(meta_labels)},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": volumes,
                    **placement(ctx),
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                },
            },
        },
    }


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """Owned by the resource (deleted with it), but not controlled: the operator does not manage these."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }


__all__ = [
    "BEGIN",
    "END",
    "PROGRESS",
    "RECIPES",
    "BenchOptions",
    "Dataset",
    "Prompts",
    "Target",
    "api_key_ref",
    "check",
    "job_name",
    "options_for",
    "owner_reference",
    "parse_concurrency",
    "parse_secret_ref",
    "render_job",
    "script",
    "target",
]
