"""`tether worker`: a worker process until SIGTERM or SIGINT (then it finishes or gives back
the runs it holds, and exits 0)."""

from __future__ import annotations

import asyncio
import signal

import click

from ..config import redact
from ._common import POSITIVE_FLOAT, POSITIVE_INT, connection_options, run, runtime_for
from ._root import cli


@cli.command("worker", help="run a worker process")
@click.option("--concurrency", type=POSITIVE_INT, default=100, show_default=True,
              help="runs this worker drives at once")
@click.option("--lease-ttl", type=POSITIVE_FLOAT, default=None,
              help="seconds a claim lasts without heartbeat (default $TETHER_LEASE_TTL or 30)")
@connection_options
def worker(concurrency: int, lease_ttl: float | None, db: str | None, app: str | None,
           verbose: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app, need_app=True)
        if lease_ttl is not None:
            rt = rt.with_db(rt.db_url, lease_ttl=lease_ttl)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"tether worker: {redact(rt.db_url)} version={rt.version} "
              f"agents={','.join(rt.agents)} concurrency={concurrency} "
              f"lease_ttl={rt.settings.lease_ttl}s", flush=True)
        try:
            await rt.work(concurrency=concurrency, stop=stop, tune=True)
        finally:
            await rt.close()
        return 0

    return run(main(), verbose)
