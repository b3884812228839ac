"""`tether workers`: the worker registry (each worker's heartbeat row), and `tether workers
release WORKER_ID`, where an operator gives back a dead or stuck worker's leases at once
instead of waiting out their TTL."""

from __future__ import annotations

import time
from typing import Any

import click

from ._common import (
    cli_actor,
    connection_options,
    dump,
    json_option,
    on_runtime,
    plural,
    print_table,
    run,
    runtime_for,
)
from ._root import cli


@cli.group("workers", invoke_without_command=True,
           short_help="registered workers, and releasing a worker's leases",
           help="registered workers: version, agents, slots, last heartbeat (the default), "
                "and releasing a worker's leases")
@connection_options
@json_option
@click.pass_context
def workers(ctx: click.Context, db: str | None, app: str | None, verbose: bool,
            as_json: bool) -> int:
    if ctx.invoked_subcommand is not None:
        return 0

    def show(found: Any) -> None:
        if not found:
            print("no workers registered")
            return
        now = time.time()
        rows = [(w.id, w.version, "alive" if w.alive else "[red]dead[/]",
                 "; ".join(f"{a} ({', '.join(n)})" for a, n in w.agents.items()),
                 f"{w.busy}/{w.concurrency}", f"{now - w.started_at:.0f}s ago",
                 f"{now - w.last_seen:.1f}s ago") for w in found]
        # An id is what `tether workers release` takes and the logs name: never cut.
        print_table(
            [("id", "id"), ("version", "word"), ("state", "word"), ("agents", "text"),
             ("busy/slots", "word"), ("started", "word"), ("last seen", "word")], rows)

    return on_runtime(db, app, verbose, lambda rt: rt.workers(), as_json=as_json,
                      to_json=lambda found: [w.as_dict() for w in found], show=show)


@workers.command("release", short_help="give back every run and effect a worker leases now",
                  help="give back every run and effect a worker leases now (any worker "
                       "resumes them); the worker, if alive, is fenced out")
@click.argument("worker_id")
@connection_options
@json_option
def release(worker_id: str, db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        try:
            released = await rt.release_worker(worker_id, actor=cli_actor())
            known = released or any(w.id == worker_id for w in await rt.workers())
        finally:
            await rt.close()
        if as_json:
            dump({"worker": worker_id, "released": released})
        elif released:
            print(f"released {plural(len(released), 'run')} of {worker_id}: {' '.join(released)}")
        elif known:
            print(f"{worker_id} leases no run (its effects, if any, were released)")
        else:  # a typo, or a worker that stopped cleanly (it gave everything back itself)
            print(f"{worker_id} leases no run and is not a registered worker (`tether workers` "
                  "lists their ids)")
        return 0

    return run(main(), verbose)
