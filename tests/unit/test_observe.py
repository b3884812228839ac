"""tether.observe's pure parts: histogram buckets, the W3C traceparent, the derived anchor,
the failure taxonomy, the OTEL_* checks."""

from __future__ import annotations

import pytest

from tether.errors import (
    ConfigError,
    DefinitionError,
    LeaseLost,
    NondeterminismError,
    SerializationError,
    StoreUnavailable,
)
from tether.observe import tracing_wanted
from tether.observe.metrics import BUCKETS, Histogram
from tether.observe.tracing import (
    anchor_of,
    check_env,
    derived_anchor,
    format_traceparent,
    parse_traceparent,
)
from tether.retry import FINAL_CATEGORIES, FailureCategory, categorize


def test_histogram_buckets_are_cumulative_with_le_inclusive() -> None:
    h = Histogram((0.01, 0.1, 1.0))
    for v in (0.001, 0.01, 0.05, 0.1, 2.0, 5.0):
        h.observe(("a",), v)
    [(key, buckets, total)] = list(h.samples())
    assert key == ("a",)
    assert buckets == [("0.01", 2), ("0.1", 4), ("1.0", 4), ("+Inf", 6)]
    assert total == pytest.approx(7.161)


def test_buckets_span_a_millisecond_to_an_hour() -> None:
    assert BUCKETS[0] == 0.001 and BUCKETS[-1] == 3600.0
    assert list(BUCKETS) == sorted(BUCKETS)


def test_traceparent_round_trips_and_bad_ones_are_refused() -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ctx = parse_traceparent(tp)
    assert ctx is not None and ctx.is_remote
    assert format_traceparent(ctx) == tp
    for bad in ("", "junk", "00-" + "0" * 32 + "-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",
                "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
                "00-zzf7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x" * 500):
        assert parse_traceparent(bad) is None, bad


def test_a_run_without_a_stored_context_has_one_derived_from_its_thread_id() -> None:
    a, b = derived_anchor("run-1"), derived_anchor("run-1")
    assert (a.trace_id, a.span_id) == (b.trace_id, b.span_id)
    assert derived_anchor("run-2").trace_id != a.trace_id
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert anchor_of("run-1", tp).trace_id == 0x0af7651916cd43dd8448eb211c80319c
    assert anchor_of("run-1", None).trace_id == a.trace_id
    assert anchor_of("run-1", "garbage").trace_id == a.trace_id


def test_one_failure_taxonomy() -> None:
    assert categorize(ValueError()) is FailureCategory.EXCEPTION
    assert categorize(TimeoutError()) is FailureCategory.TIMEOUT
    assert categorize(NondeterminismError("x")) is FailureCategory.NONDETERMINISM
    assert categorize(SerializationError("x")) is FailureCategory.SERIALIZATION
    assert categorize(DefinitionError("x")) is FailureCategory.DEFINITION
    assert categorize(LeaseLost("x")) is FailureCategory.LEASE_LOST
    assert categorize(StoreUnavailable("x")) is FailureCategory.STORE_UNAVAILABLE
    assert FailureCategory.EXCEPTION not in FINAL_CATEGORIES
    assert FailureCategory.TIMEOUT not in FINAL_CATEGORIES
    assert FailureCategory.NONDETERMINISM in FINAL_CATEGORIES


def test_tracing_is_asked_for_by_otel_traces_exporter_only() -> None:
    assert not tracing_wanted({})
    assert not tracing_wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_wanted({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})
    assert tracing_wanted({"OTEL_TRACES_EXPORTER": "console"})


@pytest.mark.parametrize(("env", "named"), [
    ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "maybe"}, "OTEL_TRACES_SAMPLER"),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "traceidratio",
      "OTEL_TRACES_SAMPLER_ARG": "-1"}, "OTEL_TRACES_SAMPLER_ARG"),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_MAX_QUEUE_SIZE": "0"},
     "OTEL_BSP_MAX_QUEUE_SIZE"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
     "collector:4318"),
])
def test_bad_otel_settings_are_named(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        check_env(env)


def test_good_otel_settings_pass() -> None:
    assert check_env({"OTEL_TRACES_EXPORTER": "console,otlp", "OTEL_TRACES_SAMPLER":
                      "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5",
                      "OTEL_BSP_SCHEDULE_DELAY": "200"}) == ["console", "otlp"]
