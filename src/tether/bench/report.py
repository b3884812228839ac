"""The results as a table: the goal of each metric and whether it is met, the ratios taken
across workload processes of the same run, and the markdown file with the machine's details."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import eventloop
from .common import Result, pg_admin_url

if TYPE_CHECKING:
    from .jobs import Job

LOAD_AT_START = os.getloadavg()[0]

# (workload, metric) -> backend -> (comparison, threshold, goal text). From issues 2 (W1, W2),
# 4 (W5), 3 (E) and 5 (M).
Goal = tuple[str, float, str]
GOALS: dict[tuple[str, str], dict[str, Goal]] = {
    ("W1", "checkpoints_per_s"): {"sqlite": (">=", 2000, ">= 2,000/s"),
                                  "postgres": (">=", 1500, ">= 1,500/s")},
    ("W1", "bytes_on_disk"): {b: ("<=", 2.5e6, "<= 2.5 MB") for b in ("sqlite", "postgres")},
    # Issue 35 goal 4: against the raw commits taken with W1, run by run.
    ("W1", "checkpoints_vs_raw"): {b: (">=", 0.85, ">= 0.85x") for b in ("sqlite", "postgres")},
    ("W2", "wall_over_ideal_1k"): {b: ("<=", 1.5, "<= 1.5x") for b in ("sqlite", "postgres")},
    ("W2", "wall_over_ideal_10k"): {b: ("<=", 5.0, "<= 5x") for b in ("sqlite", "postgres")},
    ("W2", "peak_rss_mib_10k"): {b: ("<=", 1024, "<= 1 GiB") for b in ("sqlite", "postgres")},
    # Issue 15: routing by deployment weights must not slow starts (two versions at 50/50).
    ("R", "two_over_one_1k"): {b: ("<=", 1.1, "<= 1.1x") for b in ("sqlite", "postgres")},
    ("R", "two_over_one_10k"): {b: ("<=", 1.1, "<= 1.1x") for b in ("sqlite", "postgres")},
    ("W5", "suspend_s_10k"): {b: ("<=", 5.0, "<= 5 s") for b in ("sqlite", "postgres")},
    ("W5", "rss_delta_mib_10k"): {b: ("<=", 50.0, "<= 50 MiB") for b in ("sqlite", "postgres")},
    ("W5", "resume_finish_s_10k"): {b: ("<=", 5.0, "<= 5 s") for b in ("sqlite", "postgres")},
    ("E", "effects_per_s"): {"postgres": (">=", 5000, ">= 5,000/s")},
    ("M", "cost_ratio_10k_over_100"): {b: ("<=", 1.5, "<= 1.5x") for b in ("sqlite", "postgres")},
    # Guarantees 4 and 5 (DESIGN.md): no run lost; effects through the outbox happen once.
    ("W3", "lost_runs"): {b: ("<=", 0, "0") for b in ("sqlite", "postgres")},
    ("W3", "lost_runs_outbox"): {b: ("<=", 0, "0") for b in ("sqlite", "postgres")},
    ("W3", "duplicate_effects_outbox"): {b: ("<=", 0, "0") for b in ("sqlite", "postgres")},
}
# Anchor systems (bench/anchors) and how their names read in a table header.
ANCHOR_NAMES = {"langgraph": "LangGraph", "dbos": "DBOS"}
# The metric giving a workload's size where its metric names do not carry it: the anchors'
# figures are compared with tether's only at the same size (--quick sizes may differ).
SIZE_METRICS = {"W3": "runs", "W4": "jobs"}
# Metrics where fewer is better and a ratio means nothing (0 is the goal): shown as a difference.
FEWER_IS_BETTER = ("repeated_steps", "duplicate_effects", "lost_runs")
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


Row = tuple[str, ...]
HEAD = ("Backend", "Workload", "Metric", "Value", "Unit", "Goal", "Met")
AnchorKey = tuple[str, str, str, str]  # system, backend, workload, metric


def anchor_results(dicts: list[Mapping[str, Any]]) -> tuple[dict[AnchorKey, tuple[float, str]],
                                                             list[str]]:
    """The anchors' JSON-line dicts by (system, backend, workload, metric) -> (value, unit),
    and the systems in the order they first appear. Dicts without a numeric value (an error
    line, say) are left out of the index."""
    index: dict[AnchorKey, tuple[float, str]] = {}
    systems: list[str] = []
    for d in dicts:
        system = str(d.get("system", "?"))
        if system not in systems:
            systems.append(system)
        value = d.get("value")
        if (anchor_error(d) is not None or isinstance(value, bool)
                or not isinstance(value, int | float)):
            continue
        key = (system, str(d.get("backend")), str(d.get("workload")), str(d.get("metric")))
        index[key] = (float(value), str(d.get("unit", "")))
    return index, systems


def anchor_error(d: Mapping[str, Any]) -> str | None:
    """The message of an anchor's error line (metric "error", the text in "unit"; or an
    "error" key), else None."""
    if "error" in d:
        return str(d["error"])
    if d.get("metric") == "error":
        return str(d.get("unit") or "failed")
    return None


def direction(metric: str, unit: str) -> tuple[bool, str, str] | None:
    """(higher is better, what tether is when its ratio is above 1, what when below), or None
    when a ratio of this metric means nothing."""
    if unit == "1/s":
        return True, "faster", "slower"
    if unit in ("s", "ms") or (unit == "x" and metric.startswith(("wall_over_ideal",
                                                                  "cost_ratio"))):
        return False, "faster", "slower"
    if unit == "MiB":
        return False, "less memory", "more memory"
    if unit == "bytes":
        return False, "less disk", "more disk"
    return None


def compare(metric: str, unit: str, tether: float, anchor: float) -> str:
    """How tether compares with an anchor on one metric, read as "tether is ...":
    "3.20x faster", "1.50x more memory", "12 fewer", "same"."""
    if metric.startswith(FEWER_IS_BETTER):
        diff = anchor - tether
        if diff == 0:
            return "same"
        return f"{fmt(abs(diff), 'count')} {'fewer' if diff > 0 else 'more'}"
    how = direction(metric, unit)
    if how is None or tether <= 0 or anchor <= 0:
        return ""
    higher_better, better, worse = how
    ratio = tether / anchor if higher_better else anchor / tether
    if ratio >= 1:
        return f"{ratio:,.2f}x {better}"
    return f"{1 / ratio:,.2f}x {worse}"


def anchor_cell(index: Mapping[AnchorKey, tuple[float, str]], system: str, r: Result,
                size: float | None = None) -> str:
    """The anchor's value of r's metric and tether's standing against it, or "". `size`:
    tether's size of r's workload (SIZE_METRICS); an anchor run at another size is shown
    but not compared."""
    found = index.get((system, r.backend, r.workload, r.metric))
    if found is None:
        return ""
    value, unit = found
    shown = fmt(value, unit or r.unit)
    noun = SIZE_METRICS.get(r.workload)
    theirs = index.get((system, r.backend, r.workload, noun)) if noun else None
    if size is not None and theirs is not None and theirs[0] != size:
        return shown if r.metric == noun else f"{shown} (at {fmt(theirs[0], 'count')} {noun})"
    text = compare(r.metric, r.unit, r.value, value)
    return f"{shown} (tether {text})" if text else shown


def rows(jobs: list[Job], extra: list[Result],
         anchors: Sequence[Mapping[str, Any]] | None = None) -> tuple[Row, list[Row]]:
    """The table's header and rows; each cross-process ratio follows the last job of its
    backend and workload. With anchor dicts, one more column per anchor system: its value
    of the same (backend, workload, metric) and tether's ratio to it; anchor metrics tether
    did not report follow as rows of their own."""
    index, systems = anchor_results(list(anchors or []))
    head = HEAD + tuple(f"{ANCHOR_NAMES.get(s, s)} (tether vs it)" for s in systems)
    out: list[Row] = []
    last = {(j.backend, j.workload): i for i, j in enumerate(jobs)}
    seen: set[tuple[str, str, str]] = set()
    blank = ("",) * len(systems)
    sizes = {(r.backend, r.workload): r.value for j in jobs for r in j.results
             if SIZE_METRICS.get(r.workload) == r.metric}
    for i, job in enumerate(jobs):
        attached = [r for r in extra if last.get((r.backend, r.workload)) == i]
        for r in [*job.results, *attached]:
            size = sizes.get((r.backend, r.workload))
            goal, ok = check(r)
            met = "" if ok is None else ("yes" if ok else "NO")
            seen.add((r.backend, r.workload, r.metric))
            out.append((r.backend, job.label, r.metric, fmt(r.value, r.unit), r.unit, goal, met,
                        *(anchor_cell(index, s, r, size) for s in systems)))
        if job.error:
            out.append((job.backend, job.label, "error", job.error, "", "", "FAILED", *blank))
    for (system, backend, workload, metric), (value, unit) in index.items():
        if (backend, workload, metric) in seen:
            continue
        cells = tuple(fmt(value, unit) if s == system else "" for s in systems)
        out.append((backend, workload, metric, "", unit, "", "", *cells))
    for d in anchors or []:
        if (text := anchor_error(d)) is not None:
            cells = tuple(text if s == d.get("system") else "" for s in systems)
            out.append((str(d.get("backend", "")), str(d.get("workload", "")), "error", "", "",
                        "", "", *cells))
    return head, out


def anchor_line(d: Mapping[str, Any]) -> str:
    return json.dumps(dict(d))


def machine() -> list[str]:
    info = [f"Python {platform.python_version()} on {platform.system()} {platform.release()}",
            f"{os.cpu_count()} CPUs", f"SQLite {sqlite3.sqlite_version}",
            f"event loop {eventloop.loop_name()} (TETHER_LOOP)",
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


def markdown(head: Row, table_rows: list[Row], jobs: list[Job], command: str, started: str,
             lines: list[str]) -> str:
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
