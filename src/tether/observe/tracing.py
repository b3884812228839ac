"""OpenTelemetry traces of runs (the `otel` extra: opentelemetry-api, and the SDK that
`configure_from_env` sets up from the OTEL_* variables).

A run's trace outlives any process: its context is the run's *anchor*, a W3C traceparent kept
with the run (`runs.trace_context`: the `tether.run` span made when it was created, a child of
the caller's `traceparent` when there was one), or, for a run created where nothing traced,
one derived from its thread_id, so every worker that ever drives the run, after a SIGKILL or a
three-day interrupt, puts its spans in the same trace without reading or writing anything.

Spans (attributes tether.thread_id, tether.step, tether.node, tether.attempt, tether.version,
tether.worker, tether.agent): `tether.run` (the anchor, made at creation; a child run's links
its parent's), `tether.step` (a child of the anchor, one per execution of a step, on whichever
worker), `tether.call` (a journaled call made live, a child of its step: tether.thread_id,
tether.step, tether.call, and OpenTelemetry's gen_ai.* attributes when the call was a model's
and its result says which model and how many tokens), `tether.effect` (a handler call, a child
of the run's anchor). A call whose recorded result was replayed is an
event `tether.call.replayed` on its step, not a new span. Spans are made when the step ends
(with its start and end times), so a step costs its spans only, exported as they end.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from ..errors import ConfigError
from ..hub import Driver, RunObserver
from ..retry import FailureCategory
from ..store.base import EffectRecord, NewRun, RunRecord
from .spans import FinishedSpans

if TYPE_CHECKING:
    from opentelemetry.context import Context as OtelContext
    from opentelemetry.trace import Tracer

SCOPE = "tether"


def format_traceparent(ctx: SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The span context of a W3C traceparent header, or None if it is not a valid one."""
    if not value or not isinstance(value, str) or len(value) > 128:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or parts[0] == "ff" or len(parts[0]) != 2:
        return None
    version, trace_hex, span_hex, flags_hex = parts[:4]
    if (len(trace_hex) != 32 or len(span_hex) != 16 or len(flags_hex) != 2
            or (version == "00" and len(parts) != 4)):
        return None
    try:
        trace_id, span_id, flags = int(trace_hex, 16), int(span_hex, 16), int(flags_hex, 16)
        int(version, 16)
    except ValueError:
        return None
    if trace_id == 0 or span_id == 0:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1))


def derived_ids(thread_id: str) -> tuple[int, int]:
    """The trace and span ids of the anchor derived from a thread_id."""
    digest = hashlib.sha256(b"tether.run\0" + thread_id.encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def derived_anchor(thread_id: str) -> SpanContext:
    """The anchor of a run created where nothing traced: the same for every worker."""
    trace_id, span_id = derived_ids(thread_id)
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(1))


def anchor_of(thread_id: str, trace_context: str | None) -> SpanContext:
    """A run's anchor: the stored traceparent, else the one derived from its thread_id."""
    found = parse_traceparent(trace_context)
    return found if found is not None else derived_anchor(thread_id)


DETAILS = ("run", "step", "call")
"""TETHER_TRACE_DETAIL: `call` (the default) a span per step and per live call; `step` a span
per step, its calls as events; `run` one span per stretch of steps a worker drives (until the
run ends, parks or is given back), its steps as events."""


def trace_detail(env: Mapping[str, str] | None = None) -> str:
    """TETHER_TRACE_DETAIL, checked (ConfigError naming the variable otherwise)."""
    env = os.environ if env is None else env
    raw = env.get("TETHER_TRACE_DETAIL", "").strip().lower() or "call"
    if raw not in DETAILS:
        raise ConfigError(f"TETHER_TRACE_DETAIL={env['TETHER_TRACE_DETAIL']!r} is not one of "
                          f"{', '.join(DETAILS)} (call: a span per step and per call, the "
                          "default; step: calls as events; run: steps as events)")
    return raw


