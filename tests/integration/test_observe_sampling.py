"""Sampling is decided once per run, at its root, and kept with the run's trace context: every
later step, on any worker, follows it; a run that is not sampled costs no SDK call on its
step path. And TETHER_TRACE_DETAIL trades spans for events. The SDK's own samplers and its
in-memory exporter, on both stores."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBasedTraceIdRatio,
    Sampler,
)

import tether
from apps import observe_app as app
from apps.inprocess import WAIT, working
from tether.errors import ConfigError
from tether.observe import enable_tracing
from tether.observe.tracing import UNSAMPLED_DERIVED, parse_traceparent, trace_detail


class Counting:
    """A tracer that counts the calls tether makes to it (and passes them on)."""

    def __init__(self, tracer: Any) -> None:
        self.tracer, self.sampler = tracer, tracer.sampler
        self.calls: list[tuple[str, str]] = []  # (span name, thread_id)

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((name, (kwargs.get("attributes") or {}).get("tether.thread_id")))
        return self.tracer.start_span(name, *args, **kwargs)

    def of(self, thread_ids: list[str]) -> list[str]:
        """The spans asked for on behalf of these runs."""
        return [name for name, t in self.calls if t in thread_ids]


def traced(db_url: str, sampler: Sampler, detail: str | None = None
           ) -> tuple[tether.Runtime, InMemorySpanExporter, Counting]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Counting(provider.get_tracer("tether"))
    rt = app.make_runtime().with_db(db_url)
    enable_tracing(rt, tracer, detail)
    return rt, exporter, tracer


def spans_of(exporter: InMemorySpanExporter, thread_id: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans()
            if (s.attributes or {}).get("tether.thread_id") == thread_id]


async def stored_sampled(rt: tether.Runtime, thread_id: str) -> bool:
    """The sampling decision stored with the run (its anchor's sampled flag)."""
    record = await rt.store.get_run(thread_id)
    assert record is not None
    if record.trace_context == UNSAMPLED_DERIVED:  # no caller, not sampled: the decision only
        return False
    anchor = parse_traceparent(record.trace_context)
    assert anchor is not None
    return bool(anchor.trace_flags.sampled)


async def run_all(rt: tether.Runtime, n: int, steps: int = 2, **start: Any) -> dict[str, bool]:
    """n runs started and finished: each one's stored sampling decision."""
    async with working(rt):
        ids = [(await rt.start(app.agent, {"steps": steps}, **start)).thread_id
               for _ in range(n)]
        for t in ids:
            assert (await rt.wait(t, timeout=WAIT)).status == "completed"
        return {t: await stored_sampled(rt, t) for t in ids}


SHAPE = ("tether.run", "tether.step", "tether.call", "tether.steps")  # an effect comes later


async def test_parent_based_ratio_decides_at_the_root_and_keeps_it(db_url: str) -> None:
    # parentbased_traceidratio: a run started with no caller is a root, so the ratio decides
    # (before, the anchor was always marked sampled and every run was kept).
    rt, exporter, _ = traced(db_url, ParentBasedTraceIdRatio(0.5))
    ids = await run_all(rt, 24)
    kept = 0
    for t, sampled in ids.items():
        shape = sorted({s.name for s in spans_of(exporter, t) if s.name in SHAPE})
        assert shape in ([], ["tether.call", "tether.run", "tether.step"]), (t, shape)
        assert sampled == bool(shape)  # the decision is stored
        kept += bool(shape)
    assert 0 < kept < len(ids)  # 24 runs at 0.5: all kept or all dropped is 2 in 2**24


async def test_every_worker_follows_the_stored_decision(db_url: str) -> None:
    # Created by a process whose sampler drops everything; driven by one that keeps
    # everything: the run's stored decision wins, its steps make no spans.
    creator, _, _ = traced(db_url, ALWAYS_OFF)
    async with creator:
        dropped = [(await creator.start(app.agent, {"steps": 2})).thread_id for _ in range(3)]
    worker, exporter, tracer = traced(db_url, ALWAYS_ON)
    async with working(worker):
        kept = (await worker.start(app.agent, {"steps": 2})).thread_id
        for t in [*dropped, kept]:
            assert (await worker.wait(t, timeout=WAIT)).status == "completed"
        assert [await stored_sampled(worker, t) for t in dropped] == [False] * 3
    assert all(spans_of(exporter, t) == [] for t in dropped)
    assert tracer.of(dropped) == []  # their steps and effects cost no SDK call
    assert sorted(s.name for s in spans_of(exporter, kept) if s.name in SHAPE) == [
        "tether.call", "tether.call", "tether.run", "tether.step", "tether.step"]


async def test_an_unsampled_caller_drops_the_run(db_url: str) -> None:
    rt, exporter, tracer = traced(db_url, ParentBasedTraceIdRatio(1.0))
    unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    assert list((await run_all(rt, 1, traceparent=unsampled)).values()) == [False]
    assert exporter.get_finished_spans() == () and tracer.calls == []


async def test_always_off_makes_no_sdk_call_at_all(db_url: str) -> None:
    rt, exporter, tracer = traced(db_url, ALWAYS_OFF)
    assert set((await run_all(rt, 10, steps=3)).values()) == {False}
    assert tracer.calls == [] and exporter.get_finished_spans() == ()


async def test_detail_step_makes_calls_events(db_url: str) -> None:
    rt, exporter, _ = traced(db_url, ALWAYS_ON, "step")
    [t] = await run_all(rt, 1, steps=3)
    spans = [s for s in spans_of(exporter, t) if s.name in SHAPE]
    assert sorted(s.name for s in spans) == ["tether.run"] + ["tether.step"] * 3
    steps = [s for s in spans if s.name == "tether.step"]
    assert all([e.name for e in s.events] == ["tether.call"] for s in steps)


async def test_detail_run_makes_one_span_with_steps_as_events(db_url: str) -> None:
    rt, exporter, tracer = traced(db_url, ALWAYS_ON, "run")
    [t] = await run_all(rt, 1, steps=3)
    [anchor, steps] = sorted((s for s in spans_of(exporter, t) if s.name in SHAPE),
                             key=lambda s: s.name)
    assert (anchor.name, steps.name) == ("tether.run", "tether.steps")
    assert steps.parent is not None and steps.parent.span_id == anchor.context.span_id
    assert [e.name for e in steps.events] == ["tether.step"] * 3
    assert [(e.attributes or {})["tether.step"] for e in steps.events] == [1, 2, 3]
    assert (steps.attributes or {})["tether.status"] == "completed"
    assert (steps.attributes or {})["tether.calls"] == 3
    assert [n for n in tracer.of([t]) if n in SHAPE] == ["tether.run", "tether.steps"]


def test_a_bad_detail_names_the_variable() -> None:
    assert trace_detail({}) == "call"
    assert trace_detail({"TETHER_TRACE_DETAIL": " Run "}) == "run"
    with pytest.raises(ConfigError, match="TETHER_TRACE_DETAIL='spans' is not one of run"):
        trace_detail({"TETHER_TRACE_DETAIL": "spans"})
