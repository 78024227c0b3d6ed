"""The MiniMaxM3Deployment API (pydantic models), its parsing and CRD generation."""

from m3fleet.api.models import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Accelerator,
    EngineName,
    KvCacheDtype,
    MiniMaxM3Deployment,
    MiniMaxM3DeploymentSpec,
    Plan,
    Strategy,
    Variant,
)
from m3fleet.api.parse import parse_resource, parse_spec

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Accelerator",
    "EngineName",
    "KvCacheDtype",
    "MiniMaxM3Deployment",
    "MiniMaxM3DeploymentSpec",
    "Plan",
    "Strategy",
    "Variant",
    "parse_resource",
    "parse_spec",
]
