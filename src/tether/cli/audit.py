"""`tether audit`: the audit log of operator actions, newest first."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click
import orjson

from ..runtime import Runtime
from ..store.base import AUDIT_ACTIONS
from ._common import (
    POSITIVE_INT,
    connection_options,
    json_option,
    on_runtime,
    print_table,
)
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
    def show(events: Any) -> None:
        rows = [(str(e.id), dt.datetime.fromtimestamp(e.at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
                 e.actor, e.action, e.thread_id or "", e.target or "",
                 orjson.dumps(e.details).decode()) for e in events]
        print_table(
            [("id", "word"), ("time (UTC)", "word"), ("actor", "word"), ("action", "word"),
             ("thread_id", "word"), ("target", "word"), ("details", "text")], rows,
            optional=("thread_id", "target"))

    async def act(rt: Runtime) -> Any:
        return await rt.audit(thread_id=thread, action=action, limit=limit, before=before)

    return on_runtime(db, app, verbose, act, as_json=as_json,
                      to_json=lambda events: [e.to_dict() for e in events], show=show)
