"""Where the repository and its sample resources are, for every tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLES_DIR = ROOT / "manifests" / "samples"
SAMPLE_FILES = sorted(SAMPLES_DIR.glob("*.yaml"))
K8S_VERSION = "1.33"  # the Kubernetes version built-in objects are validated against (kubernetes-validate)


def resource(engine: str, accelerator: str, variant: str, name: str = "r", **spec: Any) -> dict[str, Any]:
    """A MiniMaxM3Deployment in namespace llm reading its weights from a PVC; `spec` adds or replaces spec fields."""
    return {
        "apiVersion": "m3fleet.dev/v1alpha1",
        "kind": "MiniMaxM3Deployment",
        "metadata": {"name": name, "namespace": "llm"},
        "spec": {
            "model": {"variant": variant, "source": {"pvc": {"claimName": "w"}}},
            "engine": {"name": engine},
            "accelerator": accelerator,
            **spec,
        },
    }


def load_sample(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc
