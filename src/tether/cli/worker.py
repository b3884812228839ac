"""`tether worker`: a worker process until SIGTERM or SIGINT (then it finishes or gives back
the runs it holds, and exits 0). `--metrics-port` serves its Prometheus metrics on 127.0.0.1,
`--log-format json` writes one JSON line per finished or failed run, and the OpenTelemetry SDK
is configured from the OTEL_* variables when it is installed and OTEL_TRACES_EXPORTER is set."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Callable

import click

from ..config import redact
from ..errors import ConfigError
from ..retention import parse_age
from ._common import PORT, POSITIVE_FLOAT, POSITIVE_INT, connection_options, run, runtime_for
from ._root import cli


@cli.command("worker", help="run a worker process")
@click.option("--concurrency", type=POSITIVE_INT, default=100, show_default=True,
              help="runs this worker drives at once")
@click.option("--lease-ttl", type=POSITIVE_FLOAT, default=None,
              help="seconds a claim lasts without heartbeat (default $TETHER_LEASE_TTL or 30)")
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
def worker(concurrency: int, lease_ttl: float | None, metrics_port: int | None,
           log_format: str, prune_every: str | None, cpu_workers: int | None, db: str | None,
           app: str | None,
           verbose: bool) -> int:
    async def main() -> int:
        from .. import observe

        rt = runtime_for(db, app, need_app=True)
        if lease_ttl is not None:
            rt = rt.with_db(rt.db_url, lease_ttl=lease_ttl)
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
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            print(f"tether worker: {redact(rt.db_url)} version={rt.version} "
                  f"agents={','.join(rt.agents)} concurrency={concurrency} "
                  f"lease_ttl={rt.settings.lease_ttl}s"
                  + (f" metrics=http://127.0.0.1:{metrics_port}/metrics"
                     if metrics_port is not None else "")
                  + (f" prune_every={rt.retention.every:g}s"
                     if rt.retention is not None and rt.retention.every else ""), flush=True)
            try:
                await rt.work(concurrency=concurrency, stop=stop, tune=True,
                              cpu_workers=cpu_workers)
            finally:
                await rt.close()
        finally:
            for s in reversed(stops):
                s()
        return 0

    return run(main(), verbose)
