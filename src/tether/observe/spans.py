"""Finished spans handed straight to an OpenTelemetry SDK tracer's processors.

tether makes a step's spans when the step has ended, with their start and end times known, so
the SDK's live `Span` (a lock, bounded attribute and event containers, the sampler asked again
for every child, start and end hooks) buys nothing: each span is born finished. When the
tracer is the SDK's own and nothing would notice the difference, `FinishedSpans.of(tracer)`
gives a maker that builds each span as the `ReadableSpan` the SDK would have handed its
processors at `end()` and hands it to them (`on_end`), at about a sixth of the CPU
(bench/observe.py's readable_floor against sdk_floor). Nothing would notice when:

- the tracer is `opentelemetry.sdk.trace.Tracer` and enabled;
- its sampler is one of the SDK's that decides a sampled parent's children alike (always_on,
  traceidratio by the same trace id, parentbased with the default delegates): the run's
  sampling is decided once at its root, so every child of a sampled anchor is sampled;
- every processor's `on_start` and `_on_ending` are the SDK's no-ops (BatchSpanProcessor,
  SimpleSpanProcessor, and any processor that does not override them).

Otherwise (another tracer, a sampler of the user's own, a processor that looks at spans when
they start) `of` returns None and tether makes its spans through `tracer.start_span`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

_UNSET = Status(StatusCode.UNSET)


class FinishedSpans:
    """Makes finished spans for one SDK tracer (see the module's docstring)."""

    __slots__ = ("_event", "_new_id", "_on_end", "_readable", "_scope", "_tracer")

    def __init__(self, tracer: Any) -> None:
        from opentelemetry.sdk.trace import Event, ReadableSpan

        self._tracer = tracer
        self._readable = ReadableSpan
        self._event = Event
        self._new_id = tracer.id_generator.generate_span_id
        self._on_end = tracer.span_processor.on_end
        self._scope = tracer._instrumentation_scope

    @classmethod
    def of(cls, tracer: Any) -> FinishedSpans | None:
        """A maker for `tracer`, or None when its spans must go through `start_span`."""
        try:
            from opentelemetry.sdk.trace import SpanProcessor, Tracer
            from opentelemetry.sdk.trace import sampling as s
        except ImportError:  # the API alone: a tracer of someone else's
            return None
        if type(tracer) is not Tracer or not getattr(tracer, "_is_enabled", lambda: False)():
            return None
        sampler = tracer.sampler
        if isinstance(sampler, s.ParentBased):
            if not (sampler._remote_parent_sampled is s.ALWAYS_ON
                    and sampler._local_parent_sampled is s.ALWAYS_ON):
                return None
        elif type(sampler) not in (s.StaticSampler, s.TraceIdRatioBased):
            return None
        processors = getattr(tracer.span_processor, "_span_processors", None)
        if processors is None or not hasattr(tracer, "_instrumentation_scope"):
            return None
        for p in processors:
            kind = type(p)
            for hook in ("on_start", "_on_ending"):
                found = getattr(kind, hook, None)
                if found is not None and found is not getattr(SpanProcessor, hook, None) \
                        and not _does_nothing(found):
                    return None
        return cls(tracer)

    def span(self, name: str, parent: SpanContext, start_ns: int, end_ns: int,
             attributes: Mapping[str, Any], events: Sequence[tuple[str, Mapping[str, Any], int]]
             = (), links: Sequence[Link] | None = None, status: Status | None = None,
             ) -> SpanContext:
        """A finished span, child of `parent` (sampled), handed to the processors: its
        context. `attributes` (and the events') are kept as given: a fresh dict each."""
        context = SpanContext(parent.trace_id, self._new_id(), False, parent.trace_flags,
                              parent.trace_state)
        self._on_end(self._readable(
            name=name, context=context, parent=parent, resource=self._tracer.resource,
            attributes=attributes,
            events=[self._event(n, a, t) for n, a, t in events] if events else (),
            links=links or (), kind=SpanKind.INTERNAL, status=status or _UNSET,
            start_time=start_ns, end_time=end_ns, instrumentation_scope=self._scope))
        return context


def _pass(*_args: Any) -> None:
    pass


def _documented_pass(*_args: Any) -> None:
    """A docstring, then nothing."""


def _does_nothing(function: Any) -> bool:
    """`function`'s body is `pass` (or only a docstring): a hook that never looks at a span."""
    code = getattr(function, "__code__", None)
    return code is not None and code.co_code in (_pass.__code__.co_code,
                                                 _documented_pass.__code__.co_code)
