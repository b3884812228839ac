"""/metrics: the Prometheus text format, with this process's worker counters (when it runs
one) and the store-wide gauges (cached, one query every few seconds at most)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

from ..extras import install_hint
from ..observe.gauges import StoreGauges
from ..observe.metrics import Metrics
from ..runtime import Runtime


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
    try:
        yield
    finally:
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
