"""`tether worker`: a worker process until SIGTERM or SIGINT (then it finishes or gives back
the runs it holds, prints what it gave back, and exits 0). At start it prints the settings in
effect and where each came from (a flag, then TETHER_*, over the app's own: tether.config).
`--metrics-port` serves its Prometheus metrics on 127.0.0.1, `--log-format json` writes one
JSON line per finished or failed run, and the OpenTelemetry SDK is configured from the OTEL_*
variables when it is installed and OTEL_TRACES_EXPORTER is set."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Callable

import click

from ..config import redact, resolve_app
from ..errors import ConfigError
from ..retention import parse_age
from ..runtime import Runtime
from ..worker import Worker
from ._common import PORT, POSITIVE_FLOAT, POSITIVE_INT, connection_options, plural, run, runtime_for
from ._root import cli


@cli.command("worker", short_help="run a worker process (SIGTERM or Ctrl-C stops it cleanly)",
             help="run a worker process (SIGTERM or Ctrl-C: finish or give back the "
                  "runs it holds within TETHER_SHUTDOWN_GRACE seconds, then exit)")
@click.option("--concurrency", type=POSITIVE_INT, default=None,
              help="runs this worker drives at once (default $TETHER_CONCURRENCY, else "
                   "concurrency in [tool.tether], else 100)")
@click.option("--lease-ttl", type=POSITIVE_FLOAT, default=None,
              help="seconds a claim lasts without heartbeat (default $TETHER_LEASE_TTL, else "
                   "lease_ttl in [tool.tether], else the Runtime's, else 30)")
@click.option("--metrics-port", type=PORT, default=None,
              help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics "
                   "(the tether[metrics] extra)")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True,
              help="json: one JSON line per finished run and per failure, on stderr")
@click.option("--prune-every", metavar="DURATION", default=None,
              help="apply the app's retention policy (Runtime(retention=...)) this often, "
              "e.g. 1h")
@click.option("--cpu-workers", type=POSITIVE_INT, default=None,
              help="processes that run ctx.cpu_call (default $TETHER_CPU_WORKERS, else one per CPU)")
@connection_options
def worker(concurrency: int | None, lease_ttl: float | None, metrics_port: int | None,
           log_format: str, prune_every: str | None, cpu_workers: int | None, db: str | None,
           app: str | None,
           verbose: bool) -> int:
    async def main() -> int:
        from .. import observe

        rt = runtime_for(db, app, need_app=True, concurrency=concurrency, lease_ttl=lease_ttl,
                         cpu_workers=cpu_workers)
        if prune_every is not None:
            every = parse_age(prune_every, "--prune-every")
            if rt.retention is None or not every:
                raise ConfigError("--prune-every needs a retention policy in the app "
                                  "(tether.Runtime(..., retention={'completed': '30d'})) and "
                                  "an interval > 0; or run `tether prune` from cron")
            rt.retention = dataclasses.replace(rt.retention, every=every)
        stops: list[Callable[[], None]] = []
        # Everything asked for is set up before the first claim: a port in use or a bad
        # OTEL_* setting stops the worker here, with a message, instead of running blind.
        try:
            if metrics_port is not None:
                metrics = observe.enable_metrics(rt, "tether worker --metrics-port")
                stops.append(observe.serve_metrics(metrics, metrics_port))
            stops.extend(observe.enable_tracing_from_env(rt, "tether worker"))
            if log_format == "json":
                observe.enable_json_logs(rt)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            stopping: list[Worker] = []
            signals: list[int] = []

            def on_signal(sig: int) -> None:
                signals.append(sig)
                stopping.extend(w for w in rt.local_workers if w not in stopping)
                stop.set()

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, on_signal, sig)
            print(describe(rt, app, metrics_port), flush=True)
            try:
                await rt.work(stop=stop)
            finally:
                await rt.close()
            print(stopped_line(stopping, signals), flush=True)
        finally:
            for s in reversed(stops):
                s()
        return 0

    return run(main(), verbose)


def stopped_line(workers: list[Worker], signals: list[int]) -> str:
    """The worker's last line: why it stopped and what it left for others."""
    why = f" by {signal.Signals(signals[0]).name}" if signals else ""
    steps = sum(w.steps_committed for w in workers)
    back = sum(w.given_back for w in workers)
    effects = sum(w.effects_given_back for w in workers)
    held = sum(w.still_leased for w in workers)
    line = (f"tether worker: stopped{why} after {plural(steps, 'step')}; "
            f"{plural(back, 'run')} given back (any worker resumes them now), "
            f"{plural(effects, 'effect')} left pending for another worker")
    if held:
        line += (f"; {plural(held, 'run')} still leased (claimable again after the lease TTL, "
                 f"{workers[0].settings.lease_ttl:g}s)")
    return line


def describe(rt: Runtime, app_flag: str | None, metrics_port: int | None = None) -> str:
    """The worker's first lines: what it serves, then each setting and where it came from."""
    target, app_source = resolve_app(app_flag)
    s = rt.settings
    rows = [("app", str(target), app_source),
            ("db", redact(rt.db_url), s.source("db")),
            ("version", rt.version, "Runtime(...)"),
            ("agents", ",".join(rt.agents), "Runtime(...)"),
            ("concurrency", str(s.concurrency), s.source("concurrency")),
            ("lease_ttl", f"{s.lease_ttl:g}s", s.source("lease_ttl")),
            ("poll_interval", f"{s.poll_interval:g}s", s.source("poll_interval")),
            ("shutdown_grace", f"{s.shutdown_grace:g}s", s.source("shutdown_grace")),
            ("cpu_workers", str(s.cpu_workers or "one per CPU"), s.source("cpu_workers"))]
    metrics = f" metrics=http://127.0.0.1:{metrics_port}/metrics" if metrics_port is not None else ""
    prune = (f" prune_every={rt.retention.every:g}s"
             if rt.retention is not None and rt.retention.every else "")
    lines = [f"tether worker: {redact(rt.db_url)} version={rt.version} "
             f"agents={','.join(rt.agents)} concurrency={s.concurrency} "
             f"lease_ttl={s.lease_ttl:g}s{metrics}{prune}"]
    lines += [f"  {name:<15}{value:<40} ({source})" for name, value, source in rows]
    return "\n".join(lines)
