"""A LangGraph agent that survives kill -9: its super-steps run on tether's workers.

    python examples/langgraph_durable.py           # on a fresh SQLite file, removed afterwards
    python examples/langgraph_durable.py --db URL  # on a database of yours

The graph is plain LangGraph: `research` calls a tool (slow, logged to a file so real calls
can be counted; through tether.langgraph.call, so each call is journaled) four times, looping
on itself; `approve` asks a person with LangGraph's
`interrupt()`; `publish` finishes. `tether.langgraph.agent` makes it a tether agent, so a
worker process runs it under a lease, one super-step per step, checkpointed by TetherSaver in
tether's database. This script starts 3 runs, starts a worker, SIGKILLs it mid-graph, twice,
and each time starts another; the interrupts then show up as tether interrupts (`tether
interrupts`, `GET /interrupts`) and are answered with `runtime.resume`. At the end it shows,
per run, that every super-step is once in LangGraph's checkpoint history and that the tool was
called again only for super-steps in flight at a kill.
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import tether
from tether.langgraph import TetherSaver, call
from tether.langgraph import agent as langgraph_agent

# Where the worker subprocesses log each tool call they start: main() chooses it.
TOOL_LOG = os.environ.get("LANGGRAPH_TOOL_LOG", "")
TOPICS = 4
TOOL_SECONDS = float(os.environ.get("LANGGRAPH_TOOL_SECONDS", "0.4"))


class State(TypedDict, total=False):
    question: str
    notes: Annotated[list[str], operator.add]
    verdict: str
    published: str


async def search_tool(thread_id: str, query: str) -> str:
    """The tool: slow, and logged when it starts, so a call cut short by a kill counts too."""
    if TOOL_LOG:
        with open(TOOL_LOG, "a") as f:
            f.write(f"{thread_id}|{query}\n")
    await asyncio.sleep(TOOL_SECONDS)
    return f"found: {query}"


async def research(state: State, config: RunnableConfig) -> dict[str, Any]:
    n = len(state.get("notes", []))
    # Journaled: a worker that takes over after a kill gets a finished call's result back.
    note = await call(search_tool, config["configurable"]["thread_id"],
                      f"{state['question']} #{n}")
    return {"notes": [note]}


def more_research(state: State) -> str:
    return "research" if len(state.get("notes", [])) < TOPICS else "approve"


def approve(state: State) -> dict[str, Any]:
    verdict = interrupt({"draft": " / ".join(state["notes"]), "ask": "publish? (yes/no)"})
    return {"verdict": str(verdict)}


def publish(state: State) -> dict[str, Any]:
    ok = state["verdict"] == "yes"
    return {"published": " / ".join(state["notes"]) if ok else "(withheld)"}


builder = StateGraph(State)
builder.add_node("research", research)
builder.add_node("approve", approve)
builder.add_node("publish", publish)
builder.add_edge(START, "research")
builder.add_conditional_edges("research", more_research)
builder.add_edge("approve", "publish")
builder.add_edge("publish", END)
graph = builder.compile()

support = langgraph_agent("langgraph_support", graph)


def make_runtime(db: str | None) -> tether.Runtime:
    return tether.Runtime(db, agents=[support], lease_ttl=2.0, poll_interval=0.1)


# The app of the worker subprocesses (`tether worker --app langgraph_durable:runtime --db
# URL`): the database is the one main() chose, given as --db.
runtime = make_runtime(None)


def _worker(db: str, tool_log: str) -> subprocess.Popen[bytes]:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "LANGGRAPH_TOOL_LOG": tool_log, "PYTHONPATH": path}
    return subprocess.Popen(
        [sys.executable, "-m", "tether", "worker", "--app", "langgraph_durable:runtime",
         "--db", db, "--concurrency", "10"], env=env, stdout=subprocess.DEVNULL)


async def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="A LangGraph agent that survives kill -9.")
    p.add_argument("--db", help="a database URL (default: a fresh SQLite file in a temporary "
                                "folder, removed afterwards)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tether-langgraph-") as tmp:
        db = args.db or f"sqlite:///{os.path.join(tmp, 'langgraph_durable.db')}"
        await demo(db, args.db or "a fresh SQLite file", os.path.join(tmp, "tool.log"))


async def demo(db: str, where: str, tool_log: str) -> None:
    from rich.console import Console
    from rich.table import Column, Table

    con = Console()
    runtime = make_runtime(db)
    await runtime.migrate()  # as `tether migrate` does; nothing if up to date
    async with runtime:
        batch = uuid.uuid4().hex[:6]  # short whole ids, new on each run of the example
        runs = [await runtime.start(support, {"question": f"q{i}"}, thread_id=f"q{i}-{batch}")
                for i in range(3)]
        tids = [r.thread_id for r in runs]
        con.print(f"started {len(runs)} LangGraph runs on {where}")
        worker = _worker(db, tool_log)
        for kill, at in enumerate((3, 7), start=1):  # committed tether steps, over all runs
            while True:
                await asyncio.sleep(0.05)
                if sum([(await runtime.get(t)).step for t in tids]) >= at:
                    break
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            con.print(f"[red]SIGKILLed worker {kill}[/red] mid-graph; starting another "
                      "(it takes over once the 2 s leases expire)")
            worker = _worker(db, tool_log)
        try:
            for t in tids:
                await runtime.wait(t, timeout=60, until="waiting")
            asks = await runtime.interrupts()
            con.print(f"{len(asks)} LangGraph interrupts are tether interrupts; answering them")
            for ask in asks:
                await runtime.resume(ask.thread_id, "yes")
            done = [await runtime.wait(t, timeout=60) for t in tids]
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait()
    calls = Counter(open(tool_log).read().splitlines())
    # Fits 80 columns: no value is cut, only the two-word headings wrap.
    table = Table(*(Column(name, no_wrap=True) for name in ("thread_id", "status", "checkpoints")),
                  "each step once", "tool calls",
                  *(Column(name, no_wrap=True) for name in ("repeated", "published")))
    async with TetherSaver.from_conn_string(db) as saver:
        for run in done:
            config: RunnableConfig = {"configurable": {"thread_id": run.thread_id}}
            steps = [t.metadata["step"] async for t in saver.alist(config)]
            mine = {k: n for k, n in calls.items() if k.startswith(run.thread_id + "|")}
            table.add_row(run.thread_id, run.status.value, str(len(steps)),
                          str(len(steps) == len(set(steps))), str(sum(mine.values())),
                          str(sum(n - 1 for n in mine.values())),
                          "no" if run.state["published"] == "(withheld)" else "yes")
    con.print(table)
    con.print("A tool call is repeated only when its super-step was in flight at a kill (its "
              "result was never checkpointed); every finished super-step was kept.")


if __name__ == "__main__":
    asyncio.run(main())