class _Sampling:
    """A run's sampling decision, made once at its root with the tracer's own sampler (the
    SDK's, from OTEL_TRACES_SAMPLER; a tracer without one samples everything) and kept in the
    sampled flag of the run's anchor: every later step on any worker follows the flag."""

    def __init__(self, tracer: Tracer) -> None:
        self.sampler = getattr(tracer, "sampler", None)
        # A root decision that never depends on the trace id (always_on/off, and
        # parentbased_always_on/off for a root), known without asking the sampler per run.
        describe = getattr(self.sampler, "get_description", None)
        root = describe() if describe is not None else "AlwaysOnSampler"
        if root.startswith("ParentBased{root:"):
            root = root[len("ParentBased{root:"):].split(",", 1)[0]
        self.root_constant = {"AlwaysOnSampler": True, "AlwaysOffSampler": False}.get(root)

    def decide(self, parent: OtelContext | None, trace_id: int, attributes: Mapping[str, Any],
               ) -> bool:
        """The sampler's decision for a run's root span under `parent` (None: a root). The
        ratio samplers decide by the trace id alone, so a derived anchor gets the same
        decision in every process."""
        if parent is None and self.root_constant is not None:
            return self.root_constant
        if self.sampler is None:
            return True
        from opentelemetry.context import Context

        result = self.sampler.should_sample(Context() if parent is None else parent, trace_id,
                                            "tether.run", attributes=attributes)
        return bool(result.decision.is_sampled())

    def derived(self, thread_id: str) -> SpanContext:
        """The derived anchor of a run created where nothing traced, flagged as the sampler
        decides for its trace id."""
        anchor = derived_anchor(thread_id)
        if self.decide(None, anchor.trace_id, {"tether.thread_id": thread_id}):
            return anchor
        return _unsampled(anchor)


UNSAMPLED_DERIVED = "-"
"""The trace context stored with a run created where nothing traced and not sampled: its
anchor's ids are the ones derived from its thread_id, so only the decision is kept (a row one
byte wider instead of 55, rewritten at every step)."""

_UNSAMPLED_FLAGS = frozenset(f"{n:02x}" for n in range(0, 256, 2))
"""A version-00 traceparent's last two characters when its sampled bit is clear."""


