"""What observability costs a worker, in one run: W2 with nothing attached, with the Prometheus
metrics, and with OpenTelemetry tracing (the SDK, its batch processor exporting to a no-op),
each variant in a fresh process, the order rotating from round to round so that the machine's
drift falls on all three alike (as bench/pairs.py does for two checkouts).

    python -m bench.observe                       # W2 sqlite 10000, 5 rounds
    python -m bench.observe --rounds 3 --runs 1000 --backend postgres

The figure is the worker's CPU time over the measured part (W2's cpu_s: process time, every
thread, so the batch processor's export thread counts), median per variant, and its ratio to
"off". Variants (`--variants`): off, metrics, tracing (the SDK's default sampler: every run),
always_off (OTEL_TRACES_SAMPLER=always_off: tracing on, no run sampled), ratio_0.1
(parentbased_traceidratio at 0.1), detail_step and detail_run (TETHER_TRACE_DETAIL). Goals:
metrics at most 1.05x, always_off at most 1.02x, ratio_0.1 at most 1.10x, and with every run
traced tether's own share at most 10% of what the SDK alone takes for the same spans.

`sdk_floor` is what the OpenTelemetry SDK itself costs for the same spans, with no tether
around them: a fresh process making, per run, the 11 spans a W2 run has (tether.run, 5
tether.step, 5 tether.call) with the same attributes, parents and explicit times, through
`tracer.start_span` / `end` on the same provider and processor. Its CPU over "off"'s is the
least tracing through the SDK's Tracer can add. `readable_floor` is the same spans built as
finished ReadableSpans and handed to the same processor (what the SDK's Tracer does around
that is the difference): the least any tracing that reaches the exporter can add.

Tracing's row also checks the spans that reached the exporter (none dropped by a full queue:
a dropped span would pass for a cheap one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.pairs import metrics_of

HERE = Path(__file__).resolve().parent.parent
_TRACING = {"TETHER_BENCH_OBSERVE": "tracing"}
VARIANTS: dict[str, dict[str, str]] = {
    "off": {},
    "metrics": {"TETHER_BENCH_OBSERVE": "metrics"},
    # The SDK's default sampler (parentbased_always_on): every run traced.
    "tracing": _TRACING,
    "always_off": {**_TRACING, "OTEL_TRACES_SAMPLER": "always_off"},
    "ratio_0.1": {**_TRACING, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                  "OTEL_TRACES_SAMPLER_ARG": "0.1"},
    "detail_step": {**_TRACING, "TETHER_TRACE_DETAIL": "step"},
    "detail_run": {**_TRACING, "TETHER_TRACE_DETAIL": "run"},
    # Diagnostics of always_off's cost: the SDK set up with nothing traced; an observer that
    # hears nothing and stores no trace context.
    "sdk_only": {"TETHER_BENCH_OBSERVE": "tracing,sdk_only"},
    "null_observer": {"TETHER_BENCH_OBSERVE": "null_observer"},
}
"""Each variant's environment for the W2 process (tracing on an SDK provider whose sampler
and tether's detail come from OTEL_TRACES_SAMPLER and TETHER_TRACE_DETAIL)."""
DEFAULT = ("off", "metrics", "tracing", "always_off", "ratio_0.1", "detail_run")
GOALS = {"metrics": 1.05, "always_off": 1.02, "ratio_0.1": 1.10}
SPANS_PER_RUN = {"tracing": 11, "detail_step": 6, "detail_run": 2}


def run_variant(variant: str, backend: str, runs: int) -> dict[str, float]:
    """One W2 in a fresh process with `variant` attached (a name of VARIANTS, or "tracing@R":
    tracing with the SDK's traceidratio sampler at ratio R): its result metrics."""
    observe, _, ratio = variant.partition("@")
    env = {**os.environ, "TETHER_BENCH_W2_FLOOR": "0", "TETHER_BENCH_OBSERVE": "",
           **VARIANTS[observe]}
    if ratio:
        env.update(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG=ratio)
    out = subprocess.run([sys.executable, "-m", "bench.workloads", "W2", backend, str(runs)],
                         cwd=HERE, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"W2 with {variant} failed:\n{out.stderr[-2000:]}")
    return metrics_of(out.stdout, unsized=True)


