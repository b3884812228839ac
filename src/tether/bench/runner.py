"""Run tether's benchmark workloads and print the results with their goals (`tether bench`,
`python -m bench.run`).

Each workload runs in a fresh subprocess (`python -m tether.bench.workloads ...`), so peak RSS
is that workload's alone. Results are printed as JSON lines (the shared WORKLOADS.md format)
as they arrive, then as a table with the goal of each metric and whether it is met; the table
can also be written to a markdown file.

The package runs every workload but M. What needs a tether checkout (M runs
examples/megaagent/run.py; the LangGraph and DBOS anchors of bench/anchors) is handed in by
the checkout's bench/run.py as a `Checkout`: nothing here imports or reads the checkout.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..extras import requires_extra
from .jobs import Job

if TYPE_CHECKING:
    pass

WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "E", "M", "L", "R")
SHARED = ("W1", "W2", "W3", "W4", "W5")  # the workloads the anchors run too (WORKLOADS.md)
ANCHOR_SYSTEMS = ("langgraph", "dbos")
M_HINT = ("M runs examples/megaagent/run.py, which is not installed with tether: run it from a "
          "tether checkout's root with python -m bench.run --workloads M (bench/README.md)")
ANCHORS_HINT = ("the anchors need a tether checkout: run python -m bench.run from its root "
                "(bench/README.md)")
M_TIMEOUT_S = 300.0  # default cap of one megaagent run (--timeout)
M_GRACE_S = 120.0  # on top of it for the M process: setup, verification, dropping the database


AnchorFn = Callable[..., list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Checkout:
    """What a tether checkout adds (bench/run.py): `workloads` whose code is not in the package,
    each run in its own process by `python -m <module> WORKLOAD BACKEND ...` from the
    checkout's root, and the anchors' run_anchors (or why there is none)."""

    module: str
    workloads: tuple[str, ...]
    anchors: AnchorFn | str


def plan(backends: Sequence[str], workloads: Sequence[str], quick: bool,
         m_timeout: float = M_TIMEOUT_S, checkout: Checkout | None = None) -> list[Job]:
    jobs: list[Job] = []
    for backend in backends:
        for w in workloads:
            if w == "W1":
                jobs.append(Job(backend, "W1", label="W1"))
            elif w == "W2":
                for runs in (1000,) if quick else (1000, 10000):
                    jobs.append(Job(backend, "W2", (str(runs),), label=f"W2 R={runs:,}"))
            elif w == "R":
                for runs in (1000,) if quick else (1000, 10000):
                    jobs.append(Job(backend, "R", (str(runs),), label=f"R R={runs:,}"))
            elif w == "W3":
                for variant in ("plain", "outbox"):
                    jobs.append(Job(backend, "W3", (variant,), label=f"W3 {variant}"))
            elif w == "W4":
                n = 5000 if quick else 20000
                jobs.append(Job(backend, "W4", (str(n), "4"), label=f"W4 N={n:,}"))
            elif w == "W5":
                runs = 1000 if quick else 10000
                jobs.append(Job(backend, "W5", (str(runs),), label=f"W5 R={runs:,}"))
            elif w == "E":
                n = 2000 if quick else 10000
                jobs.append(Job(backend, "E", (str(n),), label=f"E N={n:,}"))
            elif w == "M":
                for agents in (100, 1000) if quick else (100, 1000, 10000):
                    jobs.append(Job(backend, "M", (str(agents), f"{m_timeout:g}"),
                                    label=f"M {agents:,} agents", timeout=m_timeout + M_GRACE_S))
            elif w == "L":
                jobs.append(Job(backend, "L", ("0.75" if quick else "2.0",), label="L"))
    if checkout is not None:
        for job in jobs:
            if job.workload in checkout.workloads:
                job.module = checkout.module
    return jobs


def run_job(job: Job, on_line: Callable[[str], None]) -> str:
    """Run one workload process; hand each JSON line to `on_line` as it comes. Returns the
    process's stderr."""
    from .common import Result

    t0 = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(job.argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stderr is not None
    stderr = proc.stderr
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(stderr.read()), daemon=True)
    reader.start()
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(job.timeout, expire)
    timer.start()
    try:
        for raw in proc.stdout:
            line = raw.strip()
            if not line.startswith("{"):
                continue
            try:
                d = json.loads(line)
                job.results.append(Result(d["backend"], d["workload"], d["metric"], d["value"],
                                          d["unit"]))
            except (ValueError, KeyError) as exc:
                err.append(f"warning: unreadable result line {line!r}: {exc}\n")
                continue
            on_line(line)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join()
    job.seconds = time.monotonic() - t0
    text = "".join(err)
    if timed_out.is_set():
        job.error = f"timed out after {job.timeout:.0f} s (process killed)"
    elif proc.returncode != 0:
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        job.error = lines[-1].strip() if lines else f"exit status {proc.returncode}"
    return text


# -- arguments -------------------------------------------------------------------------------