def _unsampled(ctx: SpanContext) -> SpanContext:
    return SpanContext(ctx.trace_id, ctx.span_id, is_remote=True, trace_flags=TraceFlags(0))


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class Tracing:
    """An Observer making spans of the runs a process creates and drives."""

    def __init__(self, tracer: Tracer, detail: str = "call") -> None:
        if detail not in DETAILS:
            raise ConfigError(f"trace detail {detail!r} is not one of {', '.join(DETAILS)}")
        self.tracer, self.detail = tracer, detail
        self.sampling = _Sampling(tracer)
        # The SDK's own tracer: spans born finished, straight to its processors.
        self.finished = FinishedSpans.of(tracer)
        # Recently driven runs' stored anchors (None: stored as not sampled).
        self._anchors: OrderedDict[str, SpanContext | None] = OrderedDict()
        # The anchors of runs created here, by the traceparent stored with them: a run driven
        # where it was created is not parsed again.
        self._made: OrderedDict[str, SpanContext] = OrderedDict()

    def _remember(self, thread_id: str, anchor: SpanContext | None) -> None:
        if len(self._anchors) >= 10_000:
            self._anchors.popitem(last=False)  # O(1): a dict's first key is not
        self._anchors[thread_id] = anchor

    def run_created(self, new: NewRun, parent: RunRecord | None, traceparent: str | None,
                    at: float) -> str | None:
        """The `tether.run` anchor span of a new run: a child of `traceparent` (the caller's
        span) when given, linking its parent run's anchor when it is a child run."""
        attributes = {"tether.thread_id": new.thread_id, "tether.agent": new.agent,
                      "tether.version": new.version}
        # The sampler decides here, once for the run: under the caller's span, or as a root
        # whose trace is the one derived from the thread_id (the same trace a worker would
        # give the run had nothing traced its creation). Not sampled: no span, and the stored
        # anchor's flag says so to every worker.
        caller = parse_traceparent(traceparent)
        if caller is None:
            if self.sampling.root_constant is False:  # always_off: not even the ids
                return UNSAMPLED_DERIVED
            trace_id, span_id = derived_ids(new.thread_id)
            if not self.sampling.decide(None, trace_id, attributes):
                return UNSAMPLED_DERIVED
            caller = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(1))
        elif not self.sampling.decide(set_span_in_context(NonRecordingSpan(caller)),
                                      caller.trace_id, attributes):
            return format_traceparent(_unsampled(caller))
        links = None
        if parent is not None:
            links = [Link(anchor_of(parent.thread_id, parent.trace_context))]
            attributes["tether.parent_thread_id"] = parent.thread_id
        if self.finished is not None:
            made = self.finished.span("tether.run", caller, _ns(at), _ns(at), attributes,
                                      links=links)
        else:
            span = self.tracer.start_span("tether.run",
                                          context=set_span_in_context(NonRecordingSpan(caller)),
                                          attributes=attributes, links=links,
                                          start_time=_ns(at))
            span.end(end_time=_ns(at))
            made = span.get_span_context()
        traceparent = format_traceparent(made)
        if len(self._made) >= 10_000:
            self._made.popitem(last=False)
        # As a worker elsewhere would read it back from the store: a remote parent.
        self._made[traceparent] = SpanContext(made.trace_id, made.span_id, is_remote=True,
                                              trace_flags=made.trace_flags)
        return traceparent

    def run_observer(self, run: RunRecord, worker: str) -> RunObserver | None:
        """The run's spans while `worker` drives it; None (no SDK call at all on its step
        path) when its anchor says the run is not sampled."""
        stored = run.trace_context
        if stored == UNSAMPLED_DERIVED or (stored and len(stored) == 55
                                           and stored[-2:] in _UNSAMPLED_FLAGS):
            self._remember(run.thread_id, None)  # its effects are not traced either
            return None  # the common unsampled case, before anything is parsed
        anchor = self._made.get(stored) if stored else None
        if anchor is None:
            anchor = parse_traceparent(stored)
            if anchor is None:
                anchor = self.sampling.derived(run.thread_id)
                stored = None
        if stored:
            self._remember(run.thread_id, anchor)
        if not anchor.trace_flags.sampled:
            return None
        if self.detail == "run":
            return _RunSummary(self.tracer, run, worker, anchor, self.finished)
        return _RunTrace(self.tracer, run, worker, anchor, calls_as_events=self.detail == "step",
                         finished=self.finished)

    def effect(self, effect: EffectRecord, outcome: str, started: float, finished: float) -> None:
        # The effect row does not carry its run's stored anchor: the one its steps used here
        # (effects are mostly performed by the worker that ran the step), else the derived one.
        if effect.thread_id in self._anchors:
            anchor = self._anchors[effect.thread_id]
        else:
            anchor = self.sampling.derived(effect.thread_id)
        if anchor is None or not anchor.trace_flags.sampled:
            return
        if self.finished is not None:
            self.finished.span(
                "tether.effect", anchor, _ns(started), _ns(finished),
                {"tether.thread_id": effect.thread_id, "tether.step": effect.step,
                 "tether.effect": effect.name, "tether.effect.key": effect.key,
                 "tether.attempt": effect.attempts, "tether.outcome": outcome},
                status=(Status(StatusCode.ERROR, f"effect {outcome}")
                        if outcome in ("retry", "dead") else None))
            return
        span = self.tracer.start_span(
            "tether.effect", context=set_span_in_context(NonRecordingSpan(anchor)),
            start_time=_ns(started),
            attributes={"tether.thread_id": effect.thread_id, "tether.step": effect.step,
                        "tether.effect": effect.name, "tether.effect.key": effect.key,
                        "tether.attempt": effect.attempts, "tether.outcome": outcome})
        if outcome in ("retry", "dead"):
            span.set_status(Status(StatusCode.ERROR, f"effect {outcome}"))
        span.end(end_time=_ns(finished))

    def worker_started(self, worker: Driver) -> None:
        pass

    def worker_stopped(self, worker: Driver) -> None:
        pass


