"""`tether prune`: remove finished runs past their age, compact long logs (docs/retention.md).

SIGINT (Ctrl-C) or SIGTERM stops it after the batch under way (each batch is bounded in runs
and time): it prints what it removed so far and exits 130 (SIGINT) or 143 (SIGTERM); the next
prune finishes the job. A second signal stops it at once (the batch under way rolls back).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..retention import Report
from ._common import (
    POSITIVE_INT,
    cli_actor,
    connection_options,
    console,
    dump,
    json_option,
    plural,
    run,
    runtime_for,
)
from ._root import cli


@cli.command("prune", short_help="remove terminal runs older than their status's age",
             help="remove terminal runs older than their status's age (from when "
                  "they finished), with their checkpoints, journal, effects and mail")
@click.option("--completed", metavar="AGE", help="remove completed runs finished longer ago "
              "than this (e.g. 30d, 12h, 0s)")
@click.option("--failed", metavar="AGE", help="the same for failed runs")
@click.option("--cancelled", metavar="AGE", help="the same for cancelled runs")
@click.option("--agent", metavar="NAME", help="only runs of this agent")
@click.option("--keep-steps", type=POSITIVE_INT, default=None, metavar="N",
              help="also compact every run's log to its last N checkpoints (a snapshot first)")
@click.option("--keep-interrupts", is_flag=True,
              help="with --keep-steps: keep the checkpoints a fork needs at interrupts")
@click.option("--dry-run", is_flag=True, help="show what would go (counts, bytes); change nothing")
@connection_options
@json_option
def prune_cmd(completed: str | None, failed: str | None, cancelled: str | None,
              agent: str | None, keep_steps: int | None, keep_interrupts: bool, dry_run: bool,
              db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    async def pruned(caught: _Caught) -> int:
        rt = runtime_for(db, app)
        try:
            await rt.open()
            before = None if dry_run else await _db_bytes(rt)
            with _Progress(enabled=not as_json and not dry_run) as progress:
                report = await rt.prune(
                    completed=completed, failed=failed, cancelled=cancelled, agent=agent,
                    keep_steps=keep_steps, keep_interrupts=keep_interrupts, dry_run=dry_run,
                    progress=progress.update, actor=cli_actor(), stop=caught.stop)
            if not dry_run:
                report.db_bytes_before, report.db_bytes_after = before, await _db_bytes(rt)
        finally:
            await rt.close()
        if as_json:
            dump(report.to_dict())
        else:
            _print(report)
        if report.stopped and caught.signals:
            print(f"tether: stopped by {_name(caught.signals[0])} after {plural(report.runs, 'run')}; "
                  "run it again to finish the job", file=sys.stderr)
            return 128 + caught.signals[0]
        return 0

    async def main() -> int:
        with _signals(cancel_at=1 if dry_run else 2) as caught:
            try:
                return await pruned(caught)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not caught.signals or task is None or task.uncancel():
                    raise  # not (only) our own cancel
                print(f"tether: stopped at once by {_name(caught.signals[-1])} (a batch under "
                      "way rolls back whole; run it again to finish the job)", file=sys.stderr)
                return 128 + caught.signals[0]

    return run(main(), verbose)


class _Caught:
    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.signals: list[int] = []


@contextmanager
def _signals(cancel_at: int) -> Iterator[_Caught]:
    """SIGINT and SIGTERM set `stop` (the prune ends after its batch); the `cancel_at`-th
    signal cancels the command's task (a dry run's one query has nothing to finish)."""
    caught = _Caught()
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    sigs = (signal.SIGINT, signal.SIGTERM)

    def on_signal(sig: int) -> None:
        caught.signals.append(sig)
        caught.stop.set()
        if len(caught.signals) == cancel_at and task is not None:
            task.cancel()

    for sig in sigs:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield caught
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


def _name(sig: int) -> str:
    return signal.Signals(sig).name


async def _db_bytes(rt: Any) -> int:
    return int((await rt.store.measure(1.0)).db_bytes)


class _Progress:
    """Runs removed so far, on one live line (rich), while a prune runs."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._live: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.live import Live

            self._live = Live("pruning...", console=console(), transient=True)
            self._live.__enter__()
        return self

    def update(self, report: Report) -> None:
        if self._live is not None:
            rate = report.rows / report.seconds if report.seconds else 0
            self._live.update(f"pruned {plural(report.runs, 'run')}, {plural(report.rows, 'row')} "
                              f"({rate:,.0f} rows/s); compacted {plural(report.compacted_runs, 'run')}")

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)


def _print(report: Report) -> None:
    from rich.table import Table

    c = console()
    verb = "would remove" if report.dry_run else "removed"
    c.print(f"{verb} {plural(report.runs, 'run')}"
            + (f" ({report.bytes:,} bytes of payloads)" if report.dry_run else
               f" and {plural(report.rows, 'row')} in {report.seconds:.1f} s")
            + (f"; {'would compact' if report.dry_run else 'compacted'} "
               f"{plural(report.compacted_runs, 'run')} ({plural(report.compacted_rows, 'row')})"
               if report.compacted_runs else ""))
    if report.by:
        table = Table("status", "agent", "runs")
        for (status, agent), n in sorted(report.by.items()):
            table.add_row(status, agent, f"{n:,}")
        c.print(table)
    if report.db_bytes_before is not None and report.db_bytes_after is not None:
        c.print(f"database: {report.db_bytes_before:,} -> {report.db_bytes_after:,} bytes"
                + (f" ({report.freed_bytes:,} given back to the file system)"
                   if report.freed_bytes else ""))
    if report.vacuum_needed:
        c.print(f"{report.free_bytes or 0:,} bytes are free inside the file (reused by new "
                "rows): it was made without incremental auto-vacuum; one VACUUM converts it "
                "(docs/retention.md)")
