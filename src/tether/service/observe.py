"""/metrics: the Prometheus text format, with this process's worker counters (when it runs
one) and the store-wide gauges (cached, one query every few seconds at most); /audit: the
audit log of operator actions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import FastAPI, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ..extras import install_hint
from ..observe.gauges import StoreGauges
from ..observe.metrics import Metrics
from ..runtime import Runtime
from ..store.base import AUDIT_ACTIONS
from .models import ErrorBody


def metrics_available() -> bool:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def observing(runtime: Runtime, metrics: Metrics | None) -> Iterator[None]:
    """Count what the runtime's workers do while the app runs."""
    if metrics is None:
        yield
        return
    runtime.hub.observe(metrics)
    metrics.watch_store(runtime.store)
    try:
        yield
    finally:
        metrics.unwatch_store(runtime.store)
        runtime.hub.unobserve(metrics)


def add_metrics_route(app: FastAPI, runtime: Runtime, metrics: Metrics | None,
                      gauges_ttl: float = 5.0) -> None:
    gauges = StoreGauges(runtime, ttl=gauges_ttl)
    app.state.store_gauges = gauges
    if metrics is not None:
        metrics.gauges.append(gauges.collect)

    @app.get("/metrics", tags=["metrics"], response_class=Response,
             responses={200: {"content": {"text/plain": {}},
                              "description": "Prometheus text format"},
                        501: {"description": "prometheus-client is not installed"}})
    async def prometheus_metrics() -> Response:
        """Prometheus metrics: this process's worker counters and the store-wide gauges
        `tether_runs{status,version}` and `tether_effects_open{status}`."""
        if metrics is None:
            return JSONResponse({"error": {
                "type": "MissingExtra",
                "message": f"/metrics needs the 'metrics' extra: {install_hint('metrics')}"}},
                status_code=501)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        await gauges.refresh()
        return Response(generate_latest(metrics.registry()), media_type=CONTENT_TYPE_LATEST)


class AuditOut(BaseModel):
    id: int
    at: float
    actor: str
    action: str
    thread_id: str | None
    target: str | None
    details: dict[str, Any]


class AuditList(BaseModel):
    events: list[AuditOut]
    next_cursor: str | None = Field(
        description="pass as `cursor` for the next (older) page; null on the last page")


ACTION = "^(" + "|".join(a.replace(".", r"\.") for a in AUDIT_ACTIONS) + ")$"


def add_audit_route(app: FastAPI, runtime: Runtime) -> None:
    @app.get("/audit", response_model=AuditList, tags=["audit"],
             responses={c: {"model": ErrorBody, "description": HTTPStatus(c).phrase}
                        for c in (401, 422)})
    async def audit_log(
        thread_id: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
        action: Annotated[str | None, Query(pattern=ACTION)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        cursor: Annotated[str | None, Query(pattern="^[1-9][0-9]{0,17}$", description=
                                            "next_cursor of the previous page")] = None,
    ) -> AuditList:
        """Operator actions, newest first (start, resume, cancel, fork, send, retry, release,
        effect.retry, and the deployment and retention actions), by run and action;
        cursor-paginated like GET /runs."""
        events = await runtime.audit(thread_id=thread_id, action=action, limit=limit + 1,
                                     before=int(cursor) if cursor else None)
        page = events[:limit]
        return AuditList(events=[AuditOut(**e.to_dict()) for e in page],
                         next_cursor=str(page[-1].id) if len(events) > limit else None)
