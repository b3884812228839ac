"""LangGraph on the shared workloads W1, W2 and W5 (../shared/WORKLOADS.md).

Runs inside bench/.anchors/langgraph/ (never imports tether), from the repo root:

    python -m bench.anchors.langgraph_w W1|W2|W5 sqlite|postgres [runs]

and prints one JSON line per result (system "langgraph"). LangGraph is used through its public
API: a `StateGraph` compiled with a checkpointer, `invoke`/`ainvoke(..., durability="sync")`
(each checkpoint is written before the next super-step starts), `interrupt()` and
`Command(resume=...)`. Checkpointers: `SqliteSaver` / `PostgresSaver` (W1, sequential and
synchronous) and `AsyncSqliteSaver` / `AsyncPostgresSaver` (W2, W5, concurrent runs on one
event loop). The savers are subclassed only to time their `put`/`aput` (the checkpoint write).
"""

from __future__ import annotations

import asyncio
import operator
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from bench.anchors.common import (
    BACKENDS,
    W1_STEPS,
    W1_THREADS,
    W2_STEPS,
    W5_RUNS,
    bench_db,
    current_rss_mib,
    db_bytes,
    emit,
    exit_on_sigterm,
    message,
    peak_rss_mib,
    percentile,
    result,
    sqlite_path,
    suffix,
    w2_deadline,
    w2_delays,
)

SYSTEM = "langgraph"
W5_CHUNK = 1000  # ainvoke calls gathered at once to reach the interrupt, as tether's W5 starts
W5_RESUME_CHUNK = 500  # Command(resume=...) calls in flight at once, as tether's W5 resumes
PHASE_DEADLINE = 600.0
# AsyncPostgresSaver on a pool (the docs' production setup) rather than one connection: with
# many concurrent runs one connection serializes every checkpoint behind the saver's lock.
PG_POOL_SIZE = int(os.environ.get("BENCH_LANGGRAPH_PG_POOL", "20"))
PG_PIPELINE = os.environ.get("BENCH_LANGGRAPH_PG_PIPELINE", "0") == "1"

puts: list[tuple[str, float, float]] = []  # (thread_id, called, returned) of each checkpoint write


def _thread(config: Any) -> str:
    return str(config["configurable"]["thread_id"])


