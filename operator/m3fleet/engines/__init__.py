"""One module per engine: (spec, plan) -> EngineLaunch (commands, env, config files, probes)."""

from __future__ import annotations

from collections.abc import Callable

from m3fleet.api.models import EngineName
from m3fleet.engines import sglang, trtllm, vllm
from m3fleet.engines.base import Container, Context, EngineLaunch, Role

LAUNCHERS: dict[EngineName, Callable[[Context], EngineLaunch]] = {
    EngineName.VLLM: vllm.launch,
    EngineName.SGLANG: sglang.launch,
    EngineName.TRTLLM: trtllm.launch,
}


def launch(ctx: Context) -> EngineLaunch:
    return LAUNCHERS[ctx.plan.engine](ctx)


__all__ = ["Container", "Context", "EngineLaunch", "Role", "launch"]
