"""A durable LangGraph graph with two nodes per super-step in parallel, a tool call in each
(through tether.langgraph.call: journaled) and an interrupt, as the app of `tether serve` and
`tether worker` subprocesses (`--app langgraph_visible_app:runtime`, tests/apps on
PYTHONPATH). The tool logs each call it starts to LANGGRAPH_TOOL_LOG and takes
LANGGRAPH_TOOL_SECONDS, so a worker can be killed while calls are in flight.

    START -> search_web + search_docs -> merge + score -> approve (interrupt) -> publish
"""

from __future__ import annotations

import asyncio
import operator
import os
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import tether
from tether.langgraph import agent, call

TOOL_LOG = os.environ.get("LANGGRAPH_TOOL_LOG", "")
TOOL_SECONDS = float(os.environ.get("LANGGRAPH_TOOL_SECONDS", "0.5"))


class State(TypedDict, total=False):
    question: str
    found: Annotated[list[str], operator.add]
    summary: str
    score: int
    verdict: str
    published: str


async def search(thread_id: str, where: str, query: str) -> str:
    """The tool: logged when it starts (a call cut short by a kill counts too), then slow."""
    if TOOL_LOG:
        with open(TOOL_LOG, "a") as f:
            f.write(f"{thread_id}|{where}\n")
    await asyncio.sleep(TOOL_SECONDS)
    return f"{where}: {query}"


def _tid(config: RunnableConfig) -> str:
    return str(config["configurable"]["thread_id"])


async def search_web(state: State, config: RunnableConfig) -> dict[str, Any]:
    return {"found": [await call(search, _tid(config), "web", state["question"])]}


async def search_docs(state: State, config: RunnableConfig) -> dict[str, Any]:
    return {"found": [await call(search, _tid(config), "docs", state["question"])]}


def merge(state: State) -> dict[str, Any]:
    return {"summary": " | ".join(sorted(state["found"]))}


def score(state: State) -> dict[str, Any]:
    return {"score": len(state["found"])}


def approve(state: State) -> dict[str, Any]:
    return {"verdict": str(interrupt({"summary": state["summary"], "ask": "publish?"}))}


def publish(state: State) -> dict[str, Any]:
    return {"published": state["summary"] if state["verdict"] == "yes" else "(withheld)"}


def build(checkpointer: Any = None) -> Any:
    b = StateGraph(State)
    for name, fn in (("search_web", search_web), ("search_docs", search_docs), ("merge", merge),
                     ("score", score), ("approve", approve), ("publish", publish)):
        b.add_node(name, fn)
    b.add_edge(START, "search_web")
    b.add_edge(START, "search_docs")
    b.add_edge(["search_web", "search_docs"], "merge")
    b.add_edge(["search_web", "search_docs"], "score")
    b.add_edge(["merge", "score"], "approve")
    b.add_edge("approve", "publish")
    b.add_edge("publish", END)
    return b.compile(checkpointer=checkpointer)


visible = agent("langgraph_visible", build())
runtime = tether.Runtime(os.environ.get("TETHER_DB", "sqlite:///tether.db"), agents=[visible],
                         lease_ttl=2.0, poll_interval=0.1)
