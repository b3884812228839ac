"""`tether runs ...` (start, wait, list, show, resume, cancel, retry, send, fork), `tether checkpoints` and
`tether interrupts`: a run's life and what it left."""

from __future__ import annotations

import sys
from typing import Any

import click

from .. import serde
from ..errors import ConfigError
from ..runtime import Checkpoint, Interrupt, Run, RunStatus, Runtime
from ._common import (
    NON_NEGATIVE_INT,
    POSITIVE_FLOAT,
    POSITIVE_INT,
    RUN_CANCELLED,
    RUN_FAILED,
    WaitTimeout,
    cli_actor,
    connection_options,
    console,
    dump,
    json_option,
    json_value,
    on_runtime,
    print_table,
    run,
    runtime_for,
    spaced_json,
)
from ._root import cli


@cli.group("runs", help="start, list and inspect runs")
def runs() -> None:
    pass


@runs.command("start", help="start a run")
@click.argument("agent")
@click.option("--input", "input_", metavar="JSON", help="JSON object: the run's initial state")
@click.option("--thread-id", help="the run's thread_id (default: a new one)")
@click.option("--idempotency-key", help="a second start with the same key returns the same run")
@click.option("--wait", type=POSITIVE_FLOAT, metavar="SECONDS",
              help="wait for the run to finish (needs a worker running)")
@connection_options
@json_option
def start(agent: str, input_: str | None, thread_id: str | None, idempotency_key: str | None,
          wait: float | None, db: str | None, app: str | None, verbose: bool,
          as_json: bool) -> int:
    async def act(rt: Runtime) -> Run:
        data = json_value(input_, "--input") if input_ else {}
        if not isinstance(data, dict):
            raise ConfigError("--input must be a JSON object")
        r = await rt.start(agent, data, thread_id=thread_id, idempotency_key=idempotency_key,
                           actor=cli_actor())
        return await _wait(rt, r, wait, None) if wait else r

    return on_runtime(db, app, verbose, act, as_json=as_json, show=_print_status,
                      need_app=True, status=_outcome if wait else None)


async def _wait(rt: Runtime, r: Run, timeout: float, until: tuple[str, ...] | None) -> Run:
    """rt.wait, its timeout a tether error that says what to look at next. A run that waits
    for a person when the wait begins is said at once, not only when the wait runs out."""
    if (r.status is RunStatus.WAITING and r.waiting_for == "interrupt"
            and "waiting" not in (until or ())):
        print(f"tether: {r.thread_id} waits for a person to answer its interrupt (`tether "
              f"interrupts --thread {r.thread_id}`); waiting up to {timeout:g}s for it to "
              f"finish", file=sys.stderr, flush=True)
    try:
        return await rt.wait(r.thread_id, timeout=timeout, until=until or None)
    except TimeoutError:
        now = await rt.peek(r.thread_id)
        goal = " or ".join(until) if until else "finished"
        raise WaitTimeout(
            f"run {r.thread_id} is still {now.status.value} after {timeout:g}s, not {goal}; "
            f"{_why_still(now)}") from None


def _why_still(r: Run) -> str:
    """What a run that did not get there yet is waiting for, and what to do about it."""
    tid = r.thread_id
    if r.status is RunStatus.WAITING and r.waiting_for == "interrupt":
        return (f"it waits for a person to answer its interrupt (no worker can move it on): "
                f"see the question with `tether interrupts --thread {tid}`, answer with "
                f"`tether runs resume {tid} --value JSON` or in the inbox of `tether serve` "
                f"(/ui/interrupts)")
    if r.status is RunStatus.WAITING and r.waiting_for == "mail":
        return (f"it waits for mail: send it some with `tether runs send {tid} --message JSON`")
    if r.status is RunStatus.WAITING and r.waiting_for:
        return (f"it waits for {r.waiting_for}; is a worker running (tether worker --app ...)? "
                f"Look again with: tether runs show {tid}")
    return (f"is a worker running (tether worker --app ...)? Look again with: tether runs show "
            f"{tid}")


STATUSES = tuple(s.value for s in RunStatus)


@runs.command("wait", short_help="wait for a run to finish; its exit status says how it ended",
              help="wait until a run is finished, or in one of the --until statuses; "
                   "exit 0 completed (or in a --until status), 1 failed, 3 cancelled, "
                   "4 timed out")
@click.argument("thread_id")
@click.option("--until", multiple=True, type=click.Choice(STATUSES),
              help="return once the run is in this status (repeatable; default: finished)")
@click.option("--timeout", type=POSITIVE_FLOAT, default=60.0, show_default=True,
              help="give up after this many seconds (exit status 4)")
