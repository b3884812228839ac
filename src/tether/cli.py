"""The `tether` command. Every read command takes --json; --db defaults to $TETHER_DB, then
sqlite:///tether.db; --app module:attr names the user's tether.Runtime."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from types import FrameType
from typing import Any, TypeVar

import orjson

from . import eventloop
from .config import default_db, redact
from .errors import AppImportError, ConfigError, InvalidState, TetherError
from .extras import requires_extra
from .runtime import Checkpoint, Interrupt, Run, Runtime

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
N = TypeVar("N", int, float)


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
        try:
            obj = obj()
        except TetherError:
            raise
        except Exception as exc:
            raise AppImportError(
                f"--app {target}: calling it (with no arguments) to get the Runtime failed: "
                f"{exc!r}") from exc
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
        runs = await rt.list_runs(status=args.status, agent=args.agent, limit=args.limit,
                                  inbox=True)
    finally:
        await rt.close()
    if args.json:
        _dump([{k: v for k, v in r.to_dict().items() if k != "state"} for r in runs])
        return 0
    from rich.table import Table

    table = Table("thread_id", "agent", "status", "actor", "inbox", "step", "node", "version",
                  "attempt", "error")
    for r in runs:
        table.add_row(r.thread_id, r.agent, r.status.value, r.actor_state or "",
                      str(r.inbox_depth or 0), str(r.step), r.node or "", r.version,
                      str(r.attempt), str(r.error or ""))
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


async def cmd_runs_resume(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    try:
        value = orjson.loads(args.value)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"--value is not valid JSON: {exc}") from None
    try:
        answered = await rt.resume(args.thread_id, value, interrupt_id=args.interrupt_id)
    finally:
        await rt.close()
    if args.json:
        _dump(answered.to_dict())
    else:
        print(f"resumed {answered.thread_id}: interrupt {answered.id} answered")
    return 0


async def cmd_runs_cancel(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    try:
        run = await rt.cancel(args.thread_id)
    finally:
        await rt.close()
    if args.json:
        _dump(run.to_dict())
    else:
        print(f"{run.thread_id} {run.status.value}")
    return 0


async def cmd_runs_fork(args: argparse.Namespace) -> int:
    rt = _runtime(args, need_app=True)
    try:
        run = await rt.fork(args.thread_id, args.step, new_thread_id=args.new_thread_id)
    finally:
        await rt.close()
    if args.json:
        _dump(run.to_dict())
    else:
        print(f"{run.thread_id} {run.status.value} (forked from {args.thread_id} at step "
              f"{args.step})")
    return 0


async def cmd_interrupts(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    try:
        pending = await rt.interrupts(thread_id=args.thread_id,
                                      status=None if args.all else "pending", limit=args.limit)
    finally:
        await rt.close()
    if args.json:
        _dump([i.to_dict() for i in pending])
        return 0
    _print_interrupts(pending)
    return 0


def _print_interrupts(items: list[Interrupt]) -> None:
    from rich.table import Table

    table = Table("id", "thread_id", "step", "status", "payload", "value")
    for i in items:
        table.add_row(i.id, i.thread_id, str(i.step), i.status, orjson.dumps(i.payload).decode(),
                      "" if i.status == "pending" else orjson.dumps(i.value).decode())
    _console().print(table)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def cmd_serve(args: argparse.Namespace) -> int:
    with requires_extra("server", "tether serve"):
        import uvicorn

        from .service import create_app, drain
    token = args.token if args.token is not None else os.environ.get("TETHER_TOKEN")
    token = token or None
    if not is_loopback(args.host) and token is None:
        raise ConfigError(
            f"refusing to bind {args.host!r} without a token: anyone who reaches it could start "
            "and resume runs. Pass --token (or set TETHER_TOKEN), or bind 127.0.0.1"
        )
    rt = _runtime(args, need_app=args.worker)
    if args.lease_ttl is not None:
        rt = rt.with_db(rt.db_url, lease_ttl=args.lease_ttl)
    await rt.open()  # a missing schema or unreachable database is a clear error, not a traceback
    app = create_app(rt, token=token, worker_concurrency=args.concurrency if args.worker else None)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, lifespan="on", access_log=args.verbose,
        log_level="info" if args.verbose else "warning", timeout_graceful_shutdown=5,
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            drain(app)
            super().handle_exit(sig, frame)

    server = Server(config)
    # uvicorn re-raises the signal that stopped it once it has shut down; these handlers make
    # that a clean exit (status 0) instead of death by SIGTERM or a KeyboardInterrupt.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    print(f"tether serve: http://{args.host}:{args.port} db={redact(rt.db_url)} "
          f"version={rt.version} worker={'on' if args.worker else 'off'} "
          f"auth={'token' if token else 'none'}", flush=True)
    try:
        await server.serve()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        await rt.close()
    return 0 if server.started else 1


def _cp_dict(cp: Checkpoint, with_state: bool) -> dict[str, Any]:
    d = cp.to_dict()
    if not with_state:
        d.pop("state")
    return d


async def cmd_effects_list(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    try:
        effects = await rt.effects(args.thread, status=args.status, limit=args.limit)
    finally:
        await rt.close()
    if args.json:
        _dump([e.to_dict() for e in effects])
        return 0
    from rich.table import Table

    table = Table("thread_id", "key", "name", "status", "attempts", "error", "result")
    for e in effects:
        table.add_row(e.thread_id, e.key, e.name, e.status, str(e.attempts), e.error or "",
                      "" if e.result is None else orjson.dumps(e.result).decode()[:60])
    _console().print(table)
    return 0


async def cmd_effects_retry(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    try:
        revived = await rt.retry_effect(args.key, args.thread)
    finally:
        await rt.close()
    if not revived:
        raise InvalidState(f"no dead effect with key {args.key!r}")
    if args.json:
        _dump([e.to_dict() for e in revived])
    else:
        print(f"effect {args.key} queued again ({len(revived)} row); a worker performs it next")
    return 0


async def cmd_demo(args: argparse.Namespace) -> int:
    from .demo.run import PARTS, run_demo

    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        raise ConfigError(f"unknown demo part {unknown[0]!r}; parts: {', '.join(PARTS)}")
    return await run_demo(args.parts or list(PARTS))


async def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.runner import run

    return await asyncio.to_thread(run, args)  # blocking: one subprocess per workload


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

    s = rsub.add_parser("resume", parents=[common, read],
                        help="answer a run's pending interrupt (exactly once)")
    s.add_argument("thread_id")
    s.add_argument("--value", required=True, help="the answer, as JSON (e.g. true, '\"yes\"')")
    s.add_argument("--interrupt-id", help="which interrupt (default: the pending one)")
    s.set_defaults(handler=cmd_runs_resume)
    s = rsub.add_parser("cancel", parents=[common, read], help="cancel a run now")
    s.add_argument("thread_id")
    s.set_defaults(handler=cmd_runs_cancel)
    s = rsub.add_parser("fork", parents=[common, read],
                        help="start a new run from the state after a step of this one")
    s.add_argument("thread_id")
    s.add_argument("--step", type=_non_negative_int, required=True)
    s.add_argument("--thread-id", dest="new_thread_id", help="the new run's thread_id")
    s.set_defaults(handler=cmd_runs_fork)

    s = sub.add_parser("interrupts", parents=[common, read],
                       help="interrupts waiting for a person's answer")
    s.add_argument("--thread-id")
    s.add_argument("--all", action="store_true", help="answered ones too")
    s.add_argument("--limit", type=_positive_int, default=100)
    s.set_defaults(handler=cmd_interrupts)

    s = sub.add_parser("serve", parents=[common], help="run the HTTP API (FastAPI + uvicorn)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; any other needs a token)")
    s.add_argument("--port", type=_port, default=8000)
    s.add_argument("--token", help="bearer token clients must send (default $TETHER_TOKEN)")
    s.add_argument("--worker", action="store_true", help="also run a worker in this process")
    s.add_argument("--concurrency", type=_positive_int, default=100,
                   help="the embedded worker's concurrency")
    s.add_argument("--lease-ttl", type=_positive_float, default=None,
                   help="the embedded worker's lease TTL in seconds")
    s.set_defaults(handler=cmd_serve)

    s = sub.add_parser("checkpoints", parents=[common, read], help="a run's checkpoint log")
    s.add_argument("thread_id")
    s.add_argument("--state", action="store_true", help="include the state after each step")
    s.set_defaults(handler=cmd_checkpoints)

    effects = sub.add_parser("effects", help="the outbox: list and retry side effects")
    esub = effects.add_subparsers(dest="effects_command", required=True, metavar="SUBCOMMAND")
    s = esub.add_parser("list", parents=[common, read], help="effects in request order")
    s.add_argument("--thread", help="only this run's effects")
    s.add_argument("--status", choices=["pending", "running", "done", "dead"])
    s.add_argument("--limit", type=_positive_int, default=100)
    s.set_defaults(handler=cmd_effects_list)
    s = esub.add_parser("retry", parents=[common, read], help="retry a dead effect now")
    s.add_argument("key")
    s.add_argument("--thread", help="the run, if the key is not unique across runs")
    s.set_defaults(handler=cmd_effects_retry)

    s = sub.add_parser("demo", help="the lesson's scenarios end to end on embedded SQLite")
    s.add_argument("parts", nargs="*", metavar="PART",
                   help="crash, queue, hitl, effect, async (default: all)")
    s.set_defaults(handler=cmd_demo)

    from .bench.runner import add_arguments

    s = sub.add_parser("bench", help="run the benchmark workloads (W1-W5, E, M, L)")
    add_arguments(s, anchors_by_default=False)
    s.set_defaults(handler=cmd_bench)
    return p


def _bounded(kind: Callable[[str], N], what: str, low: N, high: N | None = None,
             *, strict: bool = False) -> Callable[[str], N]:
    """An argparse type: `kind(text)` within [low, high] (above `low` when `strict`)."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < low or (strict and value == low) or (high is not None and value > high):
            bound = f"> {low}" if strict else f">= {low}"
            if high is not None:
                bound = f"within {low}..{high}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


_positive_int = _bounded(int, "an integer", 1)
_non_negative_int = _bounded(int, "an integer", 0)
_port = _bounded(int, "a port number", 0, 65535)
_positive_float = _bounded(float, "a number", 0.0, strict=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: Handler = args.handler
    try:
        return eventloop.run(handler(args))
    except TetherError as exc:
        print(f"tether: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
