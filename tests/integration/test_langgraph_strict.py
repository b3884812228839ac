"""A LangGraph checkpoint row is data, not code (issue 28, item 1): a row crafted in the database
(lg_checkpoints or lg_blobs, SQLite and Postgres) runs nothing when TetherSaver or
tether.langgraph.agent reads it, and the error names the refused type; the application's own
state types load once given as allowed_types=, and are refused, naming allowed_types=, when not.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any, TypedDict

import ormsgpack
import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from pydantic import BaseModel

from apps.inprocess import WAIT, make_runtime, working
from tether.errors import SerializationError
from tether.langgraph import StrictSerializer, TetherSaver, agent
from tether.langgraph._blobs import unpack

MARK = "__crafted__"


class Notes(TypedDict, total=False):
    note: str
    items: list[str]
    answer: str


def jot(state: Notes) -> dict[str, Any]:
    return {"note": "jotted", "items": [*state.get("items", []), "jot"]}


def notes_graph(saver: TetherSaver | None = None) -> Any:
    builder = StateGraph(Notes)
    builder.add_node("jot", jot)
    builder.add_edge(START, "jot")
    builder.add_edge("jot", END)
    return builder.compile(checkpointer=saver)


def cfg(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


def ext(module: str, name: str, arg: Any) -> bytes:
    """A msgpack value LangGraph's serializer reads as `module.name(arg)`."""
    return ormsgpack.packb(ormsgpack.Ext(0, ormsgpack.packb([module, name, arg])))