class _RunTrace:
    """The spans of one run while a worker drives it. Calls wait for their step's span, made
    when the step ends. Each span gets its attributes in one dict, built once, at its start
    (the SDK copies them in; nothing is set on a span afterwards), and its parent passed
    explicitly (no context attached or detached)."""

    __slots__ = ("agent", "anchor", "calls", "events", "finished", "links", "parent", "thread_id",
                 "tracer", "version", "worker")

    def __init__(self, tracer: Tracer, run: RunRecord, worker: str,
                 anchor: SpanContext | None = None, calls_as_events: bool = False,
                 finished: FinishedSpans | None = None) -> None:
        self.tracer, self.finished = tracer, finished
        stored = run.trace_context
        self.anchor = anchor if anchor is not None else anchor_of(run.thread_id, stored)
        self.events = calls_as_events
        self.parent: OtelContext = set_span_in_context(NonRecordingSpan(self.anchor))
        self.thread_id, self.agent, self.version, self.worker = (
            run.thread_id, run.agent, run.version, worker)
        # A child run created where nothing traced has no anchor span to carry the link to
        # its parent: its steps carry it.
        self.links = ([Link(derived_anchor(run.parent_thread_id))]
                      if run.parent_thread_id and not stored else None)
        self.calls: list[tuple[str, bool, float, float, Mapping[str, Any] | None]] = []

    def call(self, step: int, name: str, replayed: bool, started: float, finished: float,
             llm: Mapping[str, Any] | None = None) -> None:
        self.calls.append((name, replayed, started, finished, llm))

    def _step_span(self, step: int, node: str | None, attempt: int, started: float,
                   extra: Mapping[str, Any]) -> Any:
        span = self.tracer.start_span(
            "tether.step", context=self.parent, start_time=_ns(started), links=self.links,
            attributes={"tether.thread_id": self.thread_id, "tether.agent": self.agent,
                        "tether.version": self.version, "tether.worker": self.worker,
                        "tether.step": step, "tether.node": node or "",
                        "tether.attempt": attempt, **extra})
        if self.calls and not span.is_recording():
            # Not sampled: its calls' spans would hang under a span nobody records (the SDK's
            # samplers decide them alike: by the parent, or by the same trace id).
            self.calls.clear()
        if self.calls and self.events:  # TETHER_TRACE_DETAIL=step: each call an event
            for name, replayed, t0, _, llm in self.calls:
                span.add_event("tether.call.replayed" if replayed else "tether.call",
                               {"tether.call": name, **(llm or {})}, timestamp=_ns(t0))
            self.calls.clear()
        if self.calls:
            inside = None
            for name, replayed, t0, t1, llm in self.calls:
                if replayed:
                    span.add_event("tether.call.replayed", {"tether.call": name},
                                   timestamp=_ns(t0))
                    continue
                if inside is None:
                    inside = set_span_in_context(span)
                # Its run, agent, version and worker are its step's (its parent's): only what
                # tells the call apart is repeated.
                attributes: dict[str, Any] = {"tether.thread_id": self.thread_id,
                                              "tether.step": step, "tether.call": name}
                if llm:
                    attributes.update(llm)
                self.tracer.start_span("tether.call", context=inside, start_time=_ns(t0),
                                       attributes=attributes).end(end_time=_ns(t1))
            self.calls.clear()
        return span

    def _finished_step(self, maker: FinishedSpans, step: int, node: str, attempt: int,
                       started: float, finished: float, extra: tuple[str, str]) -> None:
        """The step's span and its calls', born finished (the SDK's tracer)."""
        events: list[tuple[str, Mapping[str, Any], int]] = []
        live = []
        for name, replayed, t0, t1, llm in self.calls:
            if replayed or self.events:
                events.append(("tether.call.replayed" if replayed else "tether.call",
                               {"tether.call": name, **(llm or {})} if not replayed
                               else {"tether.call": name}, _ns(t0)))
            else:
                live.append((name, t0, t1, llm))
        self.calls.clear()
        made = maker.span(
            "tether.step", self.anchor, _ns(started), _ns(finished),
            {"tether.thread_id": self.thread_id, "tether.agent": self.agent,
             "tether.version": self.version, "tether.worker": self.worker,
             "tether.step": step, "tether.node": node or "", "tether.attempt": attempt,
             extra[0]: extra[1]}, events, self.links)
        for name, t0, t1, llm in live:
            attributes: dict[str, Any] = {"tether.thread_id": self.thread_id,
                                          "tether.step": step, "tether.call": name}
            if llm:
                attributes.update(llm)
            maker.span("tether.call", made, _ns(t0), _ns(t1), attributes)

    def step(self, step: int, node: str, attempt: int, started: float, finished: float,
             status: str, received: int, sent: int) -> None:
        if self.finished is not None:
            self._finished_step(self.finished, step, node, attempt, started, finished,
                                ("tether.status", status))
            return
        self._step_span(step, node, attempt, started, {"tether.status": status}).end(
            end_time=_ns(finished))

    def parked(self, step: int, node: str, attempt: int, started: float, kind: str) -> None:
        if self.finished is not None:
            self._finished_step(self.finished, step, node, attempt, started, time.time(),
                                ("tether.parked", kind))
            return
        self._step_span(step, node, attempt, started, {"tether.parked": kind}).end()

    def failed(self, step: int, node: str | None, attempt: int, started: float,
               category: FailureCategory, exc: BaseException, final: bool) -> None:
        span = self._step_span(step, node, attempt, started,
                               {"tether.failure.category": category.value,
                                "tether.failure.final": final})
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()

    def released(self, reason: str) -> None:
        if self.calls:  # a step in flight was abandoned: its live calls still happened
            name, _, t0 = self.calls[0][:3]
            span = self.tracer.start_span(
                "tether.step", context=self.parent, start_time=_ns(t0),
                attributes={"tether.thread_id": self.thread_id, "tether.agent": self.agent,
                            "tether.version": self.version, "tether.worker": self.worker,
                            "tether.released": reason, "tether.call": name})
            span.set_status(Status(StatusCode.ERROR, f"released: {reason}"))
            self.calls.clear()
            span.end()