def _choices(kind: str, allowed: Sequence[str], aliases: Mapping[str, Sequence[str]]
             ) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of `allowed` names (any case), in order."""

    def parse(text: str) -> list[str]:
        out: list[str] = []
        for raw in text.split(","):
            name = raw.strip()
            if not name:
                continue
            key = name.lower() if kind != "workload" else name.upper()
            names = aliases.get(key, [key])
            bad = [n for n in names if n not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"unknown {kind} {name!r}; choose from {', '.join(allowed)}")
            out += [n for n in names if n not in out]
        if not out:
            raise argparse.ArgumentTypeError(f"no {kind} given")
        return out

    return parse


parse_backends = _choices("backend", ("sqlite", "postgres"), {"both": ("sqlite", "postgres")})
parse_workloads = _choices("workload", WORKLOADS, {})
parse_systems = _choices("anchor system", ANCHOR_SYSTEMS, {})


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value:g}")
    return value


def add_arguments(p: argparse.ArgumentParser, *, anchors_by_default: bool) -> None:
    """The options of `tether bench` and `python -m bench.run`."""
    p.add_argument("--backend", type=parse_backends, default=["sqlite", "postgres"],
                   metavar="sqlite,postgres", help="stores to measure (default: both)")
    p.add_argument("--workloads", type=parse_workloads, default=None,
                   metavar=",".join(WORKLOADS), help="workloads to run, in this order "
                   "(default: all; M only from a checkout, with python -m bench.run)")
    p.add_argument("--quick", action="store_true",
                   help="smaller sizes: W2 and W5 with 1,000 runs, W4 with 5,000 jobs, E with "
                        "2,000 effects, M at 100 and 1,000 agents, shorter L measurements")
    p.add_argument("--out", type=Path, metavar="FILE",
                   help="also write the table, the machine and the JSON "
                   "lines to this markdown file")
    p.add_argument("--pg-url", "--db", dest="pg_url", metavar="URL",
                   help="Postgres server to create the benchmark databases on: the URL of a "
                        "database to connect to for CREATE DATABASE (default: $BENCH_PG_URL, "
                        "else postgresql://postgres@127.0.0.1:5432/postgres)")
    p.add_argument("--timeout", type=_seconds, default=M_TIMEOUT_S, metavar="SECONDS",
                   help="seconds one megaagent run (M) may take (default: %(default)g)")
    p.add_argument("--anchors", type=parse_systems, nargs="?", const=list(ANCHOR_SYSTEMS),
                   metavar="langgraph,dbos",
                   help="also run the comparison anchors of bench/anchors and show their "
                        "figures beside tether's (python -m bench.run, in a tether checkout)"
                        + (" (the default here)" if anchors_by_default else ""))
    p.add_argument("--no-anchors", action="store_true", help="tether only")
    p.set_defaults(anchors_auto=list(ANCHOR_SYSTEMS) if anchors_by_default else None,
                   checkout=None)


def parse(argv: Sequence[str], prog: str, checkout: Checkout | None = None,
          default_out: Path | None = None) -> argparse.Namespace:
    """The options of `prog` (exits 0 after --help, 2 on a bad option, as argparse does);
    with a checkout, the anchors are on by default and its workloads can run."""
    parser = argparse.ArgumentParser(prog=prog, description="Run tether's benchmark workloads "
                                     "and print the results with their goals (bench/README.md).")
    add_arguments(parser, anchors_by_default=checkout is not None)
    parser.set_defaults(out=default_out, checkout=checkout)
    return parser.parse_args(list(argv))


# -- checks before anything runs -------------------------------------------------------------


def check_postgres(url: str) -> None:
    with requires_extra("postgres", "tether bench --backend postgres"):
        import psycopg

    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"--pg-url must be a postgresql:// URL, got {url!r}")
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=3):
            pass
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise ConfigError(f"Postgres is not answering at {url}: {first}. Start it, point "
                          "--pg-url (or $BENCH_PG_URL) at a server, or pass --backend sqlite"
                          ) from None


def anchors_of(args: argparse.Namespace) -> AnchorFn | str:
    """The checkout's run_anchors, or why there is none."""
    checkout: Checkout | None = args.checkout
    return checkout.anchors if checkout is not None else ANCHORS_HINT


def resolve(args: argparse.Namespace) -> tuple[list[str], list[str] | None, list[str]]:
    """(workloads, anchor systems or None, notes): checks the environment before anything
    runs; ConfigError for what the user asked and cannot have."""
    from .common import pg_admin_url

    notes: list[str] = []
    workloads = list(args.workloads or WORKLOADS)
    checkout: Checkout | None = args.checkout
    if "M" in workloads and (checkout is None or "M" not in checkout.workloads):
        if args.workloads:
            raise ConfigError(M_HINT)
        workloads.remove("M")
        notes.append(f"M skipped: {M_HINT}")
    systems = None if args.no_anchors else (args.anchors or args.anchors_auto)
    if systems:
        if not any(w in SHARED for w in workloads):
            systems = None
        elif isinstance(found := anchors_of(args), str):
            if args.anchors:
                raise ConfigError(f"--anchors: {found}")
            notes.append(f"anchors skipped: {found}")
            systems = None
    if "postgres" in args.backend:
        check_postgres(args.pg_url or pg_admin_url())
    return workloads, systems, notes


