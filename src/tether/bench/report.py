"""The results as a table: the goal of each metric and whether it is met, the ratios taken
across workload processes of the same run, and the markdown file with the machine's details."""

from __future__ import annotations

import os
import platform
import sqlite3
from typing import TYPE_CHECKING

from .common import Result, pg_admin_url

if TYPE_CHECKING:
    from .runner import Job

LOAD_AT_START = os.getloadavg()[0]

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

        with psycopg.connect(pg_admin_url(), autocommit=True, connect_timeout=3) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            fsync = conn.execute("SHOW fsync").fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()
            autovacuum = conn.execute("SHOW autovacuum").fetchone()
        info.append(f"Postgres {version[0] if version else '?'} (fsync={fsync[0] if fsync else '?'}, "
                    f"synchronous_commit={sync[0] if sync else '?'}, "
                    f"autovacuum={autovacuum[0] if autovacuum else '?'}: with it off, a fresh "
                    "table is never ANALYZEd during a run)")
    except Exception as exc:
        info.append(f"Postgres not reachable at {pg_admin_url()}: {exc}")
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
