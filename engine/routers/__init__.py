"""Fleet routers behind one interface (engine/routers/base.py); docs/fleet.md describes each."""

from __future__ import annotations

from replay.engine.router_options import OPTIONS_BY_ROUTER
from replay.engine.routers.base import Router, RouterContext
from replay.engine.routers.kv_aware import KvAwareRouter
from replay.engine.routers.least_loaded import LeastLoadedRouter
from replay.engine.routers.prefix_score import PrefixScoreRouter
from replay.engine.routers.simple import RandomRouter, RoundRobinRouter, SessionAffinityRouter

ROUTERS: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (RoundRobinRouter, RandomRouter, SessionAffinityRouter, LeastLoadedRouter, KvAwareRouter,
                PrefixScoreRouter)
}
assert set(ROUTERS) == set(OPTIONS_BY_ROUTER)


def build_router(name: str, options: dict, ctx: RouterContext) -> Router:
    """The router named ``name`` with validated options (the config already validated them)."""
    return ROUTERS[name](ctx, OPTIONS_BY_ROUTER[name].model_validate(options))


__all__ = ["ROUTERS", "Router", "RouterContext", "build_router"]
