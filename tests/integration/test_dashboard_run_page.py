"""The run page says what an operator asks first: the node that failed (not "next node -"),
how long the run took (or has taken so far), and the tokens its journaled LLM calls used."""

from __future__ import annotations

import functools
import re
from typing import Any

import httpx

from apps import inprocess
from tether import Agent, Command, Context, RetryPolicy, finish, goto
from tether.service.api import create_app

WAIT = 20.0
make_runtime = functools.partial(inprocess.make_runtime, poll_interval=0.02)


def reply() -> dict[str, Any]:
    return {"text": "ok", "usage": {"input_tokens": 1200, "output_tokens": 34}}


def agents() -> list[Agent]:
    talk, boom = Agent("talk"), Agent("boom", retry=RetryPolicy(attempts=1))

    @talk.node(start=True)
    async def ask_model(state: dict[str, Any], ctx: Context) -> Command:
        await ctx.call(reply)
        return goto("wait_here", {})

    @talk.node
    async def wait_here(state: dict[str, Any], ctx: Context) -> Command:
        return finish({"answer": ctx.interrupt({"ok?": 1})})

    @boom.node(start=True)
    async def prepare(state: dict[str, Any], ctx: Context) -> Command:
        return goto("explode", {})

    @boom.node
    async def explode(state: dict[str, Any], ctx: Context) -> Command:
        raise RuntimeError("nope")

    return [talk, boom]


def field(html: str, name: str) -> str | None:
    found = re.search(rf'data-field="{name}">([^<]*)<', html)
    return None if found is None else found.group(1)


async def test_the_run_page_names_the_failed_node_and_shows_duration_and_tokens(
        db_url: str) -> None:
    rt = make_runtime(db_url, *agents())
    async with inprocess.working(rt):
        talking = await rt.start("talk", {})
        failed = await rt.start("boom", {})
        await rt.wait(talking.thread_id, timeout=WAIT, until="waiting")
        await rt.wait(failed.thread_id, timeout=WAIT)
        assert (await rt.usage(talking.thread_id)) == {"input_tokens": 1200,
                                                          "output_tokens": 34}
        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            page = (await c.get(f"/ui/runs/{failed.thread_id}")).text
            assert field(page, "failed-node") == "explode"
            assert "next node" not in page
            assert field(page, "duration") is not None
            assert "so far" not in (field(page, "duration") or "")
            page = (await c.get(f"/ui/runs/{talking.thread_id}")).text
            assert field(page, "usage") == "input tokens 1,200 · output tokens 34"
            assert (field(page, "duration") or "").endswith("so far")
            assert field(page, "failed-node") is None


async def form_poster(c: httpx.AsyncClient, path: str) -> Any:
    page = (await c.get(path)).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None, page[-500:]

    async def post(action: str, **fields: str) -> httpx.Response:
        return await c.post(action, data={"csrf": csrf.group(1), **fields})

    return page, post


async def test_mail_from_the_run_page(db_url: str) -> None:
    rt = make_runtime(db_url, *agents())
    async with inprocess.working(rt):
        talking = await rt.start("talk", {})
        await rt.wait(talking.thread_id, timeout=WAIT, until="waiting")
        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            page, post = await form_poster(c, f"/ui/runs/{talking.thread_id}")
            assert f'action="/ui/runs/{talking.thread_id}/send"' in page
            r = await post(f"/ui/runs/{talking.thread_id}/send", message='{"ask": "status"}',
                           sender="ops")
            assert r.status_code == 303 and r.headers["location"].endswith("?done=sent")
            inbox = await rt.inbox(talking.thread_id)
            assert [(m.body, m.sender) for m in inbox] == [({"ask": "status"}, "ops")]
            bad = await post(f"/ui/runs/{talking.thread_id}/send", message="status")
            assert bad.status_code == 400 and "a string is quoted" in bad.text
            assert 'value="status"' in bad.text  # the form keeps what was typed
            assert len(await rt.inbox(talking.thread_id)) == 1
            alive = next(w for w in await rt.workers() if w.alive)
            refused = await post("/ui/workers/release", worker=alive.id)
            assert refused.status_code == 409 and "is alive" in refused.text
            assert "<h1>Workers</h1>" in refused.text  # back on its page, with the error


async def test_a_dead_workers_runs_are_released_from_the_workers_page(db_url: str) -> None:
    rt = make_runtime(db_url, *agents())
    try:
        run = await rt.start("boom", {})
        # A worker that claimed the run with a long TTL and then died (nothing renews it).
        claimed = await rt.store.claim_runs("dead:1:x", "v1", ["boom"], 10, 3600)
        assert [r.thread_id for r in claimed] == [run.thread_id]
        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            _, post = await form_poster(c, f"/ui/runs/{run.thread_id}")  # its CSRF token
            r = await post("/ui/workers/release", worker="dead:1:x")
            assert r.status_code == 303 and r.headers["location"].endswith("?done=released")
        row = await rt.peek(run.thread_id)
        assert (row.status.value, row.lease_owner) == ("queued", None)
        assert (await rt.audit(limit=1))[0].action == "release"
    finally:
        await rt.close()