# -- the run ---------------------------------------------------------------------------------


def run(args: argparse.Namespace, prog: str = "tether bench",
        argv: Sequence[str] | None = None) -> int:
    """Run what `args` (from add_arguments) asks for; 1 if a workload failed."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from .common import pg_admin_url
    from .report import anchor_line, markdown, ratios, rows

    os.environ["BENCH_PG_URL"] = args.pg_url or pg_admin_url()  # the workload processes' too
    workloads, systems, notes = resolve(args)
    err = Console(stderr=True)
    for note in notes:
        err.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    jobs = plan(args.backend, workloads, args.quick, args.timeout, args.checkout)
    anchors: list[dict[str, Any]] = []
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        # JSON lines go to stdout; when both are one terminal, above the live display.
        if sys.stdout.isatty() and err.is_terminal:
            def show(line: str) -> None:
                progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            def show(line: str) -> None:
                print(line, flush=True)

        overall = progress.add_task("tether benchmarks", total=len(jobs) + bool(systems))
        for job in jobs:
            task = progress.add_task(f"{job.backend} {job.label}", total=None)
            stderr = run_job(job, show)
            progress.remove_task(task)
            progress.advance(overall)
            mark = "[red]FAILED[/red]" if job.error else "[green]done[/green]"
            progress.console.print(f"{mark} {job.backend} {job.label} in {job.seconds:.1f} s"
                                   + (f": {job.error}" if job.error else ""), highlight=False)
            if stderr.strip() and (job.error or "warning" in stderr):
                tail = "\n".join(stderr.strip().splitlines()[-3:])
                progress.console.print(f"[yellow]stderr:[/yellow] {tail}", highlight=False,
                                       markup=False)
        if systems:
            shared = [w for w in workloads if w in SHARED]
            task = progress.add_task(f"anchors: {','.join(systems)} on {','.join(shared)}",
                                     total=None)
            fn = anchors_of(args)
            assert not isinstance(fn, str)  # resolve() dropped the anchors otherwise
            anchors = call_anchors(fn, systems, args.backend, shared, args.quick, show)
            progress.remove_task(task)
            progress.advance(overall)
    extra = ratios(jobs)
    for r in extra:
        show(r.to_json())

    head, table_rows = rows(jobs, extra, anchors)
    print_table(head, table_rows)
    if args.out is not None:
        command = " ".join([prog, shlex.join(argv if argv is not None else sys.argv[1:])])
        lines = ([r.to_json() for j in jobs for r in j.results] + [r.to_json() for r in extra]
                 + [anchor_line(d) for d in anchors])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(markdown(head, table_rows, jobs, command.strip(), started, lines))
        tmp.replace(args.out)
        err.print(f"[dim]table written to {args.out}[/dim]")
    return 1 if any(j.error for j in jobs) else 0


def call_anchors(fn: AnchorFn, systems: list[str], backends: list[str], workloads: list[str],
                 quick: bool, show: Callable[[str], None]) -> list[dict[str, Any]]:
    """The anchors' run_anchors, each line shown as it comes when it takes `on_row`; a
    failure becomes an error line per system."""
    from .report import anchor_line

    shown: list[Mapping[str, Any]] = []

    def on_row(d: Mapping[str, Any]) -> None:
        shown.append(d)
        show(anchor_line(d))

    streams = "on_row" in inspect.signature(fn).parameters
    try:
        rows = fn(systems, backends, workloads, quick, **({"on_row": on_row} if streams else {}))
    except Exception as exc:
        rows = [{"system": s, "error": f"run_anchors failed: {exc!r}"} for s in systems]
    out = [dict(d) for d in rows]
    for d in out:
        if not any(d == dict(seen) for seen in shown):
            show(anchor_line(d))
    return out


def print_table(head: Sequence[str], table_rows: Sequence[Sequence[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title="tether benchmarks", title_justify="left")
    for name in head:
        table.add_column(name, justify="right" if name == "Value" else "left",
                         no_wrap=name in ("Backend", "Workload", "Metric", "Value", "Unit"))
    styles = {"yes": "green", "NO": "bold red", "FAILED": "bold red"}
    for row in table_rows:
        table.add_row(*row, style=styles.get(row[6]))
    console.print(table)


def main(argv: Sequence[str], prog: str, checkout: Checkout | None = None,
         default_out: Path | None = None) -> int:
    """Parse `argv` and run; status 2 with one line for a ConfigError."""
    args = parse(argv, prog, checkout, default_out)
    try:
        return run(args, prog, argv)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