class _RunSummary:
    """TETHER_TRACE_DETAIL=run: one `tether.steps` span (a child of the anchor) for each stretch
    of steps a worker drives, from the first step's start until the run ends, parks, fails or
    is given back; each step an event `tether.step` (its step, node, attempt, status and
    duration), each live call counted. One span where `call` makes two a step."""

    __slots__ = ("agent", "anchor", "calls", "finished", "first", "parent", "steps", "thread_id",
                 "tracer", "version", "worker")

    def __init__(self, tracer: Tracer, run: RunRecord, worker: str, anchor: SpanContext,
                 finished: FinishedSpans | None = None) -> None:
        self.tracer, self.anchor, self.finished = tracer, anchor, finished
        self.parent: OtelContext = set_span_in_context(NonRecordingSpan(anchor))
        self.thread_id, self.agent, self.version, self.worker = (
            run.thread_id, run.agent, run.version, worker)
        self.first: float | None = None
        self.calls = 0
        self.steps: list[tuple[float, dict[str, Any]]] = []

    def call(self, step: int, name: str, replayed: bool, started: float, finished: float,
             llm: Mapping[str, Any] | None = None) -> None:
        if not replayed:
            self.calls += 1

    def _event(self, started: float, finished: float, attributes: dict[str, Any]) -> None:
        if self.first is None:
            self.first = started
        attributes["tether.duration_ms"] = round((finished - started) * 1000, 3)
        self.steps.append((started, attributes))

    def _end(self, finished: float, extra: Mapping[str, Any], error: str | None = None,
             exc: BaseException | None = None) -> None:
        if self.first is None:
            return
        if self.finished is not None and exc is None:
            self.finished.span(
                "tether.steps", self.anchor, _ns(self.first), _ns(finished),
                {"tether.thread_id": self.thread_id, "tether.agent": self.agent,
                 "tether.version": self.version, "tether.worker": self.worker,
                 "tether.steps": len(self.steps), "tether.calls": self.calls, **extra},
                [("tether.step", attributes, _ns(t0)) for t0, attributes in self.steps],
                status=None if error is None else Status(StatusCode.ERROR, error))
            self.first, self.calls, self.steps = None, 0, []
            return
        span = self.tracer.start_span(
            "tether.steps", context=self.parent, start_time=_ns(self.first),
            attributes={"tether.thread_id": self.thread_id, "tether.agent": self.agent,
                        "tether.version": self.version, "tether.worker": self.worker,
                        "tether.steps": len(self.steps), "tether.calls": self.calls, **extra})
        for t0, attributes in self.steps:
            span.add_event("tether.step", attributes, timestamp=_ns(t0))
        if exc is not None:
            span.record_exception(exc)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=_ns(finished))
        self.first, self.calls, self.steps = None, 0, []

    def step(self, step: int, node: str, attempt: int, started: float, finished: float,
             status: str, received: int, sent: int) -> None:
        self._event(started, finished, {"tether.step": step, "tether.node": node,
                                        "tether.attempt": attempt, "tether.status": status})
        if status != "running":
            self._end(finished, {"tether.status": status})

    def parked(self, step: int, node: str, attempt: int, started: float, kind: str) -> None:
        now = time.time()
        self._event(started, now, {"tether.step": step, "tether.node": node,
                                   "tether.attempt": attempt, "tether.parked": kind})
        self._end(now, {"tether.parked": kind})

    def failed(self, step: int, node: str | None, attempt: int, started: float,
               category: FailureCategory, exc: BaseException, final: bool) -> None:
        now = time.time()
        self._event(started, now, {"tether.step": step, "tether.node": node or "",
                                   "tether.attempt": attempt,
                                   "tether.failure.category": category.value,
                                   "tether.failure.final": final})
        self._end(now, {"tether.failure.category": category.value}, f"{type(exc).__name__}: {exc}", exc)

    def released(self, reason: str) -> None:
        self._end(time.time(), {"tether.released": reason}, f"released: {reason}")

