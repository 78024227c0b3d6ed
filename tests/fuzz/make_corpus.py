"""Write the fuzz corpus that tests/unit/test_fuzz_corpus.py feeds to the `m3fleet plan` and `render`
console scripts: hand-made hostile inputs (corpus/hostile) and a generated set (corpus/generated).

    .venv/bin/python tests/fuzz/make_corpus.py        # rewrites both directories (deterministic)

File names say what the CLI must do: `ok-*` is admitted, `bad-*` is rejected (exit 2, one line per problem,
each starting with the file and the field). The generated set mutates the samples at the YAML text level
(truncation, deleted or doubled characters and lines, swapped indentation, injected bytes, wrong scalars)
and at the value level (documents drawn from the CRD's schema, tests/support/cluster/contract.py); its files are
named `gen-*` and may go either way.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tests.*` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import yaml
from hypothesis import HealthCheck, given, seed, settings

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
HOSTILE = HERE / "corpus" / "hostile"
GENERATED = HERE / "corpus" / "generated"
SAMPLES = REPO / "manifests" / "samples"

GOOD = """apiVersion: m3fleet.dev/v1alpha1
kind: MiniMaxM3Deployment
metadata:
  name: {name}
spec:
  model:
    source:
      pvc:
        claimName: weights
{extra}"""


def good(name: str = "m3", extra: str = "") -> str:
    return GOOD.format(name=name, extra=extra)


CACHE = """apiVersion: m3fleet.dev/v1alpha1
kind: MiniMaxM3ModelCache
metadata:
  name: {name}
