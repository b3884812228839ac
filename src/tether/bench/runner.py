"""Run tether's benchmark workloads and print the results with their goals.

Each workload runs in a fresh subprocess (`python -m tether.bench.workloads ...`), so peak RSS
is that workload's alone. Results are printed as JSON lines (the shared WORKLOADS.md format)
as they arrive, then as a table with the goal of each metric and whether it is met; the table
is also written to a markdown file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .common import Result
from .report import markdown, ratios, rows

WORKLOADS = ("W1", "W2", "W5", "E", "M", "L")
TIMEOUT_S = 900.0  # per workload process; the workloads give up sooner themselves
M_TIMEOUT_S = 300.0  # default cap of one megaagent run (--timeout)
M_GRACE_S = 120.0  # on top of it for the M process: setup, verification, dropping the database


@dataclass(slots=True)
class Job:
    backend: str
    workload: str
    args: tuple[str, ...] = ()
    label: str = ""
    timeout: float = TIMEOUT_S
    results: list[Result] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "tether.bench.workloads", self.workload, self.backend,
                *self.args]


def plan(backends: list[str], workloads: list[str], quick: bool,
         m_timeout: float = M_TIMEOUT_S) -> list[Job]:
    jobs: list[Job] = []
    for backend in backends:
        for w in workloads:
            if w == "W1":
                jobs.append(Job(backend, "W1", label="W1"))
            elif w == "W2":
                for runs in (1000,) if quick else (1000, 10000):
                    jobs.append(Job(backend, "W2", (str(runs),), label=f"W2 R={runs:,}"))
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
    return jobs


def run_job(job: Job, console: Console) -> None:
    """Run one workload process; print its JSON lines as they come."""
    console.print(f"[dim]# {job.backend} {job.label} ...[/dim]", highlight=False)
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(job.argv(), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=job.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        job.error = f"timed out after {job.timeout:.0f} s (process killed)"
    job.seconds = time.monotonic() - t0
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        job.results.append(Result(d["backend"], d["workload"], d["metric"], d["value"], d["unit"]))
        print(line, flush=True)
    if proc.returncode != 0 and job.error is None:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        job.error = lines[-1].strip() if lines else f"exit status {proc.returncode}"
    if err.strip() and (job.error or "warning" in err):
        tail = "\n".join(err.strip().splitlines()[-3:])
        console.print(f"[yellow]{job.backend} {job.label} stderr:[/yellow] {tail}",
                      highlight=False)


def main(argv: list[str] | None = None, prog: str = "python -m bench.run",
         default_out: Path | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0] if __doc__
                                     else None)
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes: W2 and W5 with 1,000 runs, E with 2,000 effects, "
                             "M at 100 and 1,000 agents, shorter L measurements")
    parser.add_argument("--timeout", type=float, default=M_TIMEOUT_S,
                        help="seconds one megaagent run (M) may take before it is reported as "
                             "failed (default: %(default)g)")
    parser.add_argument("--out", type=Path, default=default_out,
                        help="markdown table (default: %(default)s)")
    args = parser.parse_args(argv)
    workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]

    console = Console(width=None if sys.stdout.isatty() else 120)
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    jobs = plan(backends, workloads, args.quick, args.timeout)
    progress = Console(stderr=True)
    for job in jobs:
        run_job(job, progress)
    extra = ratios(jobs)
    for r in extra:
        print(r.to_json(), flush=True)

    table_rows = rows(jobs, extra)
    table = Table(title="tether benchmarks", title_justify="left")
    for name, justify in (("Backend", "left"), ("Workload", "left"), ("Metric", "left"),
                          ("Value", "right"), ("Unit", "left"), ("Goal", "left"), ("Met", "left")):
        table.add_column(name, justify=justify,  # type: ignore[arg-type]
                         no_wrap=name in ("Backend", "Workload", "Metric", "Unit"))
    styles = {"yes": "green", "NO": "bold red", "FAILED": "bold red"}
    for row in table_rows:
        table.add_row(*row, style=styles.get(row[6]))
    console.print(table)

    command = prog + " " + shlex.join(argv if argv is not None else sys.argv[1:])
    lines = [r.to_json() for j in jobs for r in j.results] + [r.to_json() for r in extra]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(markdown(table_rows, jobs, command.strip(), started, lines))
        tmp.replace(args.out)
        console.print(f"[dim]table written to {args.out}[/dim]")
    return 1 if any(j.error for j in jobs) else 0
