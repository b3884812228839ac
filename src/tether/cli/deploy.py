"""`tether deploy ...` (status, route, drain, retire) and `tether runs upgrade`: several
versions side by side, weights for new runs, draining and retiring a version, and moving
parked runs to another version."""

from __future__ import annotations

import asyncio
import time

import click

from ..deploy import OPEN, Deployment, at_least
from ..errors import ConfigError
from ..runtime import Runtime
from ._common import (
    POSITIVE_FLOAT,
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
from .runs import runs

# `deploy status --check` exits with this when a run is stranded (2 is an error of ours).
STRANDED = 1


@cli.group("deploy", help="versions side by side: status, route, drain, retire")
def deploy() -> None:
    pass


def _age(then: float | None, now: float) -> str:
    if then is None:
        return ""
    s = max(0.0, now - then)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit}"
    return f"{s:.0f}s"


def _open_runs(d: Deployment) -> str:
    """The open runs by status, the statuses that have some ("3 running, 10,000+ waiting":
    a count stops at the cap, deploy.COUNT_CAP)."""
    return ", ".join(f"{at_least(n, s in d.capped)} {s}" for s in OPEN
                     if (n := d.runs.get(s, 0))) or "0"


NO_ROUTING = "no routing set (runs go to the starting runtime's version)"


def _table(found: list[Deployment]) -> None:
    now = time.time()
    # Before any route a version's weight is not 0 (which would mean "no new runs"): the
    # table is unset and each runtime's starts go to its own version.
    routed = any(d.weight > 0 for d in found)
    rows = [(d.version, str(d.weight) if routed or d.state == "retired" else "-", d.state,
             str(d.workers), _open_runs(d), _age(d.oldest_open, now),
             f"[bold red]{at_least(d.stranded, 'stranded' in d.capped)}[/]" if d.stranded
             else "0")
            for d in found]
    # The open runs share one cell (it wraps), so the table fits 80 columns.
    print_table(
        [("version", "word"), ("weight", "word"), ("state", "word"), ("workers", "word"),
         ("open runs", "text"), ("oldest open", "word"), ("stranded", "word")], rows)
    if not routed:
        print(NO_ROUTING)