def sql(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Runs one statement as an attacker with write access to the database would."""
    if url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            rows = conn.execute(query, params).fetchall()
            conn.commit()
            return rows
    with psycopg.connect(url) as pg:
        cur = pg.execute(query.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []


def craft(url: str, thread_id: str, where: str, value: bytes) -> None:
    """Puts `value` (msgpack bytes) in a channel value of the thread's latest checkpoint: the
    inline `note` in its lg_checkpoints row, or every stored version of `items` in lg_blobs."""
    if where == "blob":
        sql(url, "UPDATE lg_blobs SET type = 'msgpack', blob = ?, base_version = NULL "
                 "WHERE thread_id = ? AND channel = 'items'",
            ormsgpack.packb([MARK]).replace(ormsgpack.packb(MARK), value), thread_id)
        return
    [(cid, type_, data)] = sql(url, "SELECT checkpoint_id, type, checkpoint FROM lg_checkpoints "
                                    "WHERE thread_id = ? ORDER BY checkpoint_id DESC LIMIT 1",
                               thread_id)
    body = StrictSerializer().loads_typed(unpack(type_, bytes(data)))  # type: ignore[arg-type]
    body.setdefault("channel_values", {})["note"] = MARK
    _, clean = StrictSerializer().dumps_typed(body)
    sql(url, "UPDATE lg_checkpoints SET type = 'msgpack', checkpoint = ? "
             "WHERE thread_id = ? AND checkpoint_id = ?",
        clean.replace(ormsgpack.packb(MARK), value), thread_id, cid)


@pytest.mark.parametrize("where", ["checkpoint", "blob"])
async def test_a_crafted_row_runs_no_code(db_url: str, tmp_path: Path, where: str) -> None:
    flag = tmp_path / "ran"
    async with TetherSaver.from_conn_string(db_url) as saver:
        await notes_graph(saver).ainvoke({"note": "", "items": ["a"]}, cfg("t"))
    craft(db_url, "t", where, ext("os", "system", f"touch {flag}"))
    async with TetherSaver.from_conn_string(db_url) as saver:
        with pytest.raises(SerializationError) as refused:
            await notes_graph(saver).aget_state(cfg("t"))
        with pytest.raises(SerializationError, match=r"os\.system"):
            await saver.aget_tuple(cfg("t"))
        with pytest.raises(SerializationError, match=r"os\.system"):
            [t async for t in saver.alist(cfg("t"))]
    assert str(refused.value).startswith("refused to load os.system from a LangGraph "
                                         "checkpoint")
    assert "it was not imported" in str(refused.value)
    assert "allowed_types=" in str(refused.value)
    assert "thread 't'" in str(refused.value)
    assert not flag.exists()
    # The control: the row is a live exploit for the serializer TetherSaver used to default to.
    async with TetherSaver.from_conn_string(db_url, serde=JsonPlusSerializer()) as saver:
        await notes_graph(saver).aget_state(cfg("t"))
    assert flag.exists()


async def test_a_refused_module_is_never_imported(db_url: str) -> None:
    assert "this" not in sys.modules  # `import this` prints; a clean interpreter has not
    async with TetherSaver.from_conn_string(db_url) as saver:
        await notes_graph(saver).ainvoke({"note": ""}, cfg("t"))
    craft(db_url, "t", "checkpoint", ext("this", "s", "x"))
    async with TetherSaver.from_conn_string(db_url) as saver:
        with pytest.raises(SerializationError, match=r"refused to load this\.s "):
            await saver.aget_tuple(cfg("t"))
    assert "this" not in sys.modules


# -- the application's own types in state ---------------------------------------------------


class Tier(Enum):
    GOLD = "gold"


@dataclass(frozen=True)
class Line:
    sku: str
    qty: int


class Order(BaseModel):
    id: str
    tier: Tier
    placed: datetime


class Shop(TypedDict, total=False):
    order: Order
    line: Line
    answer: str


PLACED = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)


def place(state: Shop) -> dict[str, Any]:
    return {"order": Order(id="o-1", tier=Tier.GOLD, placed=PLACED), "line": Line("sku-9", 2)}


def confirm(state: Shop) -> dict[str, Any]:
    return {"answer": str(interrupt({"order": state["order"].id}))}


def shop_graph(saver: TetherSaver | None = None) -> Any:
    builder = StateGraph(Shop)
    builder.add_node("place", place)
    builder.add_node("confirm", confirm)
    builder.add_edge(START, "place")
    builder.add_edge("place", "confirm")
    builder.add_edge("confirm", END)
    return builder.compile(checkpointer=saver)


async def test_state_types_load_once_allowed(db_url: str) -> None:
    async with TetherSaver.from_conn_string(db_url) as saver:
        await shop_graph(saver).ainvoke({}, cfg("s"))  # stops at the interrupt
        with pytest.raises(SerializationError,
                           match=r"refused to load .*test_langgraph_strict\.(Tier|Line|Order) "
                                 r".*allowed_types="):
            await shop_graph(saver).aget_state(cfg("s"))
    # Allowing the model alone is not enough: what it holds is checked too.
    async with TetherSaver.from_conn_string(db_url, allowed_types=[Order, Line]) as saver:
        with pytest.raises(SerializationError, match=r"test_langgraph_strict\.Tier "):
            await shop_graph(saver).aget_state(cfg("s"))
    async with TetherSaver.from_conn_string(db_url, allowed_types=[Order, Line, Tier]) as saver:
        graph = shop_graph(saver)
        values = (await graph.aget_state(cfg("s"))).values
        assert values["order"] == Order(id="o-1", tier=Tier.GOLD, placed=PLACED)
        assert values["line"] == Line("sku-9", 2)
        from langgraph.types import Command

        done = await graph.ainvoke(Command(resume="ok"), cfg("s"))
        assert done["answer"] == "ok" and done["order"].tier is Tier.GOLD


def order_summary(values: dict[str, Any]) -> dict[str, Any]:
    order = values["order"]
    return {"order": order.id, "tier": order.tier.value, "answer": values.get("answer")}


async def test_agent_takes_allowed_types(db_url: str) -> None:
    allowed = agent("lg_shop", shop_graph(), output=order_summary,
                    allowed_types=[Order, Line, Tier])
    refused = agent("lg_shop_strict", shop_graph(), output=order_summary)
    rt = make_runtime(db_url, allowed, refused)
    async with working(rt):
        ok = await rt.start(allowed, {})
        await rt.wait(ok.thread_id, timeout=WAIT, until="waiting")
        await rt.resume(ok.thread_id, "yes")
        done = await rt.wait(ok.thread_id, timeout=WAIT)
        bad = await rt.start(refused, {})
        failed = await rt.wait(bad.thread_id, timeout=WAIT)
    assert done.status == "completed", done.error
    # The graph's values as JSON (a dataclass by its fields), `output`'s keys merged over.
    assert done.state == {"order": "o-1", "tier": "gold", "answer": "yes",
                          "line": {"sku": "sku-9", "qty": 2}}
    # Not retried: the same rows would be refused again.
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.category == "serialization" and failed.attempt == 1
    assert "allowed_types=" in failed.error.message
    assert "test_langgraph_strict." in failed.error.message


async def test_agent_refuses_a_crafted_row(db_url: str, tmp_path: Path) -> None:
    flag = tmp_path / "ran"
    asking = agent("lg_ask_crafted", shop_graph(), output=order_summary,
                   allowed_types=[Order, Line, Tier])
    rt = make_runtime(db_url, asking)
    async with working(rt):
        run = await rt.start(asking, {})
        await rt.wait(run.thread_id, timeout=WAIT, until="waiting")
        craft(db_url, run.thread_id, "checkpoint", ext("os", "system", f"touch {flag}"))
        await rt.resume(run.thread_id, "yes")
        failed = await rt.wait(run.thread_id, timeout=WAIT)
    assert failed.status == "failed" and failed.error is not None
    assert "refused to load os.system" in failed.error.message
    assert not flag.exists()
