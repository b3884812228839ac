"""Spans born finished (tether.observe.spans): with the SDK's own tracer tether hands each span
to the processors as the ReadableSpan the SDK would have made; the traces are the same as
through `tracer.start_span` (forced here by a processor that looks at spans as they start),
and anything the shortcut cannot honour (a processor's on_start, a sampler of the user's own,
another tracer) takes the SDK's path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import NoOpTracer

from apps import eventually
from apps import observe_app as app
from apps.inprocess import WAIT, working
from tether.observe import enable_tracing
from tether.observe.spans import FinishedSpans


class Stamping(SpanProcessor):
    """A processor that looks at every span when it starts (as baggage processors do)."""

    def __init__(self) -> None:
        self.started = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started += 1
        span.set_attribute("stamped", True)


class Picky(Sampler):
    def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None, trace_state: Any = None,
                      ) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE if name != "tether.call"
                              else Decision.DROP)

    def get_description(self) -> str:
        return "Picky"


def tracer_of(*processors: SpanProcessor, sampler: Sampler | None = None) -> Any:
    provider = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    for p in processors:
        provider.add_span_processor(p)
    return provider.get_tracer("tether")


def test_the_shortcut_only_where_nothing_would_notice() -> None:
    memory = InMemorySpanExporter()
    assert FinishedSpans.of(tracer_of(SimpleSpanProcessor(memory))) is not None
    assert FinishedSpans.of(tracer_of(BatchSpanProcessor(memory))) is not None
    for sampler in (ALWAYS_ON, ALWAYS_OFF, TraceIdRatioBased(0.5), ParentBased(ALWAYS_ON),
                    ParentBased(TraceIdRatioBased(0.1))):
        assert FinishedSpans.of(tracer_of(SimpleSpanProcessor(memory), sampler=sampler))
    # Looks at spans as they start; decides children by name; follows a sampled parent with
    # a sampler of its own; not the SDK's tracer at all.
    assert FinishedSpans.of(tracer_of(SimpleSpanProcessor(memory), Stamping())) is None
    assert FinishedSpans.of(tracer_of(SimpleSpanProcessor(memory), sampler=Picky())) is None
    assert FinishedSpans.of(tracer_of(SimpleSpanProcessor(memory), sampler=ParentBased(
        ALWAYS_ON, remote_parent_sampled=Picky()))) is None
    assert FinishedSpans.of(NoOpTracer()) is None


def shape(spans: Sequence[ReadableSpan]) -> list[tuple[Any, ...]]:
    """The spans of a trace with what differs between two traces of the same work taken out
    (ids, times, durations, worker ids): name, parent's name, attributes, events, links, status."""
    by_id = {s.context.span_id: s.name for s in spans}
    rows = []
    for s in spans:
        attributes = {k: v for k, v in (s.attributes or {}).items()
                      if k not in ("tether.worker", "tether.thread_id", "stamped",
                                   "tether.parent_thread_id", "tether.effect.key")}
        rows.append((s.name, by_id.get(s.parent.span_id, "remote") if s.parent else None,
                     sorted(attributes.items()),
                     [(e.name, sorted((k, v) for k, v in (e.attributes or {}).items()
                                      if k != "tether.duration_ms")) for e in s.events],
                     len(s.links), s.status.status_code.name, s.kind.name,
                     s.instrumentation_scope.name if s.instrumentation_scope else None,
                     s.resource.attributes.get("service.name"),
                     len({s.context.trace_id}), s.context.trace_flags.sampled))
    return sorted(rows, key=repr)


async def traced_work(db_url: str, tag: str, detail: str, *processors: SpanProcessor,
                      ) -> tuple[list[ReadableSpan], Any]:
    memory = InMemorySpanExporter()
    tracer = tracer_of(SimpleSpanProcessor(memory), *processors)
    rt = app.make_runtime().with_db(db_url)
    observer = enable_tracing(rt, tracer, detail)
    async with working(rt):
        asked = await rt.start(app.agent, {"steps": 3, "ask": 2}, thread_id=f"{tag}-ask")
        spawning = await rt.start(app.agent, {"steps": 2, "spawn": 1},
                                  thread_id=f"{tag}-spawn")
        failing = await rt.start(app.agent, {"steps": 2, "fail": 1}, thread_id=f"{tag}-fail")

        async def waiting() -> bool:
            return (await rt.peek(asked.thread_id)).status == "waiting"

        await eventually(waiting, what="the run to wait for input")
        await rt.resume(asked.thread_id, "yes")
        for run in (asked, spawning, failing):
            assert (await rt.wait(run.thread_id, timeout=WAIT)).status == "completed"
        await rt.wait(f"{tag}-spawn.child", timeout=WAIT)

        async def noted() -> bool:  # the effects' spans
            return sum(s.name == "tether.effect" for s in memory.get_finished_spans()) == 3

        await eventually(noted, what="the three effects")
    return list(memory.get_finished_spans()), observer


@pytest.mark.parametrize("detail", ["call", "step", "run"])
async def test_the_same_traces_either_way(db_url: str, detail: str) -> None:
    fast, fast_observer = await traced_work(db_url, f"fast-{detail}", detail)
    stamping = Stamping()
    slow, slow_observer = await traced_work(db_url, f"slow-{detail}", detail, stamping)
    assert fast_observer.finished is not None and slow_observer.finished is None
    assert stamping.started == len(slow) > 0  # the SDK's path, every span started there
    assert all(s.attributes and s.attributes.get("stamped") for s in slow)
    assert shape(fast) == shape(slow)
    assert all(s.context.trace_flags.sampled and not s.context.is_remote for s in fast)