# -- the SDK from OTEL_* -------------------------------------------------------------------

EXPORTERS = ("console", "otlp", "none")
_INTS = ("OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE",
         "OTEL_BSP_MAX_EXPORT_BATCH_SIZE")


def check_env(env: Mapping[str, str]) -> list[str]:
    """The exporters asked for, after checking every OTEL_* setting tether relies on
    (ConfigError naming the variable otherwise)."""
    from opentelemetry.sdk.trace.sampling import _KNOWN_SAMPLERS

    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")
             if n.strip()]
    for n in names:
        if n not in EXPORTERS:
            raise ConfigError(f"OTEL_TRACES_EXPORTER={env['OTEL_TRACES_EXPORTER']!r}: tether "
                              f"configures {', '.join(EXPORTERS)}")
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler and sampler not in _KNOWN_SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER={sampler!r} is not one of "
                          f"{', '.join(sorted(_KNOWN_SAMPLERS))}")
    if sampler.endswith("traceidratio") and env.get("OTEL_TRACES_SAMPLER_ARG"):
        try:
            ratio = float(env["OTEL_TRACES_SAMPLER_ARG"])
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG={env['OTEL_TRACES_SAMPLER_ARG']!r} "
                              "must be a ratio within 0..1")
    for var in _INTS:
        raw = env.get(var)
        if raw is not None and raw.strip() and not (raw.strip().isdigit() and int(raw) > 0):
            raise ConfigError(f"{var}={raw!r} must be a positive integer (milliseconds or a "
                              "count)")
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT")
    if "otlp" in names and endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"the OTLP endpoint {endpoint!r} must be an http:// or https:// URL")
    trace_detail(env)
    return [n for n in names if n != "none"]


def configure_from_env(env: Mapping[str, str] | None = None,
                       ) -> tuple[Tracer, Callable[[], None]]:
    """A tracer on an SDK TracerProvider set up from OTEL_* (service name and resource
    attributes, sampler, batch processor settings, exporters), made the global provider too
    so spans of instrumented libraries join; and its shutdown (flushes what is queued)."""
    env = os.environ if env is None else env
    names = check_env(env)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create())
    for name in names:
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                    OTLPSpanExporter,
                )
            except ImportError:
                raise ConfigError(
                    "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: "
                    'pip install "opentelemetry-exporter-otlp-proto-http"') from None
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider.get_tracer(SCOPE), provider.shutdown
