"""Scaling out on one Postgres (issue 35 goal 10): throughput against the number of `tether
worker` processes, with what each step costs the workers and the database server itself, and
the model of where one primary saturates that `tether advise` plans with.

Each row drains RUNS queued runs of STEPS steps (no sleep: a step is its commit) with P worker
processes of concurrency C, on a fresh database; the P are interleaved over ROUNDS (1, 2, 4,
4, 2, 1, ...) and the table gives medians. The reference is the one-process row of the same
run (`x 1 process`). The server's cost: its backends' CPU time (/proc/<pid>/stat, so run this
on the database's machine), commits and rows written (pg_stat_database) and the WAL written
for the database (pg_walinspect), each over the steps committed.

    python -m bench.scale_out [--procs 1,2,4] [--rounds 3] [--runs 2000] [--steps 10]
                              [--concurrency 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from rich.console import Console
from rich.table import Table

from tether import eventloop
from tether.bench import scale


def fsync_ms(n: int = 200) -> tuple[float, float]:
    """(median, p90) ms of write(4 KiB) + fsync on the disk of the temporary directory."""
    fd, path = tempfile.mkstemp(prefix="tether_fsync_")
    try:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    return statistics.median(times), times[int(0.9 * (n - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", default="1,2,4", help="worker processes per row (1,2,4)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=scale.S_RUNS)
    ap.add_argument("--steps", type=int, default=scale.S_STEPS)
    ap.add_argument("--concurrency", type=int, default=scale.S_CONCURRENCY)
    args = ap.parse_args()
    procs = tuple(int(p) for p in args.procs.split(","))
    load0 = os.getloadavg()
    fs = fsync_ms()

    async def go() -> list[dict[str, float]]:
        rows = []
        for i in range(args.rounds):
            for p in procs if i % 2 == 0 else tuple(reversed(procs)):
                rows.append(await scale.scale_once(p, args.runs, args.steps, args.concurrency))
        return rows

    rows = eventloop.run(go())
    load1 = os.getloadavg()
    cores = os.cpu_count() or 1
    m = scale.model(rows, cores)
    by = {p: [r for r in rows if r["procs"] == p] for p in procs}

    def med(p: int, key: str) -> float:
        return statistics.median(r[key] for r in by[p])

    ref = med(procs[0], "steps_per_s")
    console = Console(width=160)
    t = Table(title=f"Worker processes on one Postgres: {args.runs:,} runs x {args.steps} "
                    f"steps, concurrency {args.concurrency} each, median of {args.rounds}")
    for col in ("processes", "steps/s", f"x {procs[0]} process", "worker CPU us/step",
                "DB CPU us/step", "commits/step", "rows/step", "WAL B/step",
                "CPU used (cores)"):
        t.add_column(col, justify="right")
    for p in procs:
        sps = med(p, "steps_per_s")
        used = sps * (med(p, "worker_cpu_us_per_step") + med(p, "db_cpu_us_per_step")) * 1e-6
        t.add_row(str(p), f"{sps:,.0f}", f"{sps / ref:.2f}x",
                  f"{med(p, 'worker_cpu_us_per_step'):.0f}", f"{med(p, 'db_cpu_us_per_step'):.0f}",
                  f"{med(p, 'commits_per_step'):.3f}", f"{med(p, 'rows_per_step'):.2f}",
                  f"{med(p, 'wal_bytes_per_step'):,.0f}", f"{used:.2f} of {cores}")
    console.print(t)
    both = cores / ((med(procs[-1], "worker_cpu_us_per_step") + m["db_cpu_us_per_step"]) * 1e-6)
    console.print(
        f"Model of one primary (the {procs[-1]}-process rows): {m['db_cpu_us_per_step']:.0f} us of "
        f"server CPU a step, so {cores} cores saturate at {m['steps_per_s']:,.0f} steps/s "
        f"({m['rows_per_s']:,.0f} rows/s at {m['rows_per_step']:.2f} rows a step; "
        f"{m['wal_mb_per_s']:.1f} MB/s of WAL at {m['wal_bytes_per_step']:,.0f} B a step), "
        f"when the workers run on other machines. Here the workers share the {cores} cores: "
        f"at most {both:,.0f} steps/s for workers and server together.")
    console.print(f"fsync (4 KiB, this disk): median {fs[0]:.2f} ms, p90 {fs[1]:.2f} ms; "
                  f"load average {load0[0]:.1f} before, {load1[0]:.1f} after; {cores} cores")
    console.print("rows: " + "; ".join(
        f"{int(r['procs'])}p {r['steps_per_s']:,.0f}/s db {r['db_cpu_us_per_step']:.0f}us "
        f"c/s {r['commits_per_step']:.3f}" for r in rows))


if __name__ == "__main__":
    main()
