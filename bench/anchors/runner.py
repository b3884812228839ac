"""Run the comparison anchors (LangGraph, DBOS Transact) on the shared workloads.

Runs in the project's venv with the standard library only: each (system, backend, workload)
is a fresh subprocess of that anchor's own venv (bench/.anchors/<system>/bin/python -m
bench.anchors.<harness> ...), whose JSON lines are checked and passed on. A workload that
fails or times out gives one line with metric "error" instead of stopping the run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .venvs import SYSTEMS, ensure_venv, log, venv_python

ROOT = Path(__file__).resolve().parent.parent.parent  # the repo root: harnesses run from here
BACKENDS = ("sqlite", "postgres")
WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
HARNESS = {"langgraph": "bench.anchors.langgraph_w", "dbos": "bench.anchors.dbos_w"}
SUPPORTED = {"langgraph": ("W1", "W2", "W5"), "dbos": WORKLOADS}
KEYS = ("system", "backend", "workload", "metric", "value", "unit")
ERROR_TEXT_MAX = 300

# Sizes (WORKLOADS.md), and the smaller ones of --quick.
FULL = {"W2": (1000, 10_000), "W3": (100,), "W4": (20_000,), "W5": (10_000,)}
QUICK = {"W2": (1000,), "W3": (20,), "W4": (2000,), "W5": (1000,)}
TIMEOUT_S = 600.0  # per workload process
BIG_TIMEOUT_S = 900.0  # W2 and W5 at 10,000 runs (the harnesses give up after 600 s)
QUICK_TIMEOUT_S = 300.0
TERM_GRACE_S = 30.0  # after SIGTERM on a timeout, before SIGKILL


@dataclass(frozen=True, slots=True)
class Job:
    system: str
    backend: str
    workload: str
    size: int | None
    timeout: float

    def argv(self, python: str) -> list[str]:
        args = [python, "-m", HARNESS[self.system], self.workload, self.backend]
        return args if self.size is None else [*args, str(self.size)]

    def label(self) -> str:
        size = f" ({self.size:,})" if self.size is not None else ""
        return f"{self.system} {self.backend} {self.workload}{size}"


def split_list(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    """A comma-separated choice of `allowed` (case-insensitive, order kept, duplicates
    dropped); raises argparse.ArgumentTypeError on an unknown item."""
    out: list[str] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        match = [a for a in allowed if a.lower() == item.lower()]
        if not match:
            raise argparse.ArgumentTypeError(f"unknown {what} {item!r}: choose from "
                                             f"{','.join(allowed)}")
        if match[0] not in out:
            out.append(match[0])
    if not out:
        raise argparse.ArgumentTypeError(f"no {what} given")
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.anchors", description=(
        "LangGraph (W1, W2, W5) and DBOS Transact (W1-W5) on the shared workloads, each in "
        "its own venv under bench/.anchors/; one JSON line per result on stdout."))
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   type=lambda s: split_list(s, SYSTEMS, "system"))
    p.add_argument("--backend", "--backends", dest="backends", default=",".join(BACKENDS),
                   type=lambda s: split_list(s, BACKENDS, "backend"))
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   type=lambda s: split_list(s, WORKLOADS, "workload"))
    p.add_argument("--quick", action="store_true",
                   help="W2 and W5 with 1,000 runs, W3 with 20 runs, W4 with 2,000 jobs")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds for each workload process (default 600, 900 at 10,000 "
                        "runs, 300 with --quick)")
    return p.parse_args(argv)


def plan(systems: list[str], backends: list[str], workloads: list[str], quick: bool,
         timeout: float | None = None) -> list[Job]:
    """The jobs in run order: per system and backend, the workloads as given (each size),
    except that the 10,000-run sizes go last of all, so the long ones do not hold up the
    rest. Workloads a system has no harness for (LangGraph's W3, W4) are left out."""
    sizes = QUICK if quick else FULL
    jobs: list[Job] = []
    late: list[Job] = []
    for system in systems:
        for backend in backends:
            for w in workloads:
                if w not in SUPPORTED.get(system, ()):
                    continue
                for size in sizes.get(w, (None,)):
                    big = size is not None and size >= 10_000 and w in ("W2", "W5")
                    t = timeout or (QUICK_TIMEOUT_S if quick else
                                    BIG_TIMEOUT_S if big else TIMEOUT_S)
                    job = Job(system, backend, w, size, t)
                    (late if big and w == "W2" else jobs).append(job)
    return jobs + late


def validate_line(line: str) -> dict[str, object] | None:
    """The result row of one harness output line, or None if the line is not a result in
    the WORKLOADS.md format (an object with exactly system, backend, workload, metric,
    a numeric value and a unit)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict) or tuple(sorted(row)) != tuple(sorted(KEYS)):
        return None
    value = row["value"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not all(isinstance(row[k], str) and row[k] for k in KEYS if k != "value"):
        return None
    if row["system"] not in SYSTEMS or row["backend"] not in BACKENDS:
        return None
    return {k: row[k] for k in KEYS}


def error_row(job: Job, text: str) -> dict[str, object]:
    text = " ".join(text.split())
    if job.size is not None:
        text = f"{job.workload} ({job.size:,}): {text}"
    if len(text) > ERROR_TEXT_MAX:
        text = text[:ERROR_TEXT_MAX - 3] + "..."
    return {"system": job.system, "backend": job.backend, "workload": job.workload,
            "metric": "error", "value": 0, "unit": text}


def last_error(stderr: str) -> str:
    """The last non-empty stderr line (a traceback's exception), for the error row."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "no output"


def run_job(job: Job, python: str) -> list[dict[str, object]]:
    log(f"{job.label()}: running")
    t0 = time.monotonic()
    proc = subprocess.Popen(job.argv(python), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=job.timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the harness then drops its database and temporary files.
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        rows = [r for r in map(validate_line, stdout.splitlines()) if r is not None]
        log(f"{job.label()}: timed out after {job.timeout:g} s")
        return [*rows, error_row(job, f"timed out after {job.timeout:g} s")]
    rows = [r for r in map(validate_line, stdout.splitlines()) if r is not None]
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        tail = "\n".join(stderr.splitlines()[-15:])
        log(f"{job.label()}: failed (exit {proc.returncode}) after {seconds:.1f} s\n{tail}")
        return [*rows, error_row(job, f"exit {proc.returncode}: {last_error(stderr)}")]
    if not rows:
        return [error_row(job, "no result lines")]
    log(f"{job.label()}: {len(rows)} results in {seconds:.1f} s")
    return rows


def run_anchors(systems: list[str], backends: list[str], workloads: list[str], quick: bool,
                timeout: float | None = None,
                on_row: Callable[[dict[str, object]], None] | None = None
                ) -> list[dict[str, object]]:
    """Install (or check) each system's venv, run every planned job in a fresh subprocess of
    it and return all result rows (error rows included). `on_row` sees each row as its job
    ends."""
    pythons: dict[str, str] = {}
    results: list[dict[str, object]] = []
    for system in systems:
        try:
            pythons[system] = str(ensure_venv(system))
        except Exception as exc:  # no venv: every job of this system is an error row
            log(f"{system}: venv setup failed: {exc}")
    for job in plan(systems, backends, workloads, quick, timeout):
        if job.system in pythons:
            rows = run_job(job, pythons[job.system])
        else:
            rows = [error_row(job, f"venv setup failed ({venv_python(job.system)})")]
        for row in rows:
            if on_row is not None:
                on_row(row)
            results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def emit(row: dict[str, object]) -> None:
        print(json.dumps(row), flush=True)

    rows = run_anchors(args.systems, args.backends, args.workloads, args.quick, args.timeout,
                       on_row=emit)
    return 1 if any(r["metric"] == "error" for r in rows) else 0
