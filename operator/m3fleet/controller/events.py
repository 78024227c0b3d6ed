"""Kubernetes Events for a MiniMaxM3Deployment (what `kubectl describe` shows under Events).

Posted through kopf's event queue in the running operator (the manager starts its tasks from a kopf
handler so that they carry kopf's posting context). The reconciler and autoscaler take any `Events`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, cast

import kopf


class Events(Protocol):
    def info(self, body: Mapping[str, Any], reason: str, message: str) -> None: ...

    def warn(self, body: Mapping[str, Any], reason: str, message: str) -> None: ...


class KopfEvents:
    """Posts through kopf (needs the operator's context: call it from handlers or their tasks)."""

    def info(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        kopf.info(cast(kopf.Body, body), reason=reason, message=message)

    def warn(self, body: Mapping[str, Any], reason: str, message: str) -> None:
        kopf.warn(cast(kopf.Body, body), reason=reason, message=message)