@connection_options
@json_option
def wait(thread_id: str, until: tuple[str, ...], timeout: float, db: str | None,
         app: str | None, verbose: bool, as_json: bool) -> int:
    async def act(rt: Runtime) -> Run:
        return await _wait(rt, await rt.peek(thread_id), timeout, until)

    return on_runtime(db, app, verbose, act, as_json=as_json, show=_print_status,
                      status=_outcome)


def _outcome(r: Run) -> int:
    """A waited-for run's exit status, so a script can branch on how it ended."""
    if r.status is RunStatus.FAILED:
        return RUN_FAILED
    return RUN_CANCELLED if r.status is RunStatus.CANCELLED else 0


@runs.command("list", help="list runs, newest first")
@click.option("--status", type=click.Choice(STATUSES), help="only runs in this status")
@click.option("--agent", help="only runs of this agent")
@click.option("--limit", type=POSITIVE_INT, default=50, show_default=True,
              help="at most this many runs")
@connection_options
@json_option
def list_(status: str | None, agent: str | None, limit: int, db: str | None, app: str | None,
          verbose: bool, as_json: bool) -> int:
    def show(found: Any) -> None:
        rows = [(r.thread_id, r.agent, r.status.value, r.actor_state or "",
                 str(r.inbox_depth or ""), str(r.step), _node(r), r.version, str(r.attempt),
                 str(r.error or "")) for r in found]
        print_table(RUN_COLUMNS, rows, optional=("actor", "inbox", "node", "error"))

    async def act(rt: Runtime) -> Any:
        return await rt.list_runs(status=status, agent=agent, limit=limit, inbox=True)

    return on_runtime(db, app, verbose, act, as_json=as_json,
                      to_json=lambda found: [{k: v for k, v in r.to_dict().items() if k != "state"}
                                             for r in found], show=show)


RUN_COLUMNS = (("thread_id", "id"), ("agent", "word"), ("status", "word"), ("actor", "word"),
               ("inbox", "word"), ("step", "word"), ("node", "word"), ("version", "word"),
               ("attempt", "word"), ("error", "text"))


