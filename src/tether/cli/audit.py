"""`tether audit`: the audit log of operator actions, newest first."""

from __future__ import annotations

import datetime as dt

import click
import orjson

from ..store.base import AUDIT_ACTIONS
from ._common import POSITIVE_INT, connection_options, console, dump, json_option, run, runtime_for
from ._root import cli


@cli.command("audit", help="operator actions (start, resume, cancel, ...), newest first")
@click.option("--thread", metavar="THREAD_ID", help="only actions on this run")
@click.option("--action", type=click.Choice(AUDIT_ACTIONS), help="only this action")
@click.option("--limit", type=POSITIVE_INT, default=100, show_default=True,
              help="at most this many actions")
@click.option("--before", type=POSITIVE_INT, default=None,
              help="only actions older than this id (the next page)")
@connection_options
@json_option
def audit(thread: str | None, action: str | None, limit: int, before: int | None,
          db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        try:
            events = await rt.audit(thread_id=thread, action=action, limit=limit, before=before)
        finally:
            await rt.close()
        if as_json:
            dump([e.to_dict() for e in events])
            return 0
        from rich.table import Table

        table = Table("id", "time (UTC)", "actor", "action", "thread_id", "target", "details")
        for e in events:
            when = dt.datetime.fromtimestamp(e.at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            table.add_row(str(e.id), when, e.actor, e.action, e.thread_id or "", e.target or "",
                          orjson.dumps(e.details).decode())
        console().print(table)
        return 0

    return run(main(), verbose)
