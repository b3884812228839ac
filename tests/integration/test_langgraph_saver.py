"""TetherSaver under real LangGraph graphs (sync `invoke` and async `ainvoke`), and what the
conformance suite does not look at: blobs written once per version, lists stored as deltas,
special writes, pruning that keeps delta chains whole, errors."""

from __future__ import annotations

import asyncio
import operator
import sqlite3
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from tether.errors import InvalidState, SchemaError
from tether.langgraph import TetherSaver

STEPS = 12


class State(TypedDict):
    messages: Annotated[list[str], operator.add]
    note: str


def step(state: State) -> dict[str, Any]:
    return {"messages": [f"message {len(state['messages']) + 1} ".ljust(200, ".")]}


def route(state: State) -> str:
    return "step" if len(state["messages"]) < STEPS else END


def loop_graph(saver: TetherSaver) -> Any:
    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", route)
    return builder.compile(checkpointer=saver)


def ask(state: State) -> dict[str, Any]:
    answer = interrupt({"question": "approve?", "seen": len(state["messages"])})
    return {"note": f"answer={answer}", "messages": ["asked"]}


async def draft(state: State) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"messages": ["draft"]}


def approval_graph(saver: TetherSaver) -> Any:
    builder = StateGraph(State)
    builder.add_node("draft", draft)
    builder.add_node("ask", ask)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=saver)


def cfg(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": 100}


def blob_rows(url: str) -> list[tuple[str, str | None, int]]:
    """(channel, base_version, bytes) of every stored blob."""
    sql = "SELECT channel, base_version, length(blob) FROM lg_blobs"
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return conn.execute(sql).fetchall()
    with psycopg.connect(url) as pg:
        return [(c, b, n or 0) for c, b, n in pg.execute(sql).fetchall()]


def test_sync_graph_invoke(databases: Any) -> None:
    url = databases.create(migrated=False)
    with TetherSaver.from_conn_string(url) as saver:
        saver.setup()  # sync use: it has run when it returns
        graph = loop_graph(saver)
        out = graph.invoke({"messages": [], "note": ""}, cfg("sync-1"), durability="sync")
        assert len(out["messages"]) == STEPS
        history = list(graph.get_state_history(cfg("sync-1")))
        # the input, the start and one checkpoint per super-step, newest first
        assert [h.metadata["step"] for h in history] == list(range(STEPS, -2, -1))
        assert [len(h.values.get("messages", [])) for h in history] == \
            [*range(STEPS, -1, -1), 0]
    # Another saver (another process, as far as it knows) reads the same state back.
    with TetherSaver.from_conn_string(url) as again:
        state = loop_graph(again).get_state(cfg("sync-1"))
        assert state.values["messages"] == out["messages"]
        assert state.next == ()
    rows = [r for r in blob_rows(url) if r[0] == "messages"]
    # One blob per messages version, each after the first holding only the item it gained.
    assert len(rows) == STEPS + 1
    deltas = [r for r in rows if r[1] is not None]
    assert len(deltas) == STEPS
    assert max(n for _, _, n in deltas) < 300


async def test_async_graph_ainvoke_interrupt_resume(databases: Any) -> None:
    url = databases.create(migrated=False)
    async with TetherSaver.from_conn_string(url) as saver:
        await saver.setup()
        graph = approval_graph(saver)
        out = await graph.ainvoke({"messages": [], "note": ""}, cfg("async-1"), durability="sync")
        assert out["__interrupt__"][0].value == {"question": "approve?", "seen": 1}
        # The interrupt is a pending write of the checkpoint the run stopped at.
        tup = await saver.aget_tuple(cfg("async-1"))
        assert tup is not None and tup.pending_writes is not None
        assert INTERRUPT in {w[1] for w in tup.pending_writes}
    async with TetherSaver.from_conn_string(url) as saver:  # resumed by a fresh saver
        graph = approval_graph(saver)
        out = await graph.ainvoke(Command(resume="yes"), cfg("async-1"), durability="sync")
        assert out["note"] == "answer=yes"
        assert out["messages"] == ["draft", "asked"]
        state = await graph.aget_state(cfg("async-1"))
        assert state.next == () and state.values["note"] == "answer=yes"
        sources = [t.metadata["source"] async for t in saver.alist(cfg("async-1"))]
        assert sources[-1] == "input" and set(sources[:-1]) == {"loop"}


async def test_sync_methods_on_the_saver_loop_refused(db_url: str) -> None:
    async with TetherSaver.from_conn_string(db_url) as saver:
        with pytest.raises(InvalidState, match="would block"):
            saver.get_tuple(cfg("x"))
        # From another thread the same call works, on the saver's loop.
        assert await asyncio.to_thread(saver.get_tuple, cfg("x")) is None


def test_async_methods_of_a_sync_saver(db_url: str) -> None:
    """A saver opened with `with` (a private loop) serves async calls made on another loop."""
    with TetherSaver.from_conn_string(db_url) as saver:
        async def use() -> list[int]:
            graph = loop_graph(saver)
            out = await graph.ainvoke({"messages": [], "note": ""}, cfg("mixed"))
            return [len(out["messages"])]

        assert asyncio.run(use()) == [STEPS]
        assert len(saver.get_tuple(cfg("mixed")).checkpoint["channel_values"]["messages"]) \
            == STEPS  # type: ignore[union-attr]


async def test_schema_missing_is_a_clear_error(databases: Any) -> None:
    url = databases.create(migrated=False)
    async with TetherSaver.from_conn_string(url) as saver:
        with pytest.raises(SchemaError, match="setup"):
            await saver.aget_tuple(cfg("x"))


async def test_delta_chains_survive_prune_and_copy(db_url: str) -> None:
    async with TetherSaver.from_conn_string(db_url) as saver:
        graph = loop_graph(saver)
        out = await graph.ainvoke({"messages": [], "note": ""}, cfg("p"), durability="sync")
        await saver.acopy_thread("p", "p-copy")
        await saver.aprune(["p"], strategy="keep_latest")
        assert len([t async for t in saver.alist(cfg("p"))]) == 1
        for thread_id in ("p", "p-copy"):
            tup = await saver.aget_tuple(cfg(thread_id))
            assert tup is not None
            assert tup.checkpoint["channel_values"]["messages"] == out["messages"]
        # The pruned thread keeps only its latest messages chain; more steps extend it.
        more = await graph.ainvoke({"messages": ["extra"], "note": ""}, cfg("p"))
        assert more["messages"][:-1] == out["messages"] + ["extra"]  # then one more step
        assert more["messages"][-1].startswith(f"message {STEPS + 2} ")
        fresh = TetherSaver(db_url)
        await fresh.aopen()
        try:
            tup = await fresh.aget_tuple(cfg("p"))
            assert tup is not None and tup.checkpoint["channel_values"]["messages"] == \
                more["messages"]
        finally:
            await fresh.aclose()


async def test_writes_dedup_and_special_writes(db_url: str) -> None:
    async with TetherSaver.from_conn_string(db_url) as saver:
        stored = await saver.aput(cfg("w"), empty_checkpoint(), {"source": "input", "step": -1},
                                  {})
        await saver.aput_writes(stored, [("a", 1), ("b", 2)], "task-1", "p")
        await saver.aput_writes(stored, [("a", 10), ("b", 20)], "task-1", "p")  # kept: first
        await saver.aput_writes(stored, [(ERROR, "boom")], "task-1", "p")
        await saver.aput_writes(stored, [(ERROR, "boom again")], "task-1", "p")  # replaces
        await saver.aput_writes(stored, [(INTERRUPT, {"q": 1})], "task-0", "o")
        tup = await saver.aget_tuple(stored)
        assert tup is not None
        # writes_sort_key order: task_path, task_id, idx (special writes have negative idx)
        assert tup.pending_writes == [("task-0", INTERRUPT, {"q": 1}),
                                      ("task-1", ERROR, "boom again"),
                                      ("task-1", "a", 1), ("task-1", "b", 2)]


async def test_metadata_filter_any_key_and_pagination(db_url: str) -> None:
    async with TetherSaver.from_conn_string(db_url) as saver:
        config = cfg("m")
        ids = []
        for i in range(5):
            ckpt = empty_checkpoint()
            meta: Any = {"source": "loop", "step": i, "user": {"id": i % 2, "tags": ["a"]},
                         "flag": i == 3, "score": 1.5 if i else None}
            config = await saver.aput(config, ckpt, meta, {})
            ids.append(ckpt["id"])

        async def found(**kw: Any) -> list[str]:
            return [t.checkpoint["id"] async for t in saver.alist(cfg("m"), **kw)]

        assert await found() == ids[::-1]
        assert await found(filter={"user": {"id": 1, "tags": ["a"]}}) == [ids[3], ids[1]]
        assert await found(filter={"user": {"id": 1}}) == []  # equality, not containment
        assert await found(filter={"flag": True}) == [ids[3]]
        assert await found(filter={"score": None}) == [ids[0]]
        assert await found(filter={"step": "1"}) == []  # a string is not a number
        assert await found(filter={"nope": 1}) == []
        assert await found(before=cfg_id("m", ids[3]), limit=2) == [ids[2], ids[1]]
        assert await found(limit=0) == []
        with pytest.raises(ValueError, match="limit"):
            await found(limit=-1)
        across = [t.checkpoint["id"] async for t in saver.alist(None, filter={"step": 4})]
        assert across == [ids[4]]


def cfg_id(thread_id: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                             "checkpoint_id": checkpoint_id}}


async def test_writes_commit_without_flush_checkpoints_with(databases: Any) -> None:
    """Pending writes are committed without waiting for the disk unless sync_writes=True;
    checkpoints always wait. Observed as the setting each commit ran with."""
    url = databases.create()
    for sync_writes, writes_mode in ((False, "off"), (True, "on")):
        async with TetherSaver.from_conn_string(url, sync_writes=sync_writes) as saver:
            stored = await saver.aput(cfg(f"s-{sync_writes}"), empty_checkpoint(),
                                      {"source": "input", "step": -1}, {})
            if databases.backend == "sqlite":
                rows: Any = saver._rows
                assert rows._synchronous == "FULL"
                await saver.aput_writes(stored, [("a", 1)], "t")
                assert rows._synchronous == ("FULL" if sync_writes else "NORMAL")
                await saver.aput(stored, empty_checkpoint(), {"source": "loop", "step": 0}, {})
                assert rows._synchronous == "FULL"
                continue
            # Postgres: the writes statement sets synchronous_commit for its own transaction
            # (seen here inside an explicit one); the session's setting stays on.
            from tether.langgraph._postgres import _queries, pack_writes

            with psycopg.connect(url) as pg:
                pg.execute(_queries()["insert_writes"], {
                    "thread_id": "s", "ns": "", "checkpoint_id": "c", "task_id": "t",
                    "task_path": "", "writes": pack_writes({0: (0, "a", "null", None)}),
                    "commit": writes_mode})
                assert pg.execute("SHOW synchronous_commit").fetchone() == (writes_mode,)
                pg.rollback()
                assert pg.execute("SHOW synchronous_commit").fetchone() == ("on",)
            await saver.aput_writes(stored, [("a", 1)], "t")
            tup = await saver.aget_tuple(stored)
            assert tup is not None and tup.pending_writes == [("t", "a", 1)]


def test_sync_saver_writes_merge_by_idx(db_url: str) -> None:
    """A sync saver's calls run in the caller's thread (no event loop there): a task's writes
    put twice keep the stored ones and gain the new idx; special writes replace."""
    with TetherSaver.from_conn_string(db_url) as saver:
        stored = saver.put(cfg("sync-w"), empty_checkpoint(), {"source": "input", "step": -1},
                           {})
        saver.put_writes(stored, [("a", 1)], "task-1", "p")
        saver.put_writes(stored, [("a", 10), ("b", 20)], "task-1", "p")
        saver.put_writes(stored, [(ERROR, "boom")], "task-1", "p")
        saver.put_writes(stored, [(ERROR, "again")], "task-1", "p")
        tup = saver.get_tuple(stored)
        assert tup is not None
        assert tup.pending_writes == [("task-1", ERROR, "again"), ("task-1", "a", 1),
                                      ("task-1", "b", 20)]
        assert [t.checkpoint["id"] for t in saver.list(cfg("sync-w"))] == [
            stored["configurable"]["checkpoint_id"]]


def test_postgres_0009_carries_pending_writes_over(databases: Any) -> None:
    """Migration 0009 packs the rows of 0005's lg_writes (one per write) into one per task;
    the saver reads them back as they were."""
    if databases.backend != "postgres":
        pytest.skip("0009 changes nothing on SQLite")
    from tether.store import migrate
    from tether.store.migrate import queries

    url = databases.create(migrated=False)
    q = queries("postgres")
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(q["create_schema_version"])
        for mig in migrate.migrations("postgres")[:8]:
            pg.execute(mig.sql.encode())
            pg.execute(q["record_migration"], {"version": mig.version, "name": mig.name})
    with TetherSaver.from_conn_string(url) as saver:
        stored = saver.put(cfg("old"), empty_checkpoint(), {"source": "input", "step": -1}, {})
        checkpoint_id = stored["configurable"]["checkpoint_id"]
        rows = []
        for task_id, task_path, writes in (("task-1", "p", [("a", 1), ("b", "x" * 300)]),
                                           ("task-0", "o", [(INTERRUPT, {"q": 1})])):
            for idx, (channel, value) in enumerate(writes):
                type_, blob = saver.serde.dumps_typed(value)
                rows.append(("old", "", checkpoint_id, task_id, -3 if channel == INTERRUPT
                             else idx, channel, type_, blob, task_path))
        rows.append(("old", "", checkpoint_id, "task-2", 0, "none", "null", None, "q"))
        with psycopg.connect(url, autocommit=True) as pg:
            pg.cursor().executemany(
                "INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, "
                "channel, type, blob, task_path) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                rows)
        saver.setup()
        with psycopg.connect(url) as pg:
            assert pg.execute("SELECT count(*) FROM lg_writes").fetchone() == (3,)
        tup = saver.get_tuple(stored)
        assert tup is not None
        assert tup.pending_writes == [("task-0", INTERRUPT, {"q": 1}), ("task-1", "a", 1),
                                      ("task-1", "b", "x" * 300), ("task-2", "none", None)]


def test_a_thread_with_string_versions_goes_on(db_url: str) -> None:
    """A thread copied in from LangGraph's own savers (string channel versions) continues:
    the next version is a string too, greater than the last (mixing float and str raised
    TypeError inside LangGraph at the next step)."""
    from langgraph.checkpoint.memory import InMemorySaver

    def sync_draft(state: State) -> dict[str, Any]:
        return {"messages": ["draft"]}

    def graph_on(saver: Any) -> Any:
        builder = StateGraph(State)
        builder.add_node("draft", sync_draft)
        builder.add_node("ask", ask)
        builder.add_edge(START, "draft")
        builder.add_edge("draft", "ask")
        builder.add_edge("ask", END)
        return builder.compile(checkpointer=saver)

    memory = InMemorySaver()
    first = graph_on(memory)
    first.invoke({"messages": [], "note": ""}, cfg("copied"))
    tuples = list(memory.list(cfg("copied")))[::-1]  # oldest first
    assert all(isinstance(v, str) for t in tuples for v in t.checkpoint["channel_versions"].values())
    with TetherSaver.from_conn_string(db_url) as saver:
        for t in tuples:
            parent = t.parent_config or {"configurable": {"thread_id": "copied",
                                                          "checkpoint_ns": ""}}
            saver.put(parent, t.checkpoint, t.metadata, t.checkpoint["channel_versions"])
            for task_id, channel, value in t.pending_writes or []:
                saver.put_writes(t.config, [(channel, value)], task_id)
        graph = graph_on(saver)
        assert graph.get_state(cfg("copied")).next == ("ask",)
        out = graph.invoke(Command(resume="yes"), cfg("copied"))
        assert out["note"] == "answer=yes" and out["messages"] == ["draft", "asked"]
        versions = graph.get_state(cfg("copied")).config
        latest = saver.get_tuple(versions)
        assert latest is not None
        assert all(isinstance(v, str) for v in latest.checkpoint["channel_versions"].values())
    assert saver.get_next_version("00000000000000000000000000000002.5", None) > \
        "00000000000000000000000000000002.5"
    assert isinstance(saver.get_next_version(None, None), float)
