"""The `tether` command. Every read command takes --json; --db defaults to $TETHER_DB, then
sqlite:///tether.db; --app module:attr names the user's tether.Runtime."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import orjson

from .config import default_db, redact
from .errors import AppImportError, ConfigError, TetherError
from .runtime import Checkpoint, Run, Runtime

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def load_app(target: str) -> Runtime:
    """Import `module:attr` (attr a Runtime, or a zero-argument callable returning one)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise AppImportError(f"--app must look like module:attribute, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppImportError(f"cannot import module {module_name!r} for --app: {exc!r}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AppImportError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Runtime):
        obj = obj()
    if not isinstance(obj, Runtime):
        raise AppImportError(f"{target} is a {type(obj).__name__}, not a tether.Runtime")
    return obj


def _runtime(args: argparse.Namespace, need_app: bool = False) -> Runtime:
    db = args.db or default_db()
    if args.app:
        rt = load_app(args.app)
        if args.db or rt.db_url != db:
            rt = rt.with_db(db if args.db else rt.db_url)
        return rt
    if need_app:
        raise ConfigError("this command needs --app module:attr naming your tether.Runtime")
    return Runtime(db)


def _dump(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")


def _console() -> Any:
    from rich.console import Console

    return Console()


# -- commands ---------------------------------------------------------------------------------


async def cmd_migrate(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    applied = await rt.migrate()
    await rt.store.open(check_schema=False)
    try:
        current, latest = await rt.store.schema_version()
    finally:
        await rt.store.close()
    if args.json:
        _dump({"applied": applied, "version": current, "latest": latest})
    elif applied:
        print(f"applied migrations {applied} to {redact(rt.db_url)}; schema at version {current}")
    else:
        print(f"schema at {redact(rt.db_url)} is up to date (version {current})")
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    rt = _runtime(args, need_app=True)
    if args.lease_ttl is not None:
        rt = rt.with_db(rt.db_url, lease_ttl=args.lease_ttl)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"tether worker: {redact(rt.db_url)} version={rt.version} "
          f"agents={','.join(rt.agents)} concurrency={args.concurrency} "
          f"lease_ttl={rt.settings.lease_ttl}s", flush=True)
    try:
        await rt.work(concurrency=args.concurrency, stop=stop)
    finally:
        await rt.close()
    return 0


async def cmd_runs_start(args: argparse.Namespace) -> int:
    rt = _runtime(args, need_app=True)
    try:
        data = orjson.loads(args.input) if args.input else {}
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"--input is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("--input must be a JSON object")
    try:
        run = await rt.start(args.agent, data, thread_id=args.thread_id,
                             idempotency_key=args.idempotency_key)
        if args.wait:
            run = await rt.wait(run.thread_id, timeout=args.wait)
    finally:
        await rt.close()
    if args.json:
        _dump(run.to_dict())
    else:
        print(f"{run.thread_id} {run.status.value}")
    return 0


async def cmd_runs_list(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    try:
        runs = await rt.list_runs(status=args.status, agent=args.agent, limit=args.limit)
    finally:
        await rt.close()
    if args.json:
        _dump([{k: v for k, v in r.to_dict().items() if k != "state"} for r in runs])
        return 0
    from rich.table import Table

    table = Table("thread_id", "agent", "status", "step", "node", "version", "attempt", "error")
    for r in runs:
        table.add_row(r.thread_id, r.agent, r.status.value, str(r.step), r.node or "",
                      r.version, str(r.attempt), str(r.error or ""))
    _console().print(table)
    return 0


async def cmd_runs_show(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    try:
        run = await rt.get(args.thread_id)
    finally:
        await rt.close()
    if args.json:
        _dump(run.to_dict())
        return 0
    _print_run(run)
    return 0


def _print_run(run: Run) -> None:
    con = _console()
    con.print(f"[bold]{run.thread_id}[/bold]  agent={run.agent} status={run.status.value} "
              f"step={run.step} node={run.node} version={run.version} attempt={run.attempt}")
    if run.error:
        con.print(f"[red]error:[/red] {run.error}")
        con.print(run.error.traceback, markup=False, highlight=False)
    con.print_json(orjson.dumps(run.state).decode())


async def cmd_checkpoints(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    try:
        cps = await rt.checkpoints(args.thread_id)
    finally:
        await rt.close()
    if args.json:
        _dump([_cp_dict(cp, args.state) for cp in cps])
        return 0
    from rich.table import Table

    table = Table("step", "node", "next", "kind", "worker", "attempt", "ms", "state keys")
    for cp in cps:
        table.add_row(str(cp.step), cp.node, cp.next_node or "-", cp.kind, cp.worker,
                      str(cp.attempt), f"{cp.duration * 1000:.1f}", ",".join(cp.state))
    _console().print(table)
    return 0


def _cp_dict(cp: Checkpoint, with_state: bool) -> dict[str, Any]:
    d = cp.to_dict()
    if not with_state:
        d.pop("state")
    return d


# -- parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", help="database URL (default: $TETHER_DB, else sqlite:///tether.db)")
    common.add_argument("--app", help="module:attr of your tether.Runtime")
    common.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    read = argparse.ArgumentParser(add_help=False)
    read.add_argument("--json", action="store_true", help="print JSON")

    p = argparse.ArgumentParser(prog="tether", description="durable execution for agents")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("migrate", parents=[common, read], help="apply schema migrations")
    s.set_defaults(handler=cmd_migrate)

    s = sub.add_parser("worker", parents=[common], help="run a worker process")
    s.add_argument("--concurrency", type=_positive_int, default=100)
    s.add_argument("--lease-ttl", type=_positive_float, default=None,
                   help="seconds a claim lasts without heartbeat (default $TETHER_LEASE_TTL or 30)")
    s.set_defaults(handler=cmd_worker)

    runs = sub.add_parser("runs", help="start, list and inspect runs")
    rsub = runs.add_subparsers(dest="runs_command", required=True, metavar="SUBCOMMAND")
    s = rsub.add_parser("start", parents=[common, read], help="start a run")
    s.add_argument("agent")
    s.add_argument("--input", help="JSON object: the run's initial state")
    s.add_argument("--thread-id")
    s.add_argument("--idempotency-key")
    s.add_argument("--wait", type=_positive_float, metavar="SECONDS",
                   help="wait for the run to finish (needs a worker running)")
    s.set_defaults(handler=cmd_runs_start)
    s = rsub.add_parser("list", parents=[common, read], help="list runs, newest first")
    s.add_argument("--status")
    s.add_argument("--agent")
    s.add_argument("--limit", type=_positive_int, default=50)
    s.set_defaults(handler=cmd_runs_list)
    s = rsub.add_parser("show", parents=[common, read], help="show one run and its state")
    s.add_argument("thread_id")
    s.set_defaults(handler=cmd_runs_show)

    s = sub.add_parser("checkpoints", parents=[common, read], help="a run's checkpoint log")
    s.add_argument("thread_id")
    s.add_argument("--state", action="store_true", help="include the state after each step")
    s.set_defaults(handler=cmd_checkpoints)
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: Handler = args.handler
    try:
        return asyncio.run(handler(args))
    except TetherError as exc:
        print(f"tether: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