@runs.command("show", help="show one run and its state")
@click.argument("thread_id")
@connection_options
@json_option
def show(thread_id: str, db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    return on_runtime(db, app, verbose, lambda rt: rt.get(thread_id), as_json=as_json,
                      show=_print_run)


def _node(r: Run) -> str:
    """The node a run is at, or the one it failed at."""
    return f"{r.failed_node} (failed)" if r.failed_node else r.node or ""


def _print_status(r: Run) -> None:
    print(f"{r.thread_id} {r.status.value}")


def _print_run(r: Run) -> None:
    con = console()
    con.print(f"[bold]{r.thread_id}[/bold]  agent={r.agent} status={r.status.value} "
              f"step={r.step} "
              + (f"failed_node={r.failed_node}" if r.failed_node else f"node={r.node}")
              + f" version={r.version} attempt={r.attempt}"
              + (f" worker={r.lease_owner}" if r.lease_owner else ""), highlight=False,
              soft_wrap=True)
    if r.error:
        con.print(f"[red]error:[/red] {r.error}")
        con.print(r.error.traceback, markup=False, highlight=False)
    if r.usage:
        con.print("usage: " + " ".join(f"{k}={v}" for k, v in r.usage.items()), highlight=False)
    con.print_json(serde.display(r.state).decode())


@runs.command("resume", help="answer a run's pending interrupt (exactly once)")
@click.argument("thread_id")
@click.option("--value", required=True, metavar="JSON",
              help="the answer, as JSON (e.g. true, '\"yes\"')")
@click.option("--interrupt-id", help="which interrupt (default: the pending one)")
@connection_options
@json_option
def resume(thread_id: str, value: str, interrupt_id: str | None, db: str | None,
           app: str | None, verbose: bool, as_json: bool) -> int:
    async def act(rt: Runtime) -> Interrupt:
        return await rt.resume(thread_id, json_value(value, "--value"),
                               interrupt_id=interrupt_id, actor=cli_actor())

    return on_runtime(db, app, verbose, act, as_json=as_json, show=lambda a: print(
        f"resumed {a.thread_id}: interrupt {a.id} answered"))


@runs.command("cancel", help="cancel a run now")
@click.argument("thread_id")
@connection_options
@json_option
def cancel(thread_id: str, db: str | None, app: str | None, verbose: bool,
           as_json: bool) -> int:
    return on_runtime(db, app, verbose, lambda rt: rt.cancel(thread_id, actor=cli_actor()),
                      as_json=as_json, show=_print_status)


@runs.command("retry", help="run a failed run again from its failed step (after a fix)")
@click.argument("thread_id")
@connection_options
@json_option
def retry(thread_id: str, db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    return on_runtime(db, app, verbose, lambda rt: rt.retry(thread_id, actor=cli_actor()),
                      as_json=as_json, need_app=True, show=lambda r: print(
                          f"{r.thread_id} {r.status.value} (retrying node {r.node} after step "
                          f"{r.step})"))


@runs.command("send", help="put a message in a run's mailbox (an idle actor wakes)")
@click.argument("thread_id")
@click.option("--message", required=True, metavar="JSON", help="the message, as JSON")
@click.option("--sender", help="who sends it (ctx.inbox shows it as the message's sender)")
@connection_options
@json_option
def send(thread_id: str, message: str, sender: str | None, db: str | None, app: str | None,
         verbose: bool, as_json: bool) -> int:
    body: list[Any] = []

    async def act(rt: Runtime) -> int:
        body.append(json_value(message, "--message"))
        return await rt.send(thread_id, body[0], sender=sender, actor=cli_actor())

    return on_runtime(db, app, verbose, act, as_json=as_json,
                      to_json=lambda mid: {"id": mid, "thread_id": thread_id, "sender": sender,
                                           "message": body[0]},
                      show=lambda mid: print(f"sent message {mid} to {thread_id}"))


@runs.command("fork", help="start a new run from the state after a step of this one")
@click.argument("thread_id")
@click.option("--step", type=NON_NEGATIVE_INT, required=True,
              help="the step whose state the new run starts from")
@click.option("--thread-id", "new_thread_id", help="the new run's thread_id")
@connection_options
@json_option
def fork(thread_id: str, step: int, new_thread_id: str | None, db: str | None,
         app: str | None, verbose: bool, as_json: bool) -> int:
    async def act(rt: Runtime) -> Run:
        return await rt.fork(thread_id, step, new_thread_id=new_thread_id, actor=cli_actor())

    return on_runtime(db, app, verbose, act, as_json=as_json, need_app=True, show=lambda r: print(
        f"{r.thread_id} {r.status.value} (forked from {thread_id} at step {step})"))


@cli.command("checkpoints", help="a run's checkpoint log")
@click.argument("thread_id")
@click.option("--state", is_flag=True, help="include the state after each step")
@connection_options
@json_option
def checkpoints(thread_id: str, state: bool, db: str | None, app: str | None, verbose: bool,
                as_json: bool) -> int:
    return on_runtime(db, app, verbose, lambda rt: rt.checkpoints(thread_id), as_json=as_json,
                      to_json=lambda cps: [_cp_dict(cp, state) for cp in cps],
                      show=_print_checkpoints)


def _print_checkpoints(cps: list[Checkpoint]) -> None:
    """One row per step; in a narrow terminal, one record per step titled "step N · node"."""
    rows = [(str(cp.step), cp.node, cp.next_node or "-", KINDS.get(cp.kind, cp.kind),
             cp.worker, str(cp.attempt), f"{cp.duration * 1000:.1f}", ", ".join(cp.state))
            for cp in cps]
    print_table(
        [("step", "word"), ("node", "word"), ("next", "word"), ("kind", "word"),
         ("worker", "id"), ("attempt", "word"), ("ms", "word"), ("state keys", "words")],
        rows, title="step {step} · {node}",
        caption="kind: delta (the changes of the step) or snapshot (the whole state)")


KINDS = {"d": "delta", "s": "snapshot"}


def _cp_dict(cp: Checkpoint, with_state: bool) -> dict[str, Any]:
    d = cp.to_dict()
    if not with_state:
        d.pop("state")
    return d


@cli.command("interrupts", help="interrupts waiting for a person's answer")
@click.option("--thread", "--thread-id", "thread_id", metavar="THREAD_ID",
              help="only this run's interrupts")
@click.option("--all", "show_all", is_flag=True, help="answered ones too")
@click.option("--limit", type=POSITIVE_INT, default=100, show_default=True,
              help="at most this many interrupts")
@connection_options
@json_option
def interrupts(thread_id: str | None, show_all: bool, limit: int, db: str | None,
               app: str | None, verbose: bool, as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        try:
            pending = await rt.interrupts(thread_id=thread_id,
                                          status=None if show_all else "pending", limit=limit)
        finally:
            await rt.close()
        if as_json:
            dump([i.to_dict() for i in pending])
        else:
            _print_interrupts(pending)
        return 0

    return run(main(), verbose)


def _print_interrupts(items: list[Interrupt]) -> None:
    rows = [(i.id, i.thread_id, str(i.step), i.status, spaced_json(i.payload),
             "" if i.status == "pending" else spaced_json(i.value)) for i in items]
    print_table(
        [("id", "id"), ("thread_id", "id"), ("step", "word"), ("status", "word"),
         ("payload", "words"), ("value", "words")], rows, optional=("value",))