async def test_the_overview_says_what_needs_a_person(db_url: str) -> None:
    rt = make_runtime(db_url, *agents())
    async with inprocess.working(rt):
        asked = await rt.start("talk", {})
        await rt.wait(asked.thread_id, timeout=WAIT, until="waiting")
        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            calm = (await c.get("/ui")).text
            for _ in range(10):
                failed = await rt.start("boom", {})
                await rt.wait(failed.thread_id, timeout=WAIT)
            page = (await c.get("/ui")).text
    assert "Needs attention" in calm and "a person has been asked for" in calm
    assert asked.thread_id in calm and "finished runs failed" not in calm
    assert "10 of the newest 10 finished runs failed (100%, over 10%)" in page
    # The worker has stopped: v1 has open runs (the waiting one) and no live worker.
    other = make_runtime(db_url, *agents())
    try:
        app = create_app(other)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            page = (await c.get("/ui")).text
        assert ("v1 has 1 open run and no live worker" in page
                or "1 run of v1 is stranded" in page), page[:3000]
    finally:
        await other.close()


async def test_an_answer_in_the_inbox_moves_on_to_the_next_question(db_url: str) -> None:
    rt = make_runtime(db_url, *agents())
    async with inprocess.working(rt):
        first, second = await rt.start("talk", {}), await rt.start("talk", {})
        for r in (first, second):
            await rt.wait(r.thread_id, timeout=WAIT, until="waiting")
        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            _, post = await form_poster(c, "/ui/interrupts")
            for run, where in ((first, "/ui/interrupts?done=resumed"),
                               (second, f"/ui/runs/{second.thread_id}?done=resumed")):
                pending = (await rt.interrupts(thread_id=run.thread_id))[0]
                r = await post("/ui/interrupts/resume", thread_id=run.thread_id,
                               interrupt_id=pending.id, value="true", back="inbox")
                # Another question waits: back to the inbox; the last one: to its run.
                assert r.status_code == 303 and r.headers["location"] == where


async def test_a_bad_filter_keeps_the_form_as_typed_with_its_error(db_url: str) -> None:
    rt = make_runtime(db_url, *agents())
    try:
        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            r = await c.get("/ui/runs", params={"since": "yesterday", "agent": "talk",
                                                "order": "oldest", "limit": "100"})
        assert r.status_code == 400
        assert "Created since must be a date" in r.text
        assert 'name="since" value="yesterday"' in r.text  # the form, as typed
        assert 'name="agent" list="agents" value="talk"' in r.text
        assert '<option value="oldest" selected>' in r.text and "<option selected>100" in r.text
        assert "No runs match" not in r.text
    finally:
        await rt.close()


def search(query: str, *, limit: int, api_key: str, options: object = None) -> list[str]:
    return [f"{query}-{i}" for i in range(limit)]


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque thing>"


async def test_each_journaled_call_shows_what_it_was_given(db_url: str) -> None:
    seen = Agent("seen")

    @seen.node(start=True)
    async def look(state: dict[str, Any], ctx: Context) -> Command:
        await ctx.call(search, "tether", limit=2, api_key="sk-live-123", options=Opaque())
        await ctx.call(reply)
        await ctx.call(search, "x" * 5000, limit=1, api_key="k")
        return finish({})

    rt = make_runtime(db_url, seen)
    async with inprocess.working(rt):
        run = await rt.start("seen", {})
        assert (await rt.wait(run.thread_id, timeout=WAIT)).status == "completed"
        calls = await rt.calls(run.thread_id, 1)
        assert calls[0].args == {"args": ["tether"], "kwargs": {
            "limit": 2, "api_key": "***", "options": "<Opaque thing>"}}
        assert calls[0].result == ["tether-0", "tether-1"]
        assert calls[1].args is None  # no arguments
        cut = calls[2].args
        assert isinstance(cut, str) and len(cut) == 4000 and cut.endswith("…")
        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            step_page = (await c.get(f"/ui/runs/{run.thread_id}/steps/1")).text
            run_page = (await c.get(f"/ui/runs/{run.thread_id}")).text
        for page in (step_page, run_page):
            assert "<th>arguments</th>" in page
            assert "&#34;api_key&#34;: &#34;***&#34;" in page and "sk-live-123" not in page
            assert "&lt;Opaque thing&gt;" in page  # escaped, never markup
        # The run page lists the calls of the steps it shows, each row its step (a link to
        # the step's page), its arguments and its result side by side.
        section = run_page[run_page.index('class="run-calls"'):]
        rows = re.findall(r"<tr>(.*?)</tr>", section[:section.index("</section>")], re.S)
        first = rows[1]  # rows[0] is the header
        assert f'href="/ui/runs/{run.thread_id}/steps/1">1<' in first
        assert first.index("&#34;limit&#34;: 2") < first.index("tether-0")
        assert len(rows) == 4