class TimedSqliteSaver(SqliteSaver):
    def put(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = super().put(config, *args, **kwargs)
        puts.append((_thread(config), t0, time.perf_counter()))
        return out


class TimedPostgresSaver(PostgresSaver):
    def put(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = super().put(config, *args, **kwargs)
        puts.append((_thread(config), t0, time.perf_counter()))
        return out


@contextmanager
def sync_saver(url: str) -> Iterator[Any]:
    if url.startswith("sqlite"):
        with TimedSqliteSaver.from_conn_string(sqlite_path(url)) as saver:
            saver.setup()
            yield saver
    else:
        with TimedPostgresSaver.from_conn_string(url, pipeline=PG_PIPELINE) as saver:
            saver.setup()
            yield saver


@asynccontextmanager
async def async_saver(url: str) -> AsyncIterator[Any]:
    if url.startswith("sqlite"):
        async with AsyncSqliteSaver.from_conn_string(sqlite_path(url)) as saver:
            await saver.setup()
            yield saver
        return
    if PG_POOL_SIZE <= 1:
        async with AsyncPostgresSaver.from_conn_string(url, pipeline=PG_PIPELINE) as saver:
            await saver.setup()
            yield saver
        return
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(url, min_size=PG_POOL_SIZE, max_size=PG_POOL_SIZE,
                                   kwargs=kwargs, open=False) as pool:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        yield saver


# -- W1: checkpoint log ----------------------------------------------------------------------


class W1State(TypedDict):
    messages: Annotated[list[str], operator.add]


def w1_step(state: W1State, config: RunnableConfig) -> dict[str, list[str]]:
    return {"messages": [message(_thread(config), len(state["messages"]) + 1)]}


def w1_route(state: W1State) -> str:
    return "step" if len(state["messages"]) < W1_STEPS else END


def w1_graph(saver: Any) -> Any:
    builder = StateGraph(W1State)
    builder.add_node("step", w1_step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", w1_route)
    return builder.compile(checkpointer=saver)


def w1(backend: str) -> list[dict[str, object]]:
    with bench_db(backend, "langgraph_bench") as (_, url):
        with sync_saver(url) as saver:
            graph = w1_graph(saver)

            def run(tid: str) -> int:
                cfg = {"configurable": {"thread_id": tid}, "recursion_limit": 100}
                out = graph.invoke({"messages": []}, cfg, durability="sync")
                return len(out["messages"])

            run("warmup")
            puts.clear()
            t0 = time.perf_counter()
            for i in range(W1_THREADS):
                tid = f"w1-{i:04d}"
                n = run(tid)
                if n != W1_STEPS:
                    raise RuntimeError(f"W1 run {tid} ended with {n} messages")
            wall = time.perf_counter() - t0
        size = db_bytes(url)
    lat = [b - a for _, a, b in puts]
    by_thread: dict[str, list[float]] = {}
    for tid, _, end in puts:
        by_thread.setdefault(tid, []).append(end)
    cycles = [e[i] - e[i - 1] for e in by_thread.values() for i in range(1, len(e))]
    steps = W1_THREADS * W1_STEPS

    def r(metric: str, value: float, unit: str) -> dict[str, object]:
        return result(SYSTEM, backend, "W1", metric, value, unit)

    return [
        r("wall_s", round(wall, 3), "s"),
        r("checkpoints_per_s", round(steps / wall, 1), "1/s"),
        r("checkpoint_writes", len(puts), "count"),
        r("latency_p50_ms", round(percentile(lat, 0.50) * 1e3, 3), "ms"),
        r("latency_p99_ms", round(percentile(lat, 0.99) * 1e3, 3), "ms"),
        r("step_p50_ms", round(percentile(cycles, 0.50) * 1e3, 3), "ms"),
        r("step_p99_ms", round(percentile(cycles, 0.99) * 1e3, 3), "ms"),
        r("bytes_on_disk", size, "bytes"),
        r("peak_rss_mib", round(peak_rss_mib(), 1), "MiB"),
    ]


# -- W2: concurrent runs ---------------------------------------------------------------------


class W2State(TypedDict):
    delays: list[float]
    replies: Annotated[list[str], operator.add]


async def w2_llm(state: W2State) -> dict[str, list[str]]:
    await asyncio.sleep(state["delays"][len(state["replies"])])  # the simulated LLM call
    return {"replies": ["ok"]}


def w2_route(state: W2State) -> str:
    return "llm" if len(state["replies"]) < W2_STEPS else END


def w2_graph(saver: Any) -> Any:
    builder = StateGraph(W2State)
    builder.add_node("llm", w2_llm)
    builder.add_edge(START, "llm")
    builder.add_conditional_edges("llm", w2_route)
    return builder.compile(checkpointer=saver)


async def w2_async(url: str, runs: int) -> float:
    delays = [w2_delays(i) for i in range(runs)]
    async with async_saver(url) as saver:
        graph = w2_graph(saver)

        async def run(i: int) -> int:
            cfg = {"configurable": {"thread_id": f"w2-{i:05d}"}, "recursion_limit": 100}
            out = await graph.ainvoke({"delays": delays[i], "replies": []}, cfg,
                                      durability="sync")
            return len(out["replies"])

        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(w2_deadline(runs)):
                done = await asyncio.gather(*(run(i) for i in range(runs)))
        except TimeoutError:
            raise RuntimeError(f"W2: {runs} runs not all finished within "
                               f"{w2_deadline(runs):.0f} s of the first start") from None
        wall = time.perf_counter() - t0
    bad = [n for n in done if n != W2_STEPS]
    if bad:
        raise RuntimeError(f"W2: {len(bad)} runs did not complete {W2_STEPS} steps")
    return wall


def w2(backend: str, runs: int) -> list[dict[str, object]]:
    ideal = max(sum(w2_delays(i)) for i in range(runs))
    with bench_db(backend, "langgraph_bench") as (_, url):
        wall = asyncio.run(w2_async(url, runs))
    s = suffix(runs)

    def r(metric: str, value: float, unit: str) -> dict[str, object]:
        return result(SYSTEM, backend, "W2", f"{metric}_{s}", value, unit)

    return [
        r("wall_s", round(wall, 3), "s"),
        r("ideal_s", round(ideal, 3), "s"),
        r("wall_over_ideal", round(wall / ideal, 3), "x"),
        r("peak_rss_mib", round(peak_rss_mib(), 1), "MiB"),
    ]


# -- W5: suspended runs ----------------------------------------------------------------------


class W5State(TypedDict, total=False):
    i: int
    answer: Any


def w5_ask(state: W5State) -> dict[str, Any]:
    answer = interrupt({"question": "approve?", "i": state["i"]})
    return {"answer": answer}


def w5_graph(saver: Any) -> Any:
    builder = StateGraph(W5State)
    builder.add_node("ask", w5_ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=saver)


def _cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


async def w5_async(url: str, runs: int) -> dict[str, float]:
    fig: dict[str, float] = {}
    async with async_saver(url) as saver:
        graph = w5_graph(saver)
        # Warm-up outside the clock: one run through interrupt, resume and finish.
        out = await graph.ainvoke({"i": -1}, _cfg("warmup"), durability="sync")
        assert "__interrupt__" in out, out
        out = await graph.ainvoke(Command(resume={"approved": True, "i": -1}), _cfg("warmup"),
                                  durability="sync")
        assert out["answer"] == {"approved": True, "i": -1}, out
        await asyncio.sleep(0.5)
        fig["idle_rss_mib"] = current_rss_mib()

        async def start(i: int) -> None:
            out = await graph.ainvoke({"i": i}, _cfg(f"w5-{i:05d}"), durability="sync")
            if "__interrupt__" not in out:
                raise RuntimeError(f"W5: run {i} did not stop at the interrupt: {out}")

        t0 = time.perf_counter()
        async with asyncio.timeout(PHASE_DEADLINE):
            for lo in range(0, runs, W5_CHUNK):
                await asyncio.gather(*(start(i) for i in range(lo, min(lo + W5_CHUNK, runs))))
        # ainvoke returns once the interrupt's checkpoint is written (durability="sync"):
        # every run is suspended when the last call returns.
        fig["suspend_s"] = time.perf_counter() - t0
        await asyncio.sleep(0.5)
        fig["suspended_rss_mib"] = current_rss_mib()

        async def resume(i: int) -> None:
            out = await graph.ainvoke(Command(resume={"approved": True, "i": i}),
                                      _cfg(f"w5-{i:05d}"), durability="sync")
            if out.get("answer") != {"approved": True, "i": i}:
                raise RuntimeError(f"W5: run {i} finished with {out}")

        t1 = time.perf_counter()
        async with asyncio.timeout(PHASE_DEADLINE):
            for lo in range(0, runs, W5_RESUME_CHUNK):
                await asyncio.gather(*(resume(i)
                                       for i in range(lo, min(lo + W5_RESUME_CHUNK, runs))))
        fig["resume_finish_s"] = time.perf_counter() - t1
        fig["finished_rss_mib"] = current_rss_mib()
        for i in random.Random(5).sample(range(runs), min(runs, 20)):
            state = await graph.aget_state(_cfg(f"w5-{i:05d}"))
            if state.values.get("answer") != {"approved": True, "i": i} or state.next:
                raise RuntimeError(f"W5: run {i}'s stored state is {state.values}")
    return fig


def w5(backend: str, runs: int) -> list[dict[str, object]]:
    with bench_db(backend, "langgraph_bench") as (_, url):
        fig = asyncio.run(w5_async(url, runs))
    fig["rss_delta_mib"] = fig["suspended_rss_mib"] - fig["idle_rss_mib"]
    fig["peak_rss_mib"] = peak_rss_mib()
    s = suffix(runs)
    units = {"suspend_s": "s", "idle_rss_mib": "MiB", "suspended_rss_mib": "MiB",
             "rss_delta_mib": "MiB", "resume_finish_s": "s", "finished_rss_mib": "MiB",
             "peak_rss_mib": "MiB"}
    return [result(SYSTEM, backend, "W5", f"{k}_{s}", round(fig[k], 3), u)
            for k, u in units.items()]


# -- entry point -----------------------------------------------------------------------------


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3) or argv[1] not in BACKENDS:
        raise SystemExit("usage: python -m bench.anchors.langgraph_w W1|W2|W5 sqlite|postgres "
                         "[runs]")
    exit_on_sigterm()
    workload, backend = argv[0], argv[1]
    n = int(argv[2]) if len(argv) == 3 else None
    if workload == "W1":
        rows = w1(backend)
    elif workload == "W2":
        rows = w2(backend, n or 1000)
    elif workload == "W5":
        rows = w5(backend, n or W5_RUNS)
    else:
        raise SystemExit(f"unknown workload {workload!r}: W1, W2 or W5")
    for row in rows:
        emit(row)


if __name__ == "__main__":
    main(sys.argv[1:])
