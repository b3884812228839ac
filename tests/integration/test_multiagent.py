"""Multi-agent runs end to end, in process, on every store: mailboxes and actors
(Idle -> Processing -> Response -> Idle), spawn/join, cancel cascades, groups and the admin
channel. Real databases (the `db_url` fixture), a real worker (`runtime.work`) as a task."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter, defaultdict
from typing import Any

import pytest

from apps import inprocess, mail_app
from apps.inprocess import eventually, make_runtime
from apps.mail_app import mailbox_rows
from tether import (
    ADMIN_CHANNEL,
    Agent,
    Command,
    Context,
    DefinitionError,
    InvalidState,
    RetryPolicy,
    RunNotFound,
    RunStatus,
    Runtime,
    finish,
    goto,
    receive,
)

State = dict[str, Any]
WAIT = 30.0  # generous: a wait that times out fails the test, it does not hang it
# The runtime stays open after the worker stops: tests close it themselves.
working = functools.partial(inprocess.working, concurrency=20, close=False)




async def status(rt: Runtime, thread_id: str) -> RunStatus:
    return (await rt.get(thread_id)).status


# -- exactly-once consumption and per-sender order ------------------------------------------


async def test_each_message_is_consumed_once_in_per_sender_order(db_url: str) -> None:
    """Two senders send 50 numbered messages each, a few per step, to one actor that records
    every batch it is handed: each message reaches it once, in each sender's order, and its
    mailbox row is marked with the step that recorded it."""
    k, senders = 50, 2
    rt = make_runtime(db_url, mail_app.sender, mail_app.actor)
    try:
        act = await rt.start(mail_app.actor, mail_app.actor_input(senders * k), thread_id="act")
        ids = [(await rt.start(mail_app.sender, mail_app.sender_input(
            ["act"], k=k, per_step=7, pause=(0.005, 0.03)), thread_id=f"s{i}")).thread_id
            for i in range(senders)]
        async with working(rt):
            done = await rt.wait(act.thread_id, timeout=WAIT)
            for s in ids:
                assert (await rt.wait(s, timeout=WAIT)).status == "completed"
        assert done.status == "completed", done.error
        got = done.state["got"]
        assert done.state["count"] == senders * k == len(got)
        per_sender: dict[str, list[int]] = defaultdict(list)
        for _, sender, n, _ in got:
            per_sender[sender].append(n)
        assert per_sender == {s: list(range(k)) for s in ids}
        # Every sender step committed its messages once: 8 steps of up to 7.
        for s in ids:
            assert (await rt.get(s)).state["steps"] == list(range(1, 9))
        rows = [r for r in mailbox_rows(db_url) if r.thread_id == "act"]
        assert len(rows) == senders * k
        assert {r.id: r.consumed_step for r in rows} == {m[0]: m[3] for m in got}
        for s in ids:  # in the mailbox too, each sender's messages are in its order
            assert [r.body for r in rows if r.sender == s] == [
                {"sender": s, "n": n} for n in range(k)]
        # The actor was handed its mail in several batches (Idle in between).
        assert len({m[3] for m in got}) > 1
        assert await rt.inbox(act.thread_id) == []
        # runtime.sent: what each sender sent, newest first, read at the actor's steps.
        for s in ids:
            sent = await rt.sent(s, limit=1000)
            assert [(m.sender, m.recipient, m.body) for m in sent] == [
                (s, "act", {"sender": s, "n": n}) for n in reversed(range(k))]
            assert {m.id: m.consumed_step for m in sent} == {
                r.id: r.consumed_step for r in rows if r.sender == s}
            assert [m.id for m in await rt.sent(s, limit=3)] == [m.id for m in sent[:3]]
        assert await rt.sent("act") == []
        for bad in (0, 1001, True, "5"):
            with pytest.raises(DefinitionError, match=r"limit must be within 1\.\.1000"):
                await rt.sent(ids[0], limit=bad)  # type: ignore[arg-type]
    finally:
        await rt.close()


# -- actor state -----------------------------------------------------------------------------


def gated_actor(entered: asyncio.Event, release: asyncio.Event, batches: list[list[Any]]
                ) -> Agent:
    agent = Agent("gated")

    @agent.node(start=True)
    async def serve(state: State, ctx: Context) -> Command:
        if ctx.inbox:
            entered.set()
            await release.wait()
        batches.append([m.body for m in ctx.inbox])
        for m in ctx.inbox:
            if m.sender:
                ctx.send(m.sender, {"reply": m.body})
        return receive({"seen": state.get("seen", 0) + len(ctx.inbox)})

    return agent


async def test_actor_state_and_inbox_depth_show_in_get(db_url: str) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    batches: list[list[Any]] = []
    agent = gated_actor(entered, release, batches)
    rt = make_runtime(db_url, agent)
    try:
        run = await rt.start(agent, {}, thread_id="actor")
        tid = run.thread_id
        async with working(rt):
            async def idle() -> bool:
                return (await rt.get(tid)).actor_state == "idle"

            await eventually(idle, "the actor to park")
        now = await rt.get(tid)
        assert (now.status, now.waiting_for, now.inbox_depth) == ("waiting", "mail", 0)
        assert now.lease_owner is None
        assert now.to_dict()["actor_state"] == "idle"
        assert batches == [[]]
        # Mail makes it claimable: Processing before any worker has it.
        for i in range(3):
            await rt.send(tid, {"q": i})
        now = await rt.get(tid)
        assert (now.status, now.inbox_depth, now.actor_state) == ("queued", 3, "processing")
        events: list[dict[str, Any]] = []

        async def watch() -> None:
            async for event in rt.subscribe(tid):
                events.append(event)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0)
        async with working(rt):
            await asyncio.wait_for(entered.wait(), WAIT)
            now = await rt.get(tid)
            assert (now.status, now.inbox_depth, now.actor_state) == ("running", 3, "processing")
            assert now.lease_owner is not None
            assert now.to_dict()["actor_state"] == "processing"
            release.set()
            await eventually(idle, "the actor to park again")
            now = await rt.get(tid)
            assert (now.status, now.inbox_depth, now.actor_state) == ("waiting", 0, "idle")
            assert now.state["seen"] == 3
            assert batches == [[], [{"q": 0}, {"q": 1}, {"q": 2}]]
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        kinds = [e["type"] for e in events]
        assert [k for k in kinds if k in ("processing", "response", "idle")] == [
            "processing", "response", "idle"], kinds
        # A run that is neither an actor nor has mail has no actor state.
        other = await rt.start(agent, {}, thread_id="fresh")
        assert (await rt.get(other.thread_id)).actor_state is None
    finally:
        await rt.close()


async def test_mail_sent_to_a_queued_run_is_read_at_its_first_step(db_url: str) -> None:
    """A worker claims queued runs, and those with mail read it at their first step (the
    claim asks which have mail; the others skip reading an inbox)."""
    agent = Agent("reader")

    @agent.node(start=True)
    async def read(state: State, ctx: Context) -> Command:
        return finish({"got": [m.body for m in ctx.inbox]})

    rt = make_runtime(db_url, agent)
    try:
        runs = [await rt.start(agent, {}, thread_id=f"r{i}") for i in range(6)]
        for run in runs[::2]:
            await rt.send(run.thread_id, {"to": run.thread_id})
        async with working(rt):
            done = [await rt.wait(run.thread_id, timeout=WAIT) for run in runs]
        assert [r.state["got"] for r in done] == [
            [{"to": f"r{i}"}] if i % 2 == 0 else [] for i in range(6)]
    finally:
        await rt.close()


async def test_replies_are_committed_with_the_actors_step(db_url: str) -> None:
    """Response: an actor's replies reach their senders, committed with its checkpoint."""
    entered, release = asyncio.Event(), asyncio.Event()
    release.set()
    agent = gated_actor(entered, release, [])
    client = Agent("client")

    @client.node(start=True)
    async def ask(state: State, ctx: Context) -> Command:
        for i in range(3):
            ctx.send("actor", {"q": i})
        return goto("listen")

    @client.node
    async def listen(state: State, ctx: Context) -> Command:
        replies = state.get("replies", []) + [m.body["reply"]["q"] for m in ctx.inbox]
        if len(replies) == 3:
            return finish({"replies": replies})
        return receive({"replies": replies})

    rt = make_runtime(db_url, agent, client)
    try:
        await rt.start(agent, {}, thread_id="actor")
        async with working(rt):
            async def idle() -> bool:
                return (await rt.get("actor")).actor_state == "idle"

            await eventually(idle, "the actor to park")
            c = await rt.start(client, {}, thread_id="client")
            done = await rt.wait(c.thread_id, timeout=WAIT)
        assert done.status == "completed", done.error
        assert done.state["replies"] == [0, 1, 2]
        rows = [r for r in mailbox_rows(db_url) if r.thread_id == "client"]
        assert [r.sender for r in rows] == ["actor"] * 3
        assert all(r.consumed_step is not None for r in rows)
    finally:
        await rt.close()


