"""TetherSaver against LangGraph's own SqliteSaver / PostgresSaver on W1 (issue 18).

The W1 graph of the LangGraph anchor harness (bench/anchors/langgraph_w.py): one node appends
a 256-byte message to `messages: Annotated[list[str], operator.add]` and loops until there
are 20; 200 threads one after the other with the sync `graph.invoke(..., durability="sync")`.
TetherSaver runs here, in the project's venv (`with TetherSaver.from_conn_string(url) as
saver: saver.setup()`); LangGraph's savers run in the anchor venv at its pinned versions (the
anchor harness itself, in a subprocess). Each gets a fresh database, removed afterwards.

    .venv/bin/python -m bench.langgraph_saver                     # both stores, with anchors
    .venv/bin/python -m bench.langgraph_saver --repeat 3          # alternating, medians
    .venv/bin/python -m bench.langgraph_saver --backend sqlite --threads 50 --no-anchors

Prints a table: checkpoints/s (super-steps over wall time, as the anchor counts them), the
median put latency, and bytes on disk (SQLite: the file with its WAL; Postgres: every table's
pg_total_relation_size, tether's empty tables included).
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from bench.anchors.common import W1_STEPS, W1_THREADS, bench_db, db_bytes, message, percentile
from tether.langgraph import TetherSaver

ROOT = Path(__file__).resolve().parent.parent
ANCHOR_PYTHON = ROOT / "bench" / ".anchors" / "langgraph" / "bin" / "python"
puts: list[float] = []


class TimedTetherSaver(TetherSaver):
    def put(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = super().put(*args, **kwargs)
        puts.append(time.perf_counter() - t0)
        return out


class W1State(TypedDict):
    messages: Annotated[list[str], operator.add]


def _thread(config: RunnableConfig) -> str:
    return str(config["configurable"]["thread_id"])


def w1_step(state: W1State, config: RunnableConfig) -> dict[str, list[str]]:
    return {"messages": [message(_thread(config), len(state["messages"]) + 1)]}


def w1_route(state: W1State) -> str:
    return "step" if len(state["messages"]) < W1_STEPS else END


def tether_w1(backend: str, threads: int) -> dict[str, float]:
    with bench_db(backend, "tether_lg_bench") as (_, url):
        with TimedTetherSaver.from_conn_string(url) as saver:
            saver.setup()
            builder = StateGraph(W1State)
            builder.add_node("step", w1_step)
            builder.add_edge(START, "step")
            builder.add_conditional_edges("step", w1_route)
            graph = builder.compile(checkpointer=saver)

            def run(tid: str) -> None:
                cfg: RunnableConfig = {"configurable": {"thread_id": tid}, "recursion_limit": 100}
                out = graph.invoke({"messages": []}, cfg, durability="sync")
                if len(out["messages"]) != W1_STEPS:
                    raise RuntimeError(f"W1 run {tid} ended with {len(out['messages'])} messages")

            run("warmup")
            puts.clear()
            t0 = time.perf_counter()
            for i in range(threads):
                run(f"w1-{i:04d}")
            wall = time.perf_counter() - t0
        size = db_bytes(url)
    return {"checkpoints_per_s": threads * W1_STEPS / wall, "bytes_on_disk": size,
            "latency_p50_ms": percentile(puts, 0.5) * 1e3, "wall_s": wall}


def anchor_w1(backend: str, threads: int) -> dict[str, float] | str:
    if not ANCHOR_PYTHON.exists():
        return ("no anchor venv: python -c \"from bench.anchors.venvs import ensure_venv; "
                "ensure_venv('langgraph')\"")
    if threads != W1_THREADS:
        return f"the anchor runs {W1_THREADS} threads only"
    proc = subprocess.run([str(ANCHOR_PYTHON), "-m", "bench.anchors.langgraph_w", "W1", backend],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return f"anchor failed: {proc.stderr.strip().splitlines()[-1:]}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["metric"]: float(r["value"]) for r in rows}


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.langgraph_saver",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="sqlite,postgres",
                        help="sqlite, postgres or both (comma-separated)")
    parser.add_argument("--threads", type=int, default=W1_THREADS,
                        help=f"W1 threads (default {W1_THREADS}; the anchor runs only that)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each saver, alternating (medians are shown)")
    parser.add_argument("--no-anchors", action="store_true", help="TetherSaver only")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    if not backends or any(b not in ("sqlite", "postgres") for b in backends):
        parser.error(f"--backend takes sqlite, postgres or both, got {args.backend!r}")
    if args.threads < 1 or args.repeat < 1:
        parser.error("--threads and --repeat must be at least 1")
    lines = [f"W1: {args.threads} threads x {W1_STEPS} super-steps, 256-byte messages, "
             f"graph.invoke(durability='sync'); median of {args.repeat} alternating run(s)", "",
             "| store | saver | checkpoints/s | put p50 ms | bytes on disk | vs LangGraph's |",
             "|---|---|---|---|---|---|"]
    for backend in backends:
        ours: list[dict[str, float]] = []
        theirs: list[dict[str, float]] = []
        note = ""
        for _ in range(args.repeat):
            ours.append(tether_w1(backend, args.threads))
            print(f"{backend} TetherSaver: {ours[-1]}", file=sys.stderr, flush=True)
            if not args.no_anchors and not note:
                got = anchor_w1(backend, args.threads)
                if isinstance(got, str):
                    note = got
                else:
                    theirs.append(got)
                    print(f"{backend} LangGraph's: {got}", file=sys.stderr, flush=True)
        name = "SqliteSaver" if backend == "sqlite" else "PostgresSaver"
        cps, size = _median(ours, "checkpoints_per_s"), _median(ours, "bytes_on_disk")
        versus = ""
        if theirs:
            versus = (f"{cps / _median(theirs, 'checkpoints_per_s'):.2f}x as fast, "
                      f"{size / _median(theirs, 'bytes_on_disk'):.2f}x the bytes")
        lines.append(f"| {backend} | TetherSaver | {cps:,.1f} | "
                     f"{_median(ours, 'latency_p50_ms'):.3f} | {int(size):,} | {versus} |")
        if theirs:
            lines.append(f"| {backend} | {name} | {_median(theirs, 'checkpoints_per_s'):,.1f} | "
                         f"{_median(theirs, 'latency_p50_ms'):.3f} | "
                         f"{int(_median(theirs, 'bytes_on_disk')):,} | |")
        elif note:
            lines.append(f"| {backend} | {name} | | | | {note} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
