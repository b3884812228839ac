"""`tether audit`: the audit log of operator actions, newest first."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

from ..runtime import Runtime
from ..store.base import AUDIT_ACTIONS
from ..types import AuditEvent
from ._common import (
    POSITIVE_INT,
    connection_options,
    json_option,
    on_runtime,
    print_table,
    spaced_json,
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
    async def act(rt: Runtime) -> Any:
        return await rt.audit(thread_id=thread, action=action, limit=limit, before=before)

    return on_runtime(db, app, verbose, act, as_json=as_json,
                      to_json=lambda events: [e.to_dict() for e in events], show=_print_events)


def _print_events(events: list[AuditEvent]) -> None:
    """One row per action; in a narrow terminal, one record per action titled "#id action"."""
    rows = [(str(e.id), dt.datetime.fromtimestamp(e.at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
             e.actor, e.action, e.thread_id or "", e.target or "", _details(e.details))
            for e in events]
    print_table(
        [("id", "word"), ("time (UTC)", "word"), ("actor", "word"), ("action", "word"),
         ("thread_id", "word"), ("target", "word"), ("details", "words")], rows,
        optional=("thread_id", "target", "details"), title="#{id} {action}")


def _details(details: dict[str, Any]) -> str:
    """An action's details as `key=value` pairs, one a line, so that a narrow terminal wraps
    between pairs (and inside a value only at its spaces), never inside a token: a string
    value bare, any other as JSON."""
    from rich.markup import escape

    return "\n".join(f"{escape(key)}={escape(v) if isinstance(v, str) else spaced_json(v)}"
                     for key, v in details.items())