# -- unknown recipients -----------------------------------------------------------------------


async def test_ctx_send_to_an_unknown_thread_fails_the_run_as_definition(db_url: str) -> None:
    agent = Agent("lost")
    target = Agent("target")

    @agent.node(start=True)
    async def first(state: State, ctx: Context) -> Command:
        return goto("second", {"ok": True})

    @agent.node
    async def second(state: State, ctx: Context) -> Command:
        ctx.send("target", {"fine": 1})
        ctx.send("no-such-thread", {"lost": 1})
        return goto("third", {"sent": True})

    @agent.node
    async def third(state: State, ctx: Context) -> Command:
        return finish()

    @target.node(start=True)
    async def sink(state: State, ctx: Context) -> Command:
        return receive()

    rt = make_runtime(db_url, agent, target)
    try:
        await rt.start(target, {}, thread_id="target")
        run = await rt.start(agent, {})
        async with working(rt):
            done = await rt.wait(run.thread_id, timeout=WAIT)
        assert done.status == "failed"
        assert done.error is not None
        assert done.error.category == "definition"
        assert done.error.type == "RunNotFound"
        assert "no-such-thread" in done.error.message
        # Nothing of the failing step was committed: no mail, no state, no checkpoint.
        assert done.step == 1 and "sent" not in done.state and done.state["ok"] is True
        assert await rt.inbox("target") == []
        assert mailbox_rows(db_url) == []
    finally:
        await rt.close()