spec:
  source:
    pvc:
      claimName: weights
  nodes:
    accelerator: h200
  path: /mnt/nvme/m3fleet/m3
{extra}"""


def cache(name: str = "m3", extra: str = "") -> str:
    return CACHE.format(name=name, extra=extra)


def engine(*lines: str, name: str = "vllm") -> str:
    """`spec.engine` with `name` and the given lines (each `key: value`, indented under engine)."""
    return good(extra="  engine:\n    name: " + name + "\n" + "".join(f"    {line}\n" for line in lines))


def child_values() -> dict[str, str]:
    """Values a child object would carry that the apiserver or the kubelet refuses there (issue 42): refused at
    admission by the CRD, with the field."""
    hf = "  model:\n    source:\n      huggingFace:\n        cacheClaimName: hf\n        tokenSecretRef: {name: %s}\n"
    return {
        "bad-claim-name-namespaced.yaml": good().replace("claimName: weights", "claimName: other/k"),
        "bad-sub-path-dot-dot.yaml": good().replace("claimName: weights", "claimName: w\n        subPath: ../../etc"),
        "bad-sub-path-absolute.yaml": good().replace("claimName: weights", "claimName: w\n        subPath: /etc"),
        "bad-checkpoint-dot-dot.yaml": good().replace("  model:\n", "  model:\n    checkpoint: ../../root/x\n"),
        "bad-secret-name-namespaced.yaml": good().split("spec:")[0] + "spec:\n" + hf % "other/k",
        "bad-secret-key-missing.yaml": engine("env: [{name: T, valueFrom: {secretKeyRef: {name: s}}}]"),
        "bad-secret-key-charset.yaml": engine('apiKeySecretRef: {name: k, key: "a/b"}'),
        "bad-config-map-name.yaml": engine("env: [{name: T, valueFrom: {configMapKeyRef: {name: A_B, key: k}}}]"),
        "bad-env-name-equals.yaml": engine('env: [{name: "A=B", value: "1"}]'),
        "bad-env-name-empty.yaml": engine('env: [{name: "", value: "1"}]'),
        "bad-env-value-and-value-from.yaml": engine(
            "env: [{name: A, value: x, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]"
        ),
        "bad-env-two-sources.yaml": engine(
            "env: [{name: A, valueFrom: {fieldRef: {fieldPath: spec.nodeName}, secretKeyRef: {name: s, key: k}}}]"
        ),
        "bad-env-field-path.yaml": engine("env: [{name: A, valueFrom: {fieldRef: {fieldPath: spec.containers}}}]"),
        "bad-image-space.yaml": engine('image: "vllm/vllm-openai: v0.33.0"'),
        "bad-image-uppercase.yaml": engine("image: Team/Vllm-Openai"),
        "bad-image-unicode.yaml": engine('image: "ünïcödé→"'),
        **node_pool_values(),
    }


def node_pool_values() -> dict[str, str]:
    """Node selector labels and tolerations the apiserver refuses in the pod spec (issue 42): refused by the CRD."""
    pool = "  nodePool:\n    {}\n"
    toleration = pool.format("tolerations: [{}]")
    return {
        "ok-node-pool-labels.yaml": good(
            extra=pool.format("nodeSelector: {example.com/pool: gpu-a, tier: '', zone_1.b: A-z}")
            + "    tolerations: [{operator: Exists}, {key: example.com/x, value: gpu-a, effect: NoExecute, "
            "tolerationSeconds: 30}]\n"
        ),
        "bad-node-selector-key-space.yaml": good(extra=pool.format('nodeSelector: {"pool name": a}')),
        "bad-node-selector-key-two-slashes.yaml": good(extra=pool.format("nodeSelector: {a.io/b/c: a}")),
        "bad-node-selector-key-prefix-upper.yaml": good(extra=pool.format("nodeSelector: {Example.com/pool: a}")),
        "bad-node-selector-key-long-name.yaml": good(extra=pool.format("nodeSelector: {" + "k" * 64 + ": a}")),
        "bad-node-selector-key-long-prefix.yaml": good(
            extra=pool.format("nodeSelector: {" + ".".join(["p" * 63] * 4) + "/k: a}")
        ),
        "bad-node-selector-value-slash.yaml": good(extra=pool.format("nodeSelector: {pool: a/b}")),
        "bad-node-selector-value-long.yaml": good(extra=pool.format("nodeSelector: {pool: " + "v" * 64 + "}")),
        "bad-node-selector-value-dash-end.yaml": good(extra=pool.format("nodeSelector: {pool: gpu-}")),
        "bad-node-selector-too-many.yaml": good(
            extra=pool.format("nodeSelector: {" + ", ".join(f"k{i}: v" for i in range(33)) + "}")
        ),
        "bad-toleration-key-space.yaml": good(extra=toleration.format('{key: "a b", operator: Exists}')),
        "bad-toleration-empty-key-equal.yaml": good(extra=toleration.format("{operator: Equal, value: x}")),
        "bad-toleration-operator.yaml": good(extra=toleration.format("{key: a, operator: Gt, value: '1'}")),
        "bad-toleration-effect.yaml": good(extra=toleration.format("{key: a, effect: NoRun}")),
        "bad-toleration-value-with-exists.yaml": good(extra=toleration.format("{key: a, operator: Exists, value: b}")),
        "bad-toleration-value-charset.yaml": good(extra=toleration.format("{key: a, value: 'b c'}")),
        "bad-toleration-seconds-no-execute.yaml": good(
            extra=toleration.format("{key: a, effect: NoSchedule, tolerationSeconds: 10}")
        ),
        "bad-toleration-unknown-field.yaml": good(extra=toleration.format("{key: a, operater: Exists}")),
        "bad-cache-node-selector-value.yaml": cache().replace(
            "accelerator: h200", "accelerator: h200\n    nodeSelector: {pool: 'a b'}"
        ),
        "bad-cache-node-selector-key.yaml": cache().replace(
            "accelerator: h200", "accelerator: h200\n    nodeSelector: {'/pool': a}"
        ),
        "bad-cache-toleration-effect.yaml": cache().replace(
            "accelerator: h200", "accelerator: h200\n    tolerations: [{key: a, effect: Never}]"
        ),
        "bad-cache-toleration-empty-key.yaml": cache().replace(
            "accelerator: h200", "accelerator: h200\n    tolerations: [{value: x}]"
        ),
        **network_peers(),
    }


def network_peers() -> dict[str, str]:
    """NetworkPolicyPeers (network.allowFrom, metricsFrom) the apiserver refuses in the NetworkPolicy."""
    network = "  network:\n    {}: [{}]\n"
    return {
        "ok-network-peers.yaml": good(
            extra=network.format("allowFrom", "{namespaceSelector: {matchLabels: {team: gateway}}, podSelector: {}}")
            + "    metricsFrom: [{podSelector: {matchExpressions: [{key: app, operator: In, values: [prom]}]}}]\n"
        ),
        "bad-peer-empty.yaml": good(extra=network.format("allowFrom", "{}")),
        "bad-peer-ip-block-and-selector.yaml": good(
            extra=network.format("allowFrom", "{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}")
        ),
        "bad-peer-match-labels-key.yaml": good(
            extra=network.format("metricsFrom", '{namespaceSelector: {matchLabels: {"a b": c}}}')
        ),
        "bad-peer-match-labels-value.yaml": good(
            extra=network.format("allowFrom", "{podSelector: {matchLabels: {app: a/b}}}")
        ),
        "bad-peer-expression-operator.yaml": good(
            extra=network.format("allowFrom", "{podSelector: {matchExpressions: [{key: app, operator: Has}]}}")
        ),
        "bad-peer-expression-no-values.yaml": good(
            extra=network.format("allowFrom", "{podSelector: {matchExpressions: [{key: app, operator: NotIn}]}}")
        ),
        "bad-peer-expression-value.yaml": good(
            extra=network.format(
                "allowFrom", "{podSelector: {matchExpressions: [{key: app, operator: In, values: ['a b']}]}}"
            )
        ),
    }


def engine_inputs() -> dict[str, str]:
    """extraArgs and env the engine would take to mean something the plan owns, or not take at all (the
    webhook and the CLI refuse them: the planner's and renderer's rules, not CEL's)."""
    flag = "extraArgs: [{}]"
    return {
        "bad-flag-pcp.yaml": engine(flag.format('"-pcp", "2"')),
        "bad-flag-pcp-long.yaml": engine(flag.format('"--prefill-context-parallel-size=2"')),
        "bad-flag-dpl.yaml": engine(flag.format('"-dpl", "4"')),
        "bad-flag-kv-cache-memory-bytes.yaml": engine(flag.format('"--kv-cache-memory-bytes", "8000000000"')),
        "bad-flag-num-gpu-blocks-override.yaml": engine(flag.format('"--num-gpu-blocks-override", "64"')),
        "bad-flag-tp-underscore.yaml": engine(flag.format('"--tensor_parallel_size=4"')),
        "bad-flag-unknown.yaml": engine(flag.format('"--enable-prefix-cashing"')),
        "bad-flag-sglang-max-total-tokens.yaml": engine(flag.format('"--max-total-tokens", "4096"'), name="sglang"),
        "bad-flag-sglang-base-gpu-id.yaml": engine(flag.format('"--base-gpu-id", "4"'), name="sglang"),
        "bad-flag-sglang-unknown.yaml": engine(flag.format('"--max-runing-requests", "8"'), name="sglang"),
        "bad-env-vllm-logging-config.yaml": engine("env: [{name: VLLM_LOGGING_CONFIG_PATH, value: /tmp/x.json}]"),
        "bad-env-vllm-plugins.yaml": engine("env: [{name: VLLM_PLUGINS, value: evil}]"),
        "bad-env-sglang-logging-config.yaml": engine(
            "env: [{name: SGLANG_LOGGING_CONFIG_PATH, value: /tmp/x.json}]", name="sglang"
        ),
        "bad-env-pythonpath.yaml": engine("env: [{name: PYTHONPATH, value: /models}]"),
        "bad-env-ld-preload.yaml": engine("env: [{name: LD_PRELOAD, value: /models/x.so}]"),
        "bad-env-pythonstartup.yaml": engine("env: [{name: PYTHONSTARTUP, value: /models/x.py}]"),
    }


def caches() -> dict[str, str]:
    """MiniMaxM3ModelCache documents: the same contract as a deployment (CRD schema and CEL, then the webhook)."""
    return {
        "ok-cache.yaml": cache(),
        "ok-cache-flow-style.yaml": json.dumps(yaml.safe_load(cache())),
        "bad-cache-typo.yaml": cache(extra="  pathh: /mnt/nvme/m3fleet/x\n"),
        "bad-cache-snake-case.yaml": cache(extra="  pre_pull_images: false\n"),
        "bad-cache-quoted-bool.yaml": cache(extra='  prePullImages: "yes"\n'),
        "bad-cache-path-relative.yaml": cache().replace("path: /mnt/nvme/m3fleet/m3", "path: mnt/nvme"),
        "bad-cache-path-dot-dot.yaml": cache().replace("path: /mnt/nvme/m3fleet/m3", "path: /mnt/nvme/../../etc"),
        "bad-cache-system-path.yaml": cache().replace("path: /mnt/nvme/m3fleet/m3", "path: /etc"),
        "bad-cache-revision-branch.yaml": cache().replace(
            "    pvc:\n      claimName: weights\n", "    huggingFace: {repo: MiniMaxAI/MiniMax-M3, revision: main}\n"
        ),
        "bad-cache-two-sources.yaml": cache().replace(
            "      claimName: weights\n",
            "      claimName: weights\n    huggingFace: {repo: MiniMaxAI/MiniMax-M3, revision: '" + "0" * 40 + "'}\n",
        ),
        "bad-cache-no-source.yaml": cache().replace("    pvc:\n      claimName: weights\n", "    {}\n"),
        "bad-cache-claim-name.yaml": cache().replace("claimName: weights", "claimName: other/k"),
        "bad-cache-sub-path.yaml": cache().replace("claimName: weights", "claimName: w\n      subPath: ../x"),
        "bad-cache-token-secret.yaml": cache().replace(
            "    pvc:\n      claimName: weights\n",
            "    huggingFace: {repo: a/b, revision: '" + "0" * 40 + "', tokenSecretRef: {name: other/k}}\n",
        ),
        "bad-cache-stager-image.yaml": cache(extra='  stagerImage: "my image"\n'),
        "bad-cache-accelerator.yaml": cache().replace("accelerator: h200", "accelerator: a100"),
        "bad-cache-name-uppercase.yaml": cache("Chat"),
        "bad-cache-unknown-top-level.yaml": cache() + "specs: {}\n",
        "bad-cache-spec-missing.yaml": cache().split("spec:")[0],
    }


def hostile() -> dict[str, bytes | str]:
    bomb = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 12):
        prior = chr(ord("a") + level - 1)
        name = chr(ord("a") + level)
        bomb.append(f"{name}: &{name} [*{prior}, *{prior}, *{prior}, *{prior}, *{prior}, *{prior}, *{prior}]")
    cases: dict[str, bytes | str] = {
        # readable, odd, and valid
        "ok-crlf.yaml": good().replace("\n", "\r\n"),
        "ok-utf8-bom.yaml": "\ufeff" + good(),
        "ok-merge-key.yaml": good()
        .replace("name: m3\n", "name: m3\n  annotations: &src {claimName: weights}\n")
        .replace("claimName: weights\n", "<<: *src\n"),
        "ok-yaml-directive.yaml": "%YAML 1.1\n---\n" + good() + "...\n",
        "ok-comments-and-empty-docs.yaml": "# nothing\n---\n---\n" + good() + "---\n# trailing\n",
        "ok-flow-style.yaml": json.dumps(yaml.safe_load(good())),
        "ok-list.yaml": yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(good())]}),
        "ok-null-field.yaml": good(extra="  replicas: null\n"),
        "ok-unicode-checkpoint.yaml": good().replace("  model:\n", '  model:\n    checkpoint: "ünïcödé→"\n'),
        # not text, not YAML, not a document
        "bad-not-utf8.yaml": b"apiVersion: m3fleet.dev/v1alpha1\nkind: \xff\xfe\x00\x01\n",
        "bad-utf16.yaml": good().encode("utf-16"),
        "bad-latin1.yaml": good(extra="  engine:\n    image: caf\xe9\n").encode("latin-1"),
        "bad-empty.yaml": "",
        "bad-only-comments.yaml": "# a comment\n# another\n",
        "bad-only-separators.yaml": "---\n---\n...\n",
        "bad-tabs.yaml": good().replace("  ", "\t"),
        "bad-unclosed-flow.yaml": "kind: [MiniMaxM3Deployment\n",
        "bad-nul-byte.yaml": good(extra="  engine:\n    image: a\x00b\n"),
        "bad-control-char.yaml": good(extra="  engine:\n    image: a\x07b\n"),
        "bad-scalar-document.yaml": "hello\n",
        "bad-list-document.yaml": "- a\n- b\n",
        "bad-number-document.yaml": "42\n",
        "bad-multi-doc-bad-yaml.yaml": good("one") + "---\n" + good("two") + "  replicas: [\n---\n" + good("three"),
        "bad-multi-doc-not-mapping.yaml": good("one") + "---\n- just\n- a list\n---\n" + good("three"),
        "bad-multi-doc-one-invalid.yaml": good("one") + "---\n" + good("two", "  replicas: many\n"),
        # bounded time and memory
        "bad-alias-bomb.yaml": "\n".join(bomb) + "\n" + good(extra="  engine:\n    extraArgs: *l\n"),
        "bad-alias-cycle.yaml": "a: &a [*a]\n",
        "bad-deep-flow.yaml": "spec: " + "[" * 5000 + "]" * 5000 + "\n",
        "bad-deep-block.yaml": good(extra="".join(f"{'  ' * (i + 1)}k{i}:\n" for i in range(120)) + "  " * 122 + "x\n"),
        "bad-deep-in-preserved-field.yaml": good(
            extra="  engine:\n    env:\n    - name: A\n      valueFrom: " + "{a: " * 80 + "1" + "}" * 80 + "\n"
        ),
        "bad-long-string.yaml": good(extra="  engine:\n    image: " + "x" * 200_000 + "\n"),
        # names
        "bad-name-number.yaml": good("123"),
        "bad-name-list.yaml": good("[a, b]"),
        "bad-name-mapping.yaml": good("{a: 1}"),
        "bad-name-null.yaml": good("null"),
        "bad-name-bool.yaml": good("no"),
        "bad-name-empty.yaml": good('""'),
        "bad-name-uppercase.yaml": good("Chat"),
        "bad-name-dots.yaml": good("chat.v2"),
        "bad-name-too-long.yaml": good("m" + "3" * 45),
        "bad-name-with-colon.yaml": good('"a: b"'),
        "bad-name-newline.yaml": good('"a\\nb"'),
        "bad-no-metadata.yaml": good().replace("metadata:\n  name: m3\n", ""),
        "bad-metadata-list.yaml": good().replace("metadata:\n  name: m3\n", "metadata: [name, m3]\n"),
        "bad-label-value-number.yaml": good().replace("name: m3\n", "name: m3\n  labels: {a: 1}\n"),
        "bad-label-key.yaml": good().replace("name: m3\n", "name: m3\n  labels: {'a b': x}\n"),
        # keys
        "bad-non-string-key.yaml": good(extra="  1: x\n"),
        "bad-bool-key.yaml": good(extra="  on: x\n"),
        "bad-null-key.yaml": good(extra="  ~: x\n"),
        "bad-complex-key.yaml": good(extra="  ? [a, b]\n  : x\n"),
        "bad-duplicate-key.yaml": good(extra="  replicas: 1\n  replicas: 2\n"),
        "bad-snake-case.yaml": good(extra="  node_pool: {}\n"),
        "bad-typo.yaml": good(extra="  contxt: {maxModelLen: 8192}\n"),
        "bad-odd-key.yaml": good(extra='  "a: b\\nc": 1\n'),
        "bad-unknown-top-level.yaml": good() + "specs: {}\n",
        # types
        "bad-quoted-int.yaml": good(extra='  replicas: "8"\n'),
        "bad-yes-string.yaml": good(extra='  autoscaling: {enabled: "yes"}\n'),
        "bad-float-for-int.yaml": good(extra="  replicas: 1.5\n"),
        "bad-integral-float-replicas.yaml": good(extra="  replicas: 8.0\n"),
        "bad-inf.yaml": good(extra="  autoscaling: {tolerance: .inf}\n"),
        "bad-nan.yaml": good(extra="  autoscaling: {tolerance: .nan}\n"),
        "bad-huge-int.yaml": good(extra="  replicas: 99999999999999999999999999\n"),
        "bad-timestamp.yaml": good(extra="  replicas: 2024-01-01\n"),
        "bad-binary.yaml": good(extra="  engine:\n    image: !!binary aGVsbG8=\n"),
        "bad-set.yaml": good(extra="  engine:\n    extraArgs: !!set {a, b}\n"),
        "bad-python-tag.yaml": good(extra="  engine:\n    image: !!python/object:os.system {}\n"),
        "bad-custom-tag.yaml": good(extra="  engine:\n    image: !secret foo\n"),
        "bad-spec-null.yaml": good().split("spec:")[0] + "spec: null\n",
        "bad-spec-list.yaml": good().split("spec:")[0] + "spec: [a]\n",
        "bad-spec-string.yaml": good().split("spec:")[0] + "spec: hello\n",
        "bad-spec-missing.yaml": good().split("spec:")[0],
        "bad-wrong-kind.yaml": good().replace("MiniMaxM3Deployment", "Deployment"),
        "bad-kind-number.yaml": good().replace("MiniMaxM3Deployment", "7"),
        "bad-no-api-version.yaml": good().replace("apiVersion: m3fleet.dev/v1alpha1\n", ""),
        "bad-list-items-not-list.yaml": "apiVersion: v1\nkind: List\nitems: 5\n",
        "bad-list-bad-item.yaml": "apiVersion: v1\nkind: List\nitems: [5, {kind: x}]\n",
        # rules
        "bad-cel-tp.yaml": good(extra="  parallelism: {tensorParallelSize: 3}\n"),
        "bad-cel-variant.yaml": good(extra="  model: {variant: mxfp4}\n").replace(
            "  model:\n    source", "  x:\n    y"
        ),
        "bad-out-of-range.yaml": good(extra="  context: {maxModelLen: 99999999}\n"),
        "bad-enum.yaml": good(extra="  accelerator: a100\n"),
        "bad-infeasible.yaml": good(
            extra="  context: {maxModelLen: 1048576}\n  parallelism: {tensorParallelSize: 8}\n"
        ),
    }
    return {**cases, **child_values(), **engine_inputs(), **caches()}


