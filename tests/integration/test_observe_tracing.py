"""Traces with the OpenTelemetry SDK's in-memory exporter: a run interrupted, its worker gone,
and resumed by another runtime continues the same trace; replayed calls are span events, not
new call spans; a child run links its parent; failures carry the one taxonomy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tether
from apps import eventually
from apps import observe_app as app
from apps.inprocess import WAIT, working
from tether.observe import enable_tracing


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


def traced(db_url: str, exporter: InMemorySpanExporter) -> tuple[tether.Runtime, TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt = app.make_runtime().with_db(db_url)
    enable_tracing(rt, provider.get_tracer("tether"))
    return rt, provider


def spans_of(exporter: InMemorySpanExporter, thread_id: str, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans()
            if s.name == name and (s.attributes or {}).get("tether.thread_id") == thread_id]


def attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {})[key]


async def test_a_resumed_interrupt_continues_the_trace(db_url: str,
                                                       exporter: InMemorySpanExporter) -> None:
    rt, provider = traced(db_url, exporter)
    async with working(rt):
        run = await rt.start(app.agent, {"steps": 3, "ask": 2})

        async def waiting() -> bool:
            return (await rt.peek(run.thread_id)).status == "waiting"

        await eventually(waiting, what="the run to wait for input")
    provider.force_flush()
    # Another process, later: a new runtime and worker answer and finish the run.
    rt2, provider2 = traced(db_url, exporter)
    async with working(rt2):
        await rt2.resume(run.thread_id, "yes")
        done = await rt2.wait(run.thread_id, timeout=WAIT)
    provider2.force_flush()
    assert done.status == "completed"
    steps = spans_of(exporter, run.thread_id, "tether.step")
    assert [(attr(s, "tether.step"), attr(s, "tether.node")) for s in steps] == [
        (1, "work"), (2, "work"), (2, "work"), (3, "work")]
    assert attr(steps[1], "tether.parked") == "interrupt"
    assert len({s.context.trace_id for s in steps}) == 1
    assert len({s.parent.span_id for s in steps if s.parent}) == 1  # all under one anchor
    assert {attr(s, "tether.version") for s in steps} == {"v1"}
    assert all(attr(s, "tether.worker") for s in steps)
    assert len({attr(s, "tether.worker") for s in steps}) == 2
    # Step 2's call was made once (a tether.call span) and replayed once (an event).
    calls = spans_of(exporter, run.thread_id, "tether.call")
    assert [c.parent.span_id for c in calls if c.parent] == [
        steps[0].context.span_id, steps[1].context.span_id, steps[3].context.span_id]
    assert [e.name for e in steps[2].events] == ["tether.call.replayed"]
    assert [e.name for e in steps[1].events] == []


async def test_a_child_run_links_its_parent(db_url: str, exporter: InMemorySpanExporter) -> None:
    rt, provider = traced(db_url, exporter)
    async with working(rt):
        run = await rt.start(app.agent, {"steps": 1, "spawn": 1})
        await rt.wait(run.thread_id, timeout=WAIT)
        child = await rt.wait(f"{run.thread_id}.child", timeout=WAIT)
    provider.force_flush()
    assert child.status == "completed"
    [parent_step] = spans_of(exporter, run.thread_id, "tether.step")
    [child_step] = spans_of(exporter, child.thread_id, "tether.step")
    assert child_step.context.trace_id != parent_step.context.trace_id
    assert [link.context.trace_id for link in child_step.links] == [parent_step.context.trace_id]


async def test_failures_carry_their_category_and_finality(
        db_url: str, exporter: InMemorySpanExporter) -> None:
    rt, provider = traced(db_url, exporter)
    async with working(rt):
        run = await rt.start(app.agent, {"steps": 1, "fail": 3})
        done = await rt.wait(run.thread_id, timeout=WAIT)
    provider.force_flush()
    assert done.status == "failed" and done.error is not None
    assert done.error.category == "exception"
    steps = spans_of(exporter, run.thread_id, "tether.step")
    assert [(attr(s, "tether.attempt"), attr(s, "tether.failure.category"),
             attr(s, "tether.failure.final")) for s in steps] == [
        (1, "exception", False), (2, "exception", False), (3, "exception", True)]
    assert all(s.status.status_code.name == "ERROR" for s in steps)
    assert all(e.name == "exception" for s in steps for e in s.events[-1:])


async def test_post_runs_honours_a_traceparent_header(db_url: str) -> None:
    import httpx

    from tether.service import create_app

    rt = app.make_runtime().with_db(db_url)
    asgi = create_app(rt)
    async with asgi.router.lifespan_context(asgi), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=asgi), base_url="http://127.0.0.1") as c:
        body = {"agent": "obs", "input": {"steps": 1}}
        ok = await c.post("/runs", json={**body, "thread_id": "tp"},
                          headers={"traceparent": CALLER})
        bad = await c.post("/runs", json={**body, "thread_id": "junk"},
                           headers={"traceparent": "01-junk"})
        assert ok.status_code == bad.status_code == 201
        stored = await rt.store.get_run("tp")
        junk = await rt.store.get_run("junk")
        assert stored is not None and stored.trace_context == CALLER
        assert junk is not None and junk.trace_context is None


CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_a_callers_traceparent_becomes_the_runs_parent(
        db_url: str, exporter: InMemorySpanExporter) -> None:
    # Started where nothing traces: the caller's context is stored as the run's anchor.
    plain = app.make_runtime().with_db(db_url)
    async with plain:
        run = await plain.start(app.agent, {"steps": 2}, traceparent=CALLER)
        bad = await plain.start(app.agent, {"steps": 1}, traceparent="00-nonsense")
    rt, provider = traced(db_url, exporter)
    async with working(rt):
        # Started where tracing is on: a tether.run anchor span, a child of the caller's.
        traced_run = await rt.start(app.agent, {"steps": 1}, traceparent=CALLER)
        for r in (run, bad, traced_run):
            assert (await rt.wait(r.thread_id, timeout=WAIT)).status == "completed"
    provider.force_flush()
    caller_trace = 0x0af7651916cd43dd8448eb211c80319c
    steps = spans_of(exporter, run.thread_id, "tether.step")
    assert [s.context.trace_id for s in steps] == [caller_trace] * 2
    assert {s.parent.span_id for s in steps if s.parent} == {0xb7ad6b7169203331}
    [anchor] = spans_of(exporter, traced_run.thread_id, "tether.run")
    assert anchor.context.trace_id == caller_trace and anchor.parent is not None
    assert anchor.parent.span_id == 0xb7ad6b7169203331
    [step] = spans_of(exporter, traced_run.thread_id, "tether.step")
    assert step.parent is not None and step.parent.span_id == anchor.context.span_id
    [ignored] = spans_of(exporter, bad.thread_id, "tether.step")
    assert ignored.context.trace_id != caller_trace  # an invalid traceparent is ignored


async def test_a_trace_id_ratio_sampler_keeps_a_run_whole_or_drops_it(
        db_url: str, exporter: InMemorySpanExporter) -> None:
    # What the how-to suggests for cheap steps: OTEL_TRACES_SAMPLER=traceidratio. The decision
    # follows the run's trace id, so each run has all its spans or none.
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    provider = TracerProvider(sampler=TraceIdRatioBased(0.5))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt = app.make_runtime().with_db(db_url)
    enable_tracing(rt, provider.get_tracer("tether"))
    async with working(rt):
        runs = [await rt.start(app.agent, {"steps": 2}) for _ in range(24)]
        for r in runs:
            assert (await rt.wait(r.thread_id, timeout=WAIT)).status == "completed"
    provider.force_flush()
    kept = 0
    for r in runs:
        shape = [len(spans_of(exporter, r.thread_id, name))
                 for name in ("tether.run", "tether.step", "tether.call")]
        assert shape in ([0, 0, 0], [1, 2, 2]), (r.thread_id, shape)
        kept += shape[0]
    assert 0 < kept < len(runs)  # 24 runs at 0.5: all kept or all dropped is 2 in 2**24