@deploy.command("status", help="per version: weight, state, live workers, open runs, stranded")
@click.option("--check", is_flag=True, help=f"exit {STRANDED} when a run is stranded")
@connection_options
@json_option
def status(check: bool, db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        try:
            found = await rt.deployments()
        finally:
            await rt.close()
        if as_json:
            dump([d.as_dict() for d in found])
        elif not found:
            print("no versions: no weights set, no open runs, no live workers")
        else:
            _table(found)
        stranded = sum(d.stranded for d in found)
        if stranded and not as_json:
            more = any("stranded" in d.capped for d in found)
            what = f"{at_least(stranded, True)} runs are" if more else (
                f"{plural(stranded, 'run')} {'is' if stranded == 1 else 'are'}")
            print(f"{what} stranded: "
                  "start a worker of their version, or move "
                  "the parked ones with `tether runs upgrade --from OLD --to NEW`")
        return STRANDED if check and stranded else 0

    return run(main(), verbose)


def _weights(pairs: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pair in pairs:
        version, sep, weight = pair.partition("=")
        if not sep or not version:
            raise ConfigError(f"expected VERSION=WEIGHT (e.g. v1=90), got {pair!r}")
        if version in out:
            raise ConfigError(f"version {version!r} is named twice")
        try:
            out[version] = int(weight)
        except ValueError:
            raise ConfigError(f"weight of {version!r} must be an integer, got {weight!r}") from None
    return out


@deploy.command("route", short_help="set the weights of new runs, e.g. v1=90 v2=10",
                help="set the weights of new runs, e.g. v1=90 v2=10 "
                     "(versions not named get 0)")
@click.argument("weights", nargs=-1, required=True, metavar="VERSION=WEIGHT...")
@connection_options
@json_option
def route(weights: tuple[str, ...], db: str | None, app: str | None, verbose: bool,
          as_json: bool) -> int:
    async def act(rt: Runtime) -> list[Deployment]:
        return await rt.route(_weights(weights), actor=cli_actor())

    return on_runtime(db, app, verbose, act, as_json=as_json, show=_table,
                      to_json=lambda found: [d.as_dict() for d in found])


@deploy.command("drain", short_help="weight 0 for a version: its open runs finish on it",
                help="weight 0 for a version: its open runs finish on it, no new one "
                     "lands on it")
@click.argument("version")
@click.option("--wait", "wait_", is_flag=True, help="show the runs left by status until drained")
@click.option("--timeout", type=POSITIVE_FLOAT, help="with --wait: give up (exit 1) after this")
@connection_options
@json_option
def drain(version: str, wait_: bool, timeout: float | None, db: str | None, app: str | None,
          verbose: bool, as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        try:
            d = await rt.drain(version, actor=cli_actor())
            began = time.monotonic()
            deadline = None if timeout is None else began + timeout
            shown: dict[str, int] | None = None
            while wait_ and d.state == "draining":
                if not as_json and d.runs != shown:  # a line when the count changes
                    shown = dict(d.runs)
                    left = _open_runs(d)
                    print(f"{version}: draining, {at_least(d.open, d.open_more)} open runs "
                          f"({left}) after "
                          f"{time.monotonic() - began:.0f}s", flush=True)
                if deadline is not None and time.monotonic() >= deadline:
                    if not as_json:
                        print(f"{version}: not drained after {timeout}s", flush=True)
                    else:
                        dump(d.as_dict())
                    return 1
                await asyncio.sleep(1.0)
                d = next((x for x in await rt.deployments() if x.version == version), d)
        finally:
            await rt.close()
        if as_json:
            dump(d.as_dict())
        else:
            print(f"{version}: {d.state}, {at_least(d.open, d.open_more)} open runs"
                  + ("; retire it with `tether deploy retire " + version + "`"
                     if d.state == "drained" else ""))
        return 0

    return run(main(), verbose)


@deploy.command("retire", help="retire a drained version (refused while it has open runs)")
@click.argument("version")
@connection_options
@json_option
def retire(version: str, db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    return on_runtime(db, app, verbose, lambda rt: rt.retire(version, actor=cli_actor()),
                      as_json=as_json, to_json=lambda d: d.as_dict(),
                      show=lambda d: print(f"{version}: retired"))


@runs.command("upgrade", short_help="move parked runs to another version, all or nothing",
               help="move parked runs (queued, waiting, sleeping) to another version, "
                    "checked first; all or nothing")
@click.option("--from", "from_", required=True, metavar="VERSION", help="the version they are on")
@click.option("--to", "to", required=True, metavar="VERSION", help="the version to move them to")
@click.option("--thread", "threads", multiple=True, metavar="THREAD_ID",
              help="only this run (repeatable; default: every parked run of --from)")
@click.option("--dry-run", is_flag=True, help="show the plan, move nothing")
@click.option("--skip-refused", is_flag=True,
              help="move the runs that pass the check even if others are refused")
@connection_options
@json_option
def upgrade(from_: str, to: str, threads: tuple[str, ...], dry_run: bool, skip_refused: bool,
            db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        try:
            up = await rt.upgrade(from_, to, thread_ids=list(threads) or None, dry_run=dry_run,
                                  skip_refused=skip_refused, actor=cli_actor())
        finally:
            await rt.close()
        if as_json:
            dump(up.as_dict())
            return 0 if up.applied or dry_run or not up.refused else 1
        for t in up.planned:
            print(f"{'would move' if not up.applied else 'moved'} {t} to {to}")
        for t, why in up.refused:
            print(f"refused {t}: {why}")
        if up.applied:
            print(f"{plural(len(up.moved), 'run')} moved from {from_} to {to}")
        elif dry_run:
            print(f"dry run: {len(up.planned)} would move, {len(up.refused)} refused")
        elif up.refused:
            print(f"nothing moved: {plural(len(up.refused), 'run')} refused (name the others with "
                  "--thread, or pass --skip-refused)")
            return 1
        else:
            print(f"no parked run of {from_} to move")
        return 0

    return run(main(), verbose)
