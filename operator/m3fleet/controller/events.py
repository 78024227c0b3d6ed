"""Kubernetes Events for a MiniMaxM3Deployment (what `kubectl describe` shows under Events).

Posted through kopf's event queue in the running operator. The reconciler and autoscaler take any
`Events`, so they also run outside kopf (tests, tools) with a sink that records instead.
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
