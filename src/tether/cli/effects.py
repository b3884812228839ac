"""`tether effects ...`: the outbox, list and retry side effects."""

from __future__ import annotations

from typing import Any

import click
import orjson

from ..errors import InvalidState
from ..runtime import Runtime
from ._common import (
    POSITIVE_INT,
    cli_actor,
    connection_options,
    dump,
    json_option,
    on_runtime,
    print_table,
    run,
    runtime_for,
)
from ._root import cli


@cli.group("effects", help="the outbox: list and retry side effects")
def effects() -> None:
    pass


@effects.command("list", help="effects in request order")
@click.option("--thread", "--thread-id", "thread", metavar="THREAD_ID", help="only this run's effects")
@click.option("--status", type=click.Choice(["pending", "running", "done", "dead"]),
              help="only effects in this status")
@click.option("--limit", type=POSITIVE_INT, default=100, show_default=True,
              help="at most this many effects")
@connection_options
@json_option
def list_(thread: str | None, status: str | None, limit: int, db: str | None, app: str | None,
          verbose: bool, as_json: bool) -> int:
    def show(found: Any) -> None:
        rows = [(e.thread_id, e.key, e.name, e.status, str(e.attempts), e.error or "",
                 "" if e.result is None else orjson.dumps(e.result).decode()[:60]) for e in found]
        print_table(
            [("thread_id", "id"), ("key", "id"), ("name", "word"), ("status", "word"),
             ("attempts", "word"), ("error", "text"), ("result", "text")], rows,
            optional=("error", "result"))

    async def act(rt: Runtime) -> Any:
        found = await rt.effects(thread, status=status, limit=limit)
        if thread is not None and not found:
            await rt.peek(thread)  # no such run: say so, not an empty table
        return found

    return on_runtime(db, app, verbose, act, as_json=as_json,
                      to_json=lambda found: [e.to_dict() for e in found], show=show)


@effects.command("retry", help="retry a dead effect now")
@click.argument("key")
@click.option("--thread", "--thread-id", "thread", metavar="THREAD_ID",
              help="the run, if the key is not unique across runs")
@connection_options
@json_option
def retry(key: str, thread: str | None, db: str | None, app: str | None, verbose: bool,
          as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        try:
            revived = await rt.retry_effect(key, thread, actor=cli_actor())
        finally:
            await rt.close()
        if not revived:
            raise InvalidState(f"no dead effect with key {key!r}")
        if as_json:
            dump([e.to_dict() for e in revived])
        else:
            print(f"effect {key} queued again ({len(revived)} row); a worker performs it next")
        return 0

    return run(main(), verbose)
