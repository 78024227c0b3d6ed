"""Where the repository and its sample resources are, for every tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLES_DIR = ROOT / "manifests" / "samples"
SAMPLE_FILES = sorted(SAMPLES_DIR.glob("*.yaml"))
K8S_VERSION = "1.33"  # the Kubernetes version built-in objects are validated against (kubernetes-validate)


def load_sample(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc
