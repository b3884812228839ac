"""`tether workers`: the worker registry (each worker's heartbeat row)."""

from __future__ import annotations

import time

from ._common import connection_options, console, dump, json_option, run, runtime_for
from ._root import cli


@cli.command("workers", help="registered workers: version, agents, slots, last heartbeat")
@connection_options
@json_option
def workers(db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        try:
            found = await rt.workers()
        finally:
            await rt.close()
        if as_json:
            dump([w.as_dict() for w in found])
            return 0
        if not found:
            print("no workers registered")
            return 0
        from rich.table import Table

        now = time.time()
        table = Table("id", "version", "state", "agents", "busy/slots", "started", "last seen")
        for w in found:
            agents = "; ".join(f"{a} ({', '.join(n)})" for a, n in w.agents.items())
            table.add_row(w.id, w.version, "alive" if w.alive else "[red]dead[/]", agents,
                          f"{w.busy}/{w.concurrency}", f"{now - w.started_at:.0f}s ago",
                          f"{now - w.last_seen:.1f}s ago")
        console().print(table)
        return 0

    return run(main(), verbose)
