"""Observability: Prometheus metrics, OpenTelemetry traces and JSON logs, as observers of a
Runtime's event hub (tether.hub.Observer), plus the store-wide gauges of `tether serve`.

Nothing here is on the hot path unless attached: a worker whose hub has no observer pays one
check per step. Metrics need the `metrics` extra (prometheus-client), traces the `otel` extra
(opentelemetry-api and -sdk); asking for either without it is a MissingExtra naming the pip
install.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

from ..extras import requires_extra
from .logs import JsonLogs, json_logging
from .metrics import BUCKETS, Metrics, serve

if TYPE_CHECKING:
    from ..runtime import Runtime

__all__ = ["BUCKETS", "JsonLogs", "Metrics", "enable_json_logs", "enable_metrics",
           "enable_tracing", "enable_tracing_from_env", "serve_metrics", "tracing_wanted"]


def enable_metrics(runtime: Runtime, part: str = "metrics") -> Metrics:
    """Count what `runtime`'s workers and its store's group commits do (attach before
    `runtime.work()`); `part` names what asked, for the error when prometheus-client is
    missing."""
    with requires_extra("metrics", part):
        import prometheus_client  # noqa: F401
    metrics = Metrics()
    runtime.hub.observe(metrics)
    metrics.watch_store(runtime.store)
    return metrics


def serve_metrics(metrics: Metrics, port: int) -> Callable[[], None]:
    """Serve `metrics` at http://127.0.0.1:port/metrics (a thread); returns its stop. A port
    in use is a ConfigError."""
    return serve(metrics, port)


def enable_json_logs(runtime: Runtime, stream: IO[str] | None = None) -> JsonLogs:
    """One JSON line per finished run and per failed step of `runtime`'s workers, on `stream`
    (stderr by default); tether's other log records become JSON lines too."""
    logs = JsonLogs(stream)
    runtime.hub.observe(logs)
    json_logging()
    return logs


def tracing_wanted(env: Mapping[str, str] | None = None) -> bool:
    """OTEL_TRACES_EXPORTER names an exporter other than `none` (and OTEL_SDK_DISABLED is not
    true): tracing is asked for. Unset means off, so a worker never traces to nowhere."""
    env = os.environ if env is None else env
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return exporter not in ("", "none") and env.get("OTEL_SDK_DISABLED", "").lower() != "true"


def enable_tracing(runtime: Runtime, tracer: Any, detail: str | None = None) -> Any:
    """Trace what `runtime` creates and its workers drive with `tracer` (an OpenTelemetry
    Tracer), at `detail` ("call", "step" or "run"; default $TETHER_TRACE_DETAIL, else
    "call"); returns the observer (tether.observe.tracing.Tracing). Each run is sampled or
    not once, at its root, by the tracer's sampler: an unsampled run costs no SDK call."""
    with requires_extra("otel", "tracing"):
        from .tracing import Tracing, trace_detail
    observer = Tracing(tracer, trace_detail() if detail is None else detail)
    runtime.hub.observe(observer)
    return observer


def enable_tracing_from_env(runtime: Runtime, part: str) -> list[Callable[[], None]]:
    """When the OTEL_* variables ask for tracing, configure the SDK from them and trace
    `runtime`; returns the shutdown to call at exit (nothing when not asked). A bad setting
    is a ConfigError, the SDK missing a MissingExtra, before anything runs."""
    if not tracing_wanted():
        return []
    with requires_extra("otel", f"{part} with OTEL_TRACES_EXPORTER set"):
        import opentelemetry.sdk.trace  # noqa: F401

        from .tracing import configure_from_env
    tracer, shutdown = configure_from_env()
    enable_tracing(runtime, tracer)
    return [shutdown]
