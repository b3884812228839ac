"""The megaagent example (examples/megaagent/run.py) from two checkouts, interleaved: the
wall time of 10,000 agents on each store with 1 and 2 `tether worker` processes (issue 35
goal 7: Postgres at least SQLite's rate with one process, and faster with two).

    python -m bench.mega_pairs --before /path/to/base/checkout [--pairs 3] [--agents 10000]
                               [--backends sqlite,postgres] [--workers 1,2] [--kill 0]

Each run is the example's script (this checkout's, which hands PYTHONPATH on to its worker
processes) in a fresh process with PYTHONPATH set to that checkout's src/, on a fresh
database (a file in a temporary directory, or a new Postgres database on $TETHER_BENCH_PG,
default postgresql://postgres@127.0.0.1:5432), the order within a pair alternating. The
script checks that every result was counted once and exits non-zero otherwise (then so does
this). Prints each run's wall time, then per (store, processes) the median of each side,
after/before, the messages per second, each store's rate over SQLite's with one process
(measured in the same run) and the CPU seconds the worker processes used.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent.parent
PG = os.environ.get("TETHER_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")


def _database(backend: str, tmp: str) -> tuple[str, str | None]:
    """(url, Postgres database name to drop afterwards)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp}/mega-{uuid.uuid4().hex[:8]}.db", None
    name = f"tether_mega_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}".encode())
    return f"{PG}/{name}", name


def _drop(name: str | None) -> None:
    if name is None:
        return
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())


def run_once(checkout: Path, backend: str, agents: int, workers: int, kill: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    with tempfile.TemporaryDirectory() as tmp:
        url, name = _database(backend, tmp)
        try:
            # (this checkout's script on both sides: it passes PYTHONPATH on to its workers)
            cmd = [sys.executable, str(HERE / "examples" / "megaagent" / "run.py"),
                   "--db", url, "--agents", str(agents), "--workers", str(workers),
                   "--timeout", "900"]
            if kill:
                cmd += ["--kill", str(kill)]
            out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[1:])} exited {out.returncode}: "
                                   f"{(out.stdout + out.stderr)[-800:]}")
            fig = ast.literal_eval(out.stdout.strip().splitlines()[-1])
        finally:
            _drop(name)
    return {"wall_s": float(fig["wall_s"]), "messages_per_s": float(fig["messages_per_s"]),
            "cpu_s": sum(float(w.get("cpu_s", 0)) for w in fig.get("workers", []))}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.mega_pairs")
    p.add_argument("--before", type=Path, required=True)
    p.add_argument("--after", type=Path, default=HERE)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--agents", type=int, default=10_000)
    p.add_argument("--backends", default="sqlite,postgres")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--kill", type=int, default=0)
    args = p.parse_args(argv)
    console = Console(stderr=True)
    cells = [(b, int(w)) for b in args.backends.split(",") for w in args.workers.split(",")]
    got: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for i in range(args.pairs):
        for backend, workers in cells:
            order = [("before", args.before), ("after", args.after)]
            for side, checkout in order if i % 2 == 0 else order[::-1]:
                fig = run_once(checkout, backend, args.agents, workers, args.kill)
                got.setdefault((backend, workers, side), []).append(fig)
                console.print(f"pair {i + 1} {backend} x{workers} {side}: {fig['wall_s']:.1f} s "
                              f"({fig['messages_per_s']:,.0f} messages/s, worker CPU "
                              f"{fig['cpu_s']:.1f} s)")
    table = Table(title=f"megaagent, {args.agents:,} agents (kill {args.kill}), "
                        f"medians of {args.pairs} interleaved pairs")
    for col in ("store", "processes", "before s", "after s", "after/before",
                "after messages/s", "after vs sqlite x1", "after worker CPU s"):
        table.add_column(col)

    def med(backend: str, workers: int, side: str, key: str) -> float:
        return statistics.median(f[key] for f in got[(backend, workers, side)])

    ref = (med("sqlite", 1, "after", "messages_per_s") if ("sqlite", 1, "after") in got
           else None)
    for backend, workers in cells:
        before, after = med(backend, workers, "before", "wall_s"), med(backend, workers, "after", "wall_s")
        rate = med(backend, workers, "after", "messages_per_s")
        table.add_row(backend, str(workers), f"{before:.1f}", f"{after:.1f}",
                      f"{after / before:.2f}x", f"{rate:,.0f}",
                      f"{rate / ref:.2f}x" if ref else "",
                      f"{med(backend, workers, 'after', 'cpu_s'):.1f}")
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