def mutate_text(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True)
    kind = rng.randrange(9)
    if kind == 0:
        return text[: rng.randrange(len(text))]
    if kind == 1:
        i = rng.randrange(len(text))
        return text[:i] + text[i + 1 :]
    if kind == 2:
        i = rng.randrange(len(lines))
        return "".join([*lines[:i], lines[i], *lines[i:]])
    if kind == 3:
        i = rng.randrange(len(lines))
        return "".join(lines[:i] + lines[i + 1 :])
    if kind == 4:
        i = rng.randrange(len(lines))
        return "".join([*lines[:i], "  " + lines[i], *lines[i + 1 :]])
    if kind == 5:
        i = rng.randrange(len(text))
        return text[:i] + rng.choice(["{", "[", ":", "&a ", "*a", "!!", "'", '"', "\t", "- ", "#", "%"]) + text[i:]
    if kind == 6:
        i = rng.randrange(len(lines))
        key, sep, _ = lines[i].partition(":")
        scalar = rng.choice(["yes", '"8"', "~", "[]", "{}", "1e999", "-1", "0x10", "0o7", ".nan", "2001-01-01", "''"])
        return "".join([*lines[:i], f"{key}{sep} {scalar}\n" if sep else lines[i], *lines[i + 1 :]])
    if kind == 7:
        i = rng.randrange(len(lines))
        return "".join([*lines[:i], lines[i].lstrip(), *lines[i + 1 :]])
    i = rng.randrange(len(lines))
    return "".join([*lines[:i], lines[i].replace("a", "_", 1).replace("N", "_n", 1), *lines[i + 1 :]])


def generated(count: int) -> dict[str, str]:
    rng = random.Random(12)
    samples = [p.read_text() for p in sorted(SAMPLES.glob("*.yaml"))]
    out = {f"gen-text-{i:04d}.yaml": mutate_text(rng.choice(samples), rng) for i in range(count)}

    from tests.support.cluster.contract import documents  # drawn from the CRD's schema, valid and mutated

    drawn: list[dict[str, Any]] = []

    @seed(12)
    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(documents())
    def collect(document: dict[str, Any]) -> None:
        drawn.append(document)

    collect()
    for i, document in enumerate(drawn[:count]):
        out[f"gen-schema-{i:04d}.yaml"] = yaml.safe_dump(document, allow_unicode=True)
    return out


def write(directory: Path, files: dict[str, Any]) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for name, content in files.items():
        data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
        (directory / name).write_bytes(data)


if __name__ == "__main__":
    write(HOSTILE, hostile())
    write(GENERATED, generated(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
    print(f"{len(list(HOSTILE.iterdir()))} hostile, {len(list(GENERATED.iterdir()))} generated files")