async def test_runtime_send_to_an_unknown_thread_is_run_not_found(db_url: str) -> None:
    rt = make_runtime(db_url)
    try:
        with pytest.raises(RunNotFound, match="nobody"):
            await rt.send("nobody", {"x": 1})
        assert mailbox_rows(db_url) == []
    finally:
        await rt.close()


# -- spawn / join -----------------------------------------------------------------------------


async def test_join_returns_a_failing_childs_error_as_a_value(db_url: str) -> None:
    parent = Agent("parent")
    child = Agent("child", retry=RetryPolicy(attempts=1))

    @parent.node(start=True)
    async def fan_out(state: State, ctx: Context) -> Command:
        ids = [ctx.spawn(child, {"i": i, "fail": i == 1}) for i in range(3)]
        results = await ctx.join(ids)
        return finish({"results": results})

    @child.node(start=True)
    async def work(state: State, ctx: Context) -> Command:
        if state["fail"]:
            raise ValueError(f"child {state['i']} cannot do it")
        return finish({"answer": state["i"] * 10})

    rt = make_runtime(db_url, parent, child)
    try:
        run = await rt.start(parent, {})
        async with working(rt):
            done = await rt.wait(run.thread_id, timeout=WAIT)
        assert done.status == "completed", done.error
        results = done.state["results"]
        assert [r["thread_id"] for r in results] == [f"{run.thread_id}.1.{i}" for i in range(3)]
        assert [r["status"] for r in results] == ["completed", "failed", "completed"]
        assert results[0]["state"] == {"i": 0, "fail": False, "answer": 0}
        assert results[2]["state"]["answer"] == 20
        assert results[0]["error"] is None and results[2]["error"] is None
        error = results[1]["error"]
        assert error["category"] == "exception"
        assert error["type"] == "ValueError"
        assert error["message"] == "child 1 cannot do it"
        assert "ValueError" in error["traceback"]
        for r in results:
            assert (await rt.get(r["thread_id"])).parent_thread_id == run.thread_id
    finally:
        await rt.close()


async def test_join_on_an_unknown_thread_fails_the_run_as_definition(db_url: str) -> None:
    parent = Agent("parent")

    @parent.node(start=True)
    async def wait_for_ghost(state: State, ctx: Context) -> Command:
        return finish({"results": await ctx.join(["ghost-thread"])})

    rt = make_runtime(db_url, parent)
    try:
        run = await rt.start(parent, {})
        async with working(rt):
            done = await rt.wait(run.thread_id, timeout=WAIT)
        assert done.status == "failed"
        assert done.error is not None and done.error.category == "definition"
        assert "ghost-thread" in done.error.message
    finally:
        await rt.close()


async def test_spawn_ids_are_stable_across_re_execution(db_url: str) -> None:
    """The parent's step runs again and again (parks in join, wakes, fails once after the
    join, retries): it spawns the same thread_ids each time; no child is created or run twice."""
    parent = Agent("parent", retry=RetryPolicy(attempts=3, initial=0.0, jitter=0.0))
    child = Agent("child")
    spawned: list[list[str]] = []
    joined: list[int] = []
    child_runs: Counter[str] = Counter()

    @parent.node(start=True)
    async def fan_out(state: State, ctx: Context) -> Command:
        ids = [ctx.spawn(child, {"i": i}) for i in range(2)]
        ids.append(ctx.spawn("child", {"i": 9}, thread_id=f"{ctx.thread_id}-named"))
        spawned.append(ids)
        results = await ctx.join(ids)
        joined.append(len(results))
        if len(joined) == 1:
            raise RuntimeError("flaky after the join")
        return finish({"results": [r["state"]["i"] for r in results]})

    @child.node(start=True)
    async def work(state: State, ctx: Context) -> Command:
        child_runs[ctx.thread_id] += 1
        return finish({"done": True})

    rt = make_runtime(db_url, parent, child)
    try:
        run = await rt.start(parent, {}, thread_id="p")
        async with working(rt):
            done = await rt.wait(run.thread_id, timeout=WAIT)
        assert done.status == "completed", done.error
        assert done.state["results"] == [0, 1, 9]
        # A parked parent is woken by each child's end and re-parks until all have ended.
        assert len(spawned) >= 3 and joined == [3, 3]
        assert all(ids == ["p.1.0", "p.1.1", "p-named"] for ids in spawned)
        runs = await rt.list_runs(limit=100)
        assert sorted(r.thread_id for r in runs) == ["p", "p-named", "p.1.0", "p.1.1"]
        assert child_runs == {"p.1.0": 1, "p.1.1": 1, "p-named": 1}
        for tid in child_runs:
            kid = await rt.get(tid)
            assert kid.status == "completed" and kid.step == 1
    finally:
        await rt.close()


async def test_cancelling_a_parent_in_join_cancels_its_children(db_url: str) -> None:
    parent = Agent("parent")
    middle = Agent("middle")
    idle = Agent("idle")
    busy = Agent("busy")
    busy_entered, busy_release = asyncio.Event(), asyncio.Event()
    idle_runs: Counter[str] = Counter()

    @parent.node(start=True)
    async def fan_out(state: State, ctx: Context) -> Command:
        ids = [ctx.spawn(middle), ctx.spawn(idle), ctx.spawn(busy)]
        return finish({"results": await ctx.join(ids)})

    @middle.node(start=True)
    async def delegate(state: State, ctx: Context) -> Command:
        return finish({"results": await ctx.join([ctx.spawn(idle)])})

    @idle.node(start=True)
    async def wait_for_mail(state: State, ctx: Context) -> Command:
        idle_runs[ctx.thread_id] += 1
        if ctx.inbox:
            return finish({"mail": [m.body for m in ctx.inbox]})
        return receive()

    @busy.node(start=True)
    async def hang(state: State, ctx: Context) -> Command:
        busy_entered.set()
        await busy_release.wait()
        return finish({"late": True})

    rt = make_runtime(db_url, parent, middle, idle, busy)
    try:
        run = await rt.start(parent, {}, thread_id="p")
        tree = ["p", "p.1.0", "p.1.1", "p.1.2", "p.1.0.1.0"]
        async with working(rt):
            async def parked() -> bool:
                got = {r.thread_id: r for r in await rt.list_runs(limit=100)}
                return (set(got) == set(tree) and busy_entered.is_set()
                        and got["p"].waiting_for == "join"
                        and got["p.1.0"].waiting_for == "join"
                        and got["p.1.1"].waiting_for == "mail"
                        and got["p.1.0.1.0"].waiting_for == "mail")

            await eventually(parked, "the tree to park")
            assert await status(rt, "p.1.2") == "running"
            cancelled = await rt.cancel(run.thread_id)
            assert cancelled.status == "cancelled"
            for tid in tree:
                assert await status(rt, tid) == "cancelled", tid
            # The busy child's in-flight step cannot commit; mail to cancelled actors is
            # refused (they could never read it); the parent is not woken by its children's end.
            busy_release.set()
            for actor in ("p.1.1", "p.1.0.1.0"):
                with pytest.raises(InvalidState, match="is cancelled: it can never read mail"):
                    await rt.send(actor, {"x": 1})
            await asyncio.sleep(0.5)
        for tid in tree:
            now = await rt.get(tid)
            assert now.status == "cancelled", tid
        assert (await rt.get("p.1.2")).step == 0
        assert idle_runs == {"p.1.1": 1, "p.1.0.1.0": 1}
        assert (await rt.get("p")).step == 0
    finally:
        await rt.close()


# -- groups -----------------------------------------------------------------------------------


def group_agents(log: dict[str, list[tuple[str | None, Any]]]) -> tuple[Agent, Agent]:
    """An admin recruits members into its group on a "go"; the members say hello to the
    group; once all are there the admin publishes a task; results come back to the admin,
    which then tells the other admins on the admin channel and waits to hear from them."""
    admin = Agent("admin")
    member = Agent("member")

    @admin.node(start=True)
    async def enlist(state: State, ctx: Context) -> Command:
        ctx.join_group(state["group"], admin=True)
        return goto("lead", {"members": [], "ready": 0, "results": {}, "notes": []})

    @admin.node
    async def lead(state: State, ctx: Context) -> Command:
        members, ready = list(state["members"]), state["ready"]
        results, notes = dict(state["results"]), list(state["notes"])
        for m in ctx.inbox:
            log[ctx.thread_id].append((m.sender, m.body))
            kind = m.body["kind"]
            if kind == "go":
                members = [ctx.spawn(member, {"group": state["group"], "admin": ctx.thread_id})
                           for _ in range(state["size"])]
            elif kind == "ready":
                ready += 1
                if ready == state["size"]:
                    ctx.publish(state["group"], {"kind": "task", "group": state["group"]})
            elif kind == "result":
                results[m.sender] = m.body["value"]
                if len(results) == state["size"]:
                    ctx.publish(ADMIN_CHANNEL, {"kind": "note", "group": state["group"]})
            elif kind == "note":
                notes.append(m.body["group"])
        update = {"members": members, "ready": ready, "results": results, "notes": notes}
        if len(results) == state["size"] and len(notes) == state["admins"] - 1:
            return finish(update)
        return receive(update)

    @member.node(start=True)
    async def join(state: State, ctx: Context) -> Command:
        ctx.join_group(state["group"])
        ctx.send(state["admin"], {"kind": "ready"})
        return goto("chat")

    @member.node
    async def chat(state: State, ctx: Context) -> Command:
        for m in ctx.inbox:
            log[ctx.thread_id].append((m.sender, m.body))
        if any(m.body["kind"] == "task" for m in ctx.inbox):
            ctx.publish(state["group"], {"kind": "hello", "from": ctx.thread_id})
            ctx.send(state["admin"], {"kind": "result", "value": len(ctx.thread_id)})
            return goto("linger")
        return receive()

    @member.node
    async def linger(state: State, ctx: Context) -> Command:
        for m in ctx.inbox:
            log[ctx.thread_id].append((m.sender, m.body))
        hellos = sum(1 for _, b in log[ctx.thread_id] if b["kind"] == "hello")
        if hellos == state.get("peers", 2):
            return finish()
        return receive()

    return admin, member


async def test_publish_to_a_group_and_between_admins(db_url: str) -> None:
    log: dict[str, list[tuple[str | None, Any]]] = defaultdict(list)
    admin, member = group_agents(log)
    rt = make_runtime(db_url, admin, member)
    try:
        admins = ["a0", "a1", "a2"]
        for i, a in enumerate(admins):
            await rt.start(admin, {"group": f"g{i}", "size": 3, "admins": 3}, thread_id=a)
        async with working(rt, concurrency=40):
            async def enlisted() -> bool:
                return sorted(await rt.store.group_members(ADMIN_CHANNEL)) == admins

            await eventually(enlisted, "the admins to join the admin channel")
            for a in admins:
                await rt.send(a, {"kind": "go"})
            finals = {a: await rt.wait(a, timeout=WAIT) for a in admins}
            members = {a: finals[a].state["members"] for a in admins}
            for ms in members.values():
                for m in ms:
                    assert (await rt.wait(m, timeout=WAIT)).status == "completed"
        for i, a in enumerate(admins):
            final = finals[a]
            assert final.status == "completed", final.error
            group = f"g{i}"
            assert sorted(await rt.store.group_members(group)) == sorted([a, *members[a]])
            # Inter-group: one note from each other admin, none from itself.
            notes = [(s, b["group"]) for s, b in log[a] if b["kind"] == "note"]
            assert sorted(notes) == sorted((o, f"g{j}") for j, o in enumerate(admins) if o != a)
            # Intra-group: the members' hellos reached the admin too, never the other groups.
            hellos = [(s, b["from"]) for s, b in log[a] if b["kind"] == "hello"]
            assert sorted(hellos) == sorted((m, m) for m in members[a])
            for m in members[a]:
                got = log[m]
                assert got.count((a, {"kind": "task", "group": group})) == 1
                assert {s for s, _ in got} <= {a, *members[a]} - {m}, got
                assert sorted(str(s) for s, b in got if b["kind"] == "hello") == sorted(
                    set(members[a]) - {m})
                assert all(b["kind"] in ("task", "hello") for _, b in got), got
        # Admins are in the admin channel; members are not.
        assert sorted(await rt.store.group_members(ADMIN_CHANNEL)) == admins
    finally:
        await rt.close()