def run_floor(runs: int, mode: str) -> float:
    out = subprocess.run([sys.executable, "-m", "bench.observe", "--floor-child", mode,
                          str(runs)], cwd=HERE, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the SDK floor failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def sdk_floor(runs: int, mode: str = "tracer") -> float:
    """CPU seconds the SDK takes to make and export (to nowhere) W2's spans for `runs` runs:
    through its Tracer (`mode` "tracer") or as finished ReadableSpans ("readable")."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


    exported = []

    class Nowhere(SpanExporter):
        def export(self, spans: Sequence[object]) -> SpanExportResult:
            exported.append(len(spans))
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    # A queue that holds them all: a tight loop outruns the export thread, and a dropped
    # span would pass for a cheap one.
    provider.add_span_processor(BatchSpanProcessor(Nowhere(), max_queue_size=runs * 11))
    tracer = provider.get_tracer("tether")
    now = time.time_ns()
    cpu = (readable_floor if mode == "readable" else tracer_floor)(runs, tracer, now)
    provider.shutdown()
    if sum(exported) != runs * 11:
        raise SystemExit(f"{mode} floor: {sum(exported)} spans exported of {runs * 11}")
    return cpu


def readable_floor(runs: int, tracer: Any, now: int) -> float:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

    from tether.observe.tracing import derived_anchor

    gen, processor, resource = tracer.id_generator, tracer.span_processor, tracer.resource
    scope, unset, kind = tracer._instrumentation_scope, Status(StatusCode.UNSET), SpanKind.INTERNAL

    def end(name: str, parent: Any, attributes: dict[str, Any]) -> Any:
        context = SpanContext(parent.trace_id, gen.generate_span_id(), False, parent.trace_flags)
        processor.on_end(ReadableSpan(
            name=name, context=context, parent=parent, resource=resource, attributes=attributes,
            events=(), links=(), kind=kind, status=unset, start_time=now, end_time=now,
            instrumentation_scope=scope))
        return context

    cpu0 = time.process_time()
    for i in range(runs):
        tid = f"w2-{i:05d}"
        anchor = end("tether.run", derived_anchor(tid), {
            "tether.thread_id": tid, "tether.agent": "bench_w2", "tether.version": "bench"})
        for step in range(1, 6):
            span = end("tether.step", anchor, {
                "tether.thread_id": tid, "tether.agent": "bench_w2", "tether.version": "bench",
                "tether.worker": "w", "tether.step": step, "tether.node": "w2_step",
                "tether.attempt": 1, "tether.status": "running"})
            end("tether.call", span, {"tether.thread_id": tid, "tether.step": step,
                                      "tether.call": "bench.simulated_llm"})
    return time.process_time() - cpu0


def tracer_floor(runs: int, tracer: Any, now: int) -> float:
    from opentelemetry.trace import NonRecordingSpan, set_span_in_context

    from tether.observe.tracing import derived_anchor

    cpu0 = time.process_time()
    for i in range(runs):
        tid = f"w2-{i:05d}"
        base = {"tether.thread_id": tid, "tether.agent": "bench_w2", "tether.version": "bench"}
        caller = set_span_in_context(NonRecordingSpan(derived_anchor(tid)))
        anchor = tracer.start_span("tether.run", context=caller, attributes=base,
                                   start_time=now)
        anchor.end(end_time=now)
        parent = set_span_in_context(anchor)
        for step in range(1, 6):
            span = tracer.start_span(
                "tether.step", context=parent, start_time=now,
                attributes={**base, "tether.worker": "w", "tether.step": step,
                            "tether.node": "w2_step", "tether.attempt": 1,
                            "tether.status": "running"})
            call = tracer.start_span(
                "tether.call", context=set_span_in_context(span), start_time=now,
                attributes={"tether.thread_id": tid, "tether.step": step,
                            "tether.call": "bench.simulated_llm"})
            call.end(end_time=now)
            span.end(end_time=now)
    return time.process_time() - cpu0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.observe")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--no-floor", action="store_true", help="skip the SDK floor")
    parser.add_argument("--sampled", type=float, metavar="RATIO",
                        help="also trace with the traceidratio sampler at RATIO (0..1)")
    parser.add_argument("--variants", default=",".join(DEFAULT),
                        help=f"comma-separated, of {', '.join(VARIANTS)} (default: "
                             f"{','.join(DEFAULT)})")
    parser.add_argument("--floor-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_child is not None:
        mode, runs = args.floor_child
        print(sdk_floor(int(runs), mode))
        return 0
    if args.rounds < 1 or args.runs < 1:
        parser.error("--rounds and --runs must be at least 1")
    if args.sampled is not None and not 0.0 <= args.sampled <= 1.0:
        parser.error("--sampled takes a ratio within 0..1")
    chosen = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown or "off" not in chosen:
        parser.error(f"--variants: {', '.join(unknown) or 'off is the reference and must be '}"
                     f"{' unknown' if unknown else 'listed'}; known: {', '.join(VARIANTS)}")
    variants = chosen + ((f"tracing@{args.sampled:g}",) if args.sampled is not None else ())
    load0 = os.getloadavg()
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    floors: dict[str, list[float]] = {"tracer": [], "readable": []}
    for i in range(args.rounds):
        k = i % len(variants)
        order = variants[k:] + variants[:k]
        for variant in order:
            m = run_variant(variant, args.backend, args.runs)
            rows[variant].append(m)
            spans = f" spans_exported={m['spans_exported']:g}" if "spans_exported" in m else ""
            print(f"round {i + 1} {variant:8} cpu_s={m['cpu_s']:g} wall_s={m['wall_s']:g} "
                  f"cpu_us_per_step={m['cpu_us_per_step']:g}{spans} "
                  f"load={os.getloadavg()[0]:.2f}", flush=True)
        if not args.no_floor:
            for mode, got in floors.items():
                got.append(run_floor(args.runs, mode))
                print(f"round {i + 1} {mode}_floor cpu_s={got[-1]:.3f}", flush=True)
    load1 = os.getloadavg()
    off = statistics.median(m["cpu_s"] for m in rows["off"])
    print(f"\nW2 {args.backend} {args.runs}, medians of {args.rounds} rounds "
          f"(load average {load0[0]:.2f} at start, {load1[0]:.2f} at end, {os.cpu_count()} CPUs)")
    print("| variant | worker CPU s | CPU us/step | wall s | CPU vs off | per-round ratios "
          "(median) | goal |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for variant in variants:
        cpu = statistics.median(m["cpu_s"] for m in rows[variant])
        per = statistics.median(m["cpu_us_per_step"] for m in rows[variant])
        wall = statistics.median(m["wall_s"] for m in rows[variant])
        goal = GOALS.get(variant.partition("@")[0]) if "@" not in variant else None
        # Each round's variants ran back to back: their ratio to that round's "off" sees
        # the same machine, so it is the steadier figure on a loaded one.
        paired = [m["cpu_s"] / o["cpu_s"] for m, o in zip(rows[variant], rows["off"],
                                                          strict=True)]
        listed = ", ".join(f"{r:.3f}" for r in paired)
        print(f"| {variant} | {cpu:.3f} | {per:.1f} | {wall:.3f} | {cpu / off:.3f}x | "
              f"{listed} ({statistics.median(paired):.3f}x) | "
              f"{'-' if goal is None else f'<= {goal:.2f}x'} |")
    names = {"tracer": "sdk_floor: the same spans through the SDK's Tracer, no tether",
             "readable": "readable_floor: the same spans as finished ReadableSpans"}
    for mode, got in floors.items():
        if got:
            floor = statistics.median(got)
            print(f"| {names[mode]} | {floor:.3f} | | | +{floor / off:.3f} of off | | |")
    if "tracing" in rows and floors["tracer"]:
        # Every run traced: what tether adds to what the SDK takes for the same spans, round
        # by round (each round's off, tracing and floor ran back to back).
        shares = [(t["cpu_s"] - o["cpu_s"] - f) / f for t, o, f in
                  zip(rows["tracing"], rows["off"], floors["tracer"], strict=True)]
        print(f"| tether's own share of tracing every run (tracing - off - sdk_floor, over "
              f"sdk_floor) | | | | {statistics.median(shares):+.1%} | "
              f"{', '.join(f'{x:+.1%}' for x in shares)} | <= 10% |")
    for variant in variants:
        if "spans_exported" not in rows[variant][0]:
            continue
        made = sorted({int(m["spans_exported"]) for m in rows[variant]})
        per = SPANS_PER_RUN.get(variant)
        print(f"spans exported per {variant} run: {made}"
              + (f" (every run traced makes {args.runs * per})" if per else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
