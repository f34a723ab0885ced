"""What the console reads: per-function stats and recent calls, workers, the catalog.

GET /v1/stats/functions             every function's FunctionStatsPublic
GET /v1/functions/{name}/stats      one function's
GET /v1/functions/{name}/stats/llm  an LLM function's TTFT, TPOT (cold and warm apart)
                                    and tokens a second over its last calls (?limit=)
GET /v1/functions/{name}/calls      its latest calls, newest first (?limit=); a key
                                    other than an admin's sees only its own
GET /v1/workers                     workers: devices, memory, pool, cache, replicas
GET /v1/catalog                     models and adapters: sizes, sharing, users
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from control_plane.api.deps import PrincipalDep, ServicesDep
from control_plane.api.schemas import CallPublic
from control_plane.api.schemas_console import (
    ArtifactUsagePublic,
    FunctionStatsPublic,
    LLMStatsPublic,
    WorkerPublic,
)
from control_plane.services import call_access, catalog_usage, fleet, llm_stats, stats

router = APIRouter(tags=["stats"])


@router.get("/v1/stats/functions")
def all_stats(who: PrincipalDep, services: ServicesDep) -> list[FunctionStatsPublic]:
    who.require("deploy")
    with services.db.session() as s:
        rows = stats.all_function_stats(s)
    return [FunctionStatsPublic.of(r) for r in rows if who.function in (None, r.name)]


@router.get("/v1/functions/{name}/stats")
def function_stats(name: str, who: PrincipalDep, services: ServicesDep) -> FunctionStatsPublic:
    who.require("deploy", name)
    with services.db.session() as s:
        return FunctionStatsPublic.of(stats.function_stats(s, name))


@router.get("/v1/functions/{name}/stats/llm")
def function_llm_stats(
    name: str,
    who: PrincipalDep,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=stats.DEFAULT_WINDOW)] = stats.DEFAULT_WINDOW,
) -> LLMStatsPublic:
    who.require("deploy", name)
    with services.db.session() as s:
        return LLMStatsPublic.of(llm_stats.llm_stats(s, name, limit))


@router.get("/v1/functions/{name}/calls")
def recent_calls(
    name: str,
    who: PrincipalDep,
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=stats.MAX_RECENT_CALLS)] = 100,
) -> list[CallPublic]:
    who.require("deploy", name)
    owner = call_access.owner_seen_by(who)  # a key other than an admin's: its own calls
    with services.db.session() as s:
        return [CallPublic.of(v) for v in stats.recent_calls(s, name, limit, owner)]


@router.get("/v1/workers")
def list_workers(who: PrincipalDep, services: ServicesDep) -> list[WorkerPublic]:
    who.require("admin")
    refs = catalog_usage.refs_by_digest(services.registry)
    with services.db.session() as s:
        return [WorkerPublic.of(w) for w in fleet.list_workers(s, refs)]


@router.get("/v1/catalog")
def catalog(who: PrincipalDep, services: ServicesDep) -> list[ArtifactUsagePublic]:
    who.require("deploy")
    with services.db.session() as s:
        return [ArtifactUsagePublic.of(a) for a in catalog_usage.list_usage(s, services.registry)]
