"""Run tether's benchmark workloads and print the results with their goals.

    python -m bench.run [--backend sqlite|postgres|both] [--workloads W1,W2,W5,E,M,L] [--quick]
                        [--timeout SECONDS]

Each workload runs in a fresh subprocess (`python -m bench.workloads ...`), so peak RSS is that
workload's alone. Results are printed as JSON lines (the shared WORKLOADS.md format) as they
arrive, then as a table with the goal of each metric and whether it is met; the table is also
written to bench/results/latest.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .workloads import PG_ADMIN_URL, Result

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "latest.md"
WORKLOADS = ("W1", "W2", "W5", "E", "M", "L")
LOAD_AT_START = os.getloadavg()[0]
TIMEOUT_S = 900.0  # per workload process; the workloads give up sooner themselves
M_TIMEOUT_S = 300.0  # default cap of one megaagent run (--timeout)
M_GRACE_S = 120.0  # on top of it for the M process: setup, verification, dropping the database

# (workload, metric) -> backend -> (comparison, threshold, goal text). From issues 2 (W1, W2),
# 4 (W5), 3 (E) and 5 (M).
Goal = tuple[str, float, str]
GOALS: dict[tuple[str, str], dict[str, Goal]] = {
    ("W1", "checkpoints_per_s"): {"sqlite": (">=", 2000, ">= 2,000/s"),
                                  "postgres": (">=", 1500, ">= 1,500/s")},
    ("W1", "bytes_on_disk"): {b: ("<=", 2.5e6, "<= 2.5 MB") for b in ("sqlite", "postgres")},
    ("W2", "wall_over_ideal_1k"): {b: ("<=", 1.5, "<= 1.5x") for b in ("sqlite", "postgres")},
    ("W2", "wall_over_ideal_10k"): {b: ("<=", 5.0, "<= 5x") for b in ("sqlite", "postgres")},
    ("W2", "peak_rss_mib_10k"): {b: ("<=", 1024, "<= 1 GiB") for b in ("sqlite", "postgres")},
    ("W5", "suspend_s_10k"): {b: ("<=", 5.0, "<= 5 s") for b in ("sqlite", "postgres")},
    ("W5", "rss_delta_mib_10k"): {b: ("<=", 50.0, "<= 50 MiB") for b in ("sqlite", "postgres")},
    ("W5", "resume_finish_s_10k"): {b: ("<=", 5.0, "<= 5 s") for b in ("sqlite", "postgres")},
    ("E", "effects_per_s"): {"postgres": (">=", 5000, ">= 5,000/s")},
    ("M", "cost_ratio_10k_over_100"): {b: ("<=", 1.5, "<= 1.5x") for b in ("sqlite", "postgres")},
}
# The same-run physical limit W1 is compared with: one durable commit per row, one connection.
RAW_REFERENCE = {"sqlite": "single_full_rows_per_s", "postgres": "single_1conn_rows_per_s"}


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
        return [sys.executable, "-m", "bench.workloads", self.workload, self.backend, *self.args]


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
    proc = subprocess.Popen(job.argv(), cwd=ROOT, env=env, stdout=subprocess.PIPE,
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


def ratios(jobs: list[Job]) -> list[Result]:
    """Ratios across workload processes of the same bench.run: W1 checkpoints/s over the raw
    single-row commit rate on that backend; megaagent cost per agent at 10,000 (and 1,000)
    agents over the cost per agent at 100."""
    out: list[Result] = []
    found = {(r.backend, r.workload, r.metric): r.value for j in jobs for r in j.results}
    for backend, ref_metric in RAW_REFERENCE.items():
        w1 = found.get((backend, "W1", "checkpoints_per_s"))
        ref = found.get((backend, "L", ref_metric))
        if w1 and ref:
            out.append(Result(backend, "W1", "checkpoints_vs_raw_commit", round(w1 / ref, 3), "x"))
    for backend in RAW_REFERENCE:
        base = found.get((backend, "M", "cost_per_agent_ms_100"))
        for s in ("1k", "10k"):
            cost = found.get((backend, "M", f"cost_per_agent_ms_{s}"))
            if base and cost:
                out.append(Result(backend, "M", f"cost_ratio_{s}_over_100", round(cost / base, 3),
                                  "x"))
    return out


def check(result: Result) -> tuple[str, bool | None]:
    goal = GOALS.get((result.workload, result.metric), {}).get(result.backend)
    if goal is None:
        return "", None
    op, threshold, text = goal
    ok = result.value >= threshold if op == ">=" else result.value <= threshold
    return text, ok


def fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        return f"{value / 1e6:,.2f} MB ({int(value):,})"
    if unit == "count":
        return f"{int(value):,}"
    if unit in ("1/s", "MiB") or abs(value) >= 100:
        return f"{value:,.1f}"
    return f"{value:,.3f}"


Row = tuple[str, str, str, str, str, str, str]


def rows(jobs: list[Job], extra: list[Result]) -> list[Row]:
    """Table rows; each cross-process ratio follows the last job of its backend and workload."""
    out: list[Row] = []
    last = {(j.backend, j.workload): i for i, j in enumerate(jobs)}
    for i, job in enumerate(jobs):
        attached = [r for r in extra if last.get((r.backend, r.workload)) == i]
        for r in [*job.results, *attached]:
            goal, ok = check(r)
            met = "" if ok is None else ("yes" if ok else "NO")
            out.append((r.backend, job.label, r.metric, fmt(r.value, r.unit), r.unit, goal, met))
        if job.error:
            out.append((job.backend, job.label, "error", job.error, "", "", "FAILED"))
    return out


def machine() -> list[str]:
    info = [f"Python {platform.python_version()} on {platform.system()} {platform.release()}",
            f"{os.cpu_count()} CPUs", f"SQLite {sqlite3.sqlite_version}",
            f"load average (1 min) {LOAD_AT_START:.2f} at the start, {os.getloadavg()[0]:.2f} at "
            "the end (other processes on this machine share its CPUs and disk)"]
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                         None)
        if model:
            info.insert(1, model)
    except OSError:
        pass
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            fsync = conn.execute("SHOW fsync").fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()
            autovacuum = conn.execute("SHOW autovacuum").fetchone()
        info.append(f"Postgres {version[0] if version else '?'} (fsync={fsync[0] if fsync else '?'}, "
                    f"synchronous_commit={sync[0] if sync else '?'}, "
                    f"autovacuum={autovacuum[0] if autovacuum else '?'}: with it off, a fresh "
                    "table is never ANALYZEd during a run)")
    except Exception as exc:
        info.append(f"Postgres not reachable at {PG_ADMIN_URL}: {exc}")
    return info


def markdown(table_rows: list[Row], jobs: list[Job], command: str, started: str,
             lines: list[str]) -> str:
    head = ("Backend", "Workload", "Metric", "Value", "Unit", "Goal", "Met")
    md = [
        "# tether benchmark results",
        "",
        f"- Run: `{command}` at {started} UTC",
        *[f"- {m}" for m in machine()],
        f"- Workload processes took {sum(j.seconds for j in jobs):.0f} s in all",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" if h == "Value" else "---" for h in head) + "|",
        *["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table_rows],
        "",
        "Metric definitions: bench/README.md.",
        "",
        "```jsonl",
        *lines,
        "```",
        "",
    ]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes: W2 and W5 with 1,000 runs, E with 2,000 effects, "
                             "M at 100 and 1,000 agents, shorter L measurements")
    parser.add_argument("--timeout", type=float, default=M_TIMEOUT_S,
                        help="seconds one megaagent run (M) may take before it is reported as "
                             "failed (default: %(default)g)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="markdown table (default: %(default)s)")
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

    command = "python -m bench.run " + shlex.join(argv if argv is not None else sys.argv[1:])
    lines = [r.to_json() for j in jobs for r in j.results] + [r.to_json() for r in extra]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(markdown(table_rows, jobs, command.strip(), started, lines))
    tmp.replace(args.out)
    console.print(f"[dim]table written to {args.out}[/dim]")
    return 1 if any(j.error for j in jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
