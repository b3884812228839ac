"""The dashboard (/ui) in Debian's headless Chromium (Playwright), against a real `tether
serve` subprocess and a real `tether worker` subprocess, on every store: answer an interrupt
in the inbox and watch the run complete on its page (and in a second tab, live), a conflict,
cancel, fork from step 2, retry a dead effect, token sign-in, and bad input in every form."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from browser import launch
from http_harness import Procs, Server, wait_until

APP = "dashboard_app:runtime"
TIMEOUT = 30_000  # ms: a busy 2-core machine runs several servers and browsers at once
expect.set_options(timeout=TIMEOUT)


@pytest.fixture
def browser(db_url: str) -> Iterator[Browser]:
    # Playwright's sync API runs an event loop in this thread until it stops: the database
    # (whose first use builds the session's template with asyncio.run) must come first.
    with sync_playwright() as p:
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def procs(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Procs]:
    monkeypatch.setenv("DASH_FX_OK", str(tmp_path / "relay-up"))
    monkeypatch.setenv("DASH_FIXED", str(tmp_path / "fixed"))
    p = Procs(tmp_path, db_url)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def server(procs: Procs) -> Server:
    s = procs.serve(app=APP)
    procs.worker(app=APP)
    return s


def start(c: httpx.Client, agent: str, input: dict[str, Any] | None = None) -> str:
    r = c.post("/runs", json={"agent": agent, "input": input or {}})
    assert r.status_code == 201, r.text
    tid: str = r.json()["thread_id"]
    return tid


def wait_status(c: httpx.Client, tid: str, *statuses: str) -> dict[str, Any]:
    def check() -> Any:
        run = c.get(f"/runs/{tid}").json()
        return run if run["status"] in statuses else None

    got: dict[str, Any] = wait_until(check, 30, f"run {tid} to be {'/'.join(statuses)}")
    return got


def status_badge(page: Page) -> Any:
    return page.locator("h1 .status")


def error_banner(page: Page) -> Any:
    return page.locator("p.error[role=alert]")


# -- the inbox, live updates -------------------------------------------------------------------


def test_answer_in_inbox_and_watch_the_run_complete_live(server: Server,
                                                         context: BrowserContext) -> None:
    with server.client() as c:
        tid = start(c, "approval", {"item": "invoice 7"})
        wait_status(c, tid, "waiting")
        [pending] = c.get("/interrupts", params={"thread_id": tid}).json()["interrupts"]

        watcher = context.new_page()  # a second tab, left open on the run's page
        watcher.goto(f"{server.base_url}/ui/runs/{tid}")
        expect(status_badge(watcher)).to_have_text("waiting")
        expect(watcher.locator("body[data-live=connected]")).to_be_attached()
        watcher.evaluate("window.__notReloaded = true")

        inbox = context.new_page()
        inbox.goto(f"{server.base_url}/ui/interrupts")
        item = inbox.locator(f"li[data-interrupt='{pending['id']}']")
        expect(item).to_contain_text("send 'reply to invoice 7'?")
        item.get_by_label("Value (JSON)").fill('{"approved": true, "note": "ok"}')
        item.get_by_role("button", name="Resume").click()

        expect(inbox).to_have_url(re.compile(rf"/ui/runs/{tid}\?done=resumed$"))
        expect(inbox.locator(".notice")).to_have_text("Answer recorded; the run continues.")
        expect(status_badge(inbox)).to_have_text("completed")  # live: the worker finished it
        expect(inbox.locator("pre.state")).to_contain_text('"note": "ok"')

        # The other tab saw it happen without a reload.
        expect(status_badge(watcher)).to_have_text("completed")
        assert watcher.evaluate("window.__notReloaded") is True
        expect(watcher.locator("table.timeline > tbody > tr")).to_have_count(2)

        run = c.get(f"/runs/{tid}").json()
        assert run["status"] == "completed"
        assert run["state"]["answer"] == {"approved": True, "note": "ok"}
        inbox.goto(f"{server.base_url}/ui/interrupts")
        expect(inbox.locator(f"li[data-interrupt='{pending['id']}']")).to_have_count(0)

        # A step's own page: its journaled calls, and its diff from the step before.
        watcher.locator("table.timeline > tbody > tr").first.get_by_role("link", name="1").click()
        expect(watcher).to_have_url(re.compile(rf"/ui/runs/{tid}/steps/1$"))
        expect(watcher.locator("table.calls tbody tr td")).to_have_text(  # arguments, result
            ["0", re.compile("suggest_reply"), re.compile(r'"args": \[\s*"invoice 7"\s*\]'),
             re.compile(r'"text": "reply to invoice 7"')])
        expect(watcher.get_by_text("This is the first step")).to_be_visible()
        watcher.get_by_role("link", name="Step 2").click()
        expect(watcher.locator("tr[data-path='answer'] td").nth(1)).to_have_text("added")
        expect(watcher.locator("table.calls tbody tr td")).to_have_text(  # the answer
            ["0", "tether.interrupt", "-", re.compile(r'"note": "ok"')])
        resp = watcher.goto(f"{server.base_url}/ui/runs/{tid}/steps/9")
        assert resp is not None and resp.status == 404
        expect(error_banner(watcher)).to_contain_text("has no committed step 9")


def test_an_interrupt_answered_elsewhere_is_a_plain_conflict(server: Server,
                                                             browser: Browser) -> None:
    # Without JavaScript: no live refresh removes the stale form, and the page still works.
    ctx = browser.new_context(java_script_enabled=False)
    ctx.set_default_timeout(TIMEOUT)
    try:
        with server.client() as c:
            tid = start(c, "approval", {"item": "po 9"})
            wait_status(c, tid, "waiting")
            [pending] = c.get("/interrupts", params={"thread_id": tid}).json()["interrupts"]
            page = ctx.new_page()
            page.goto(f"{server.base_url}/ui/interrupts")
            item = page.locator(f"li[data-interrupt='{pending['id']}']")
            item.get_by_label("Value (JSON)").fill('"mine"')

            r = c.post(f"/runs/{tid}/resume", json={"value": "theirs"})
            assert r.status_code == 200, r.text
            item.get_by_role("button", name="Resume").click()

            expect(error_banner(page)).to_contain_text("Someone answered first")
            expect(error_banner(page)).to_contain_text("Your answer was not recorded")
            answered = c.get("/interrupts", params={"thread_id": tid, "status": "all"}).json()
            assert [i["value"] for i in answered["interrupts"]] == ["theirs"]
            assert wait_status(c, tid, "completed")["state"]["answer"] == "theirs"
    finally:
        ctx.close()


# -- actions on a run ----------------------------------------------------------------------------


def test_cancel_a_run(server: Server, context: BrowserContext) -> None:
    with server.client() as c:
        tid = start(c, "ticker", {"steps": 1000, "delay": 0.2})
        wait_until(lambda: c.get(f"/runs/{tid}").json()["step"] >= 1, 30, "a first step")
        page = context.new_page()
        page.goto(f"{server.base_url}/ui/runs/{tid}")
        page.get_by_role("button", name="Cancel run").click()
        expect(page.locator(".notice")).to_have_text("Run cancelled.")
        expect(status_badge(page)).to_have_text("cancelled")
        expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)
        run = c.get(f"/runs/{tid}").json()
        assert run["status"] == "cancelled"
        step = run["step"]
        page.wait_for_timeout(1000)
        assert c.get(f"/runs/{tid}").json()["step"] == step  # nothing ran after the cancel

        page.goto(f"{server.base_url}/ui")
        expect(page.locator("tr[data-status=cancelled] td.num").first).to_have_text("1")
        expect(page.locator("tr[data-status=running] td.num").first).to_have_text("0")
        page.locator("tr[data-status=cancelled] a").click()
        expect(page).to_have_url(re.compile(r"/ui/runs\?status=cancelled$"))
        expect(page.locator("table.runs > tbody > tr")).to_have_count(1)
        expect(page.locator(f"tr[data-thread='{tid}']")).to_contain_text("cancelled")


def test_fork_from_step_2_and_see_the_new_run(server: Server, context: BrowserContext) -> None:
    with server.client() as c:
        tid = start(c, "ticker", {"steps": 4, "delay": 0.01})
        wait_status(c, tid, "completed")
        listing = context.new_page()  # the runs list, open in another tab
        listing.goto(f"{server.base_url}/ui/runs")
        expect(listing.locator(f"tr[data-thread='{tid}']")).to_be_visible()
        expect(listing.locator("body[data-live=connected]")).to_be_attached()
        listing.evaluate("window.__notReloaded = true")
        page = context.new_page()
        page.goto(f"{server.base_url}/ui/runs/{tid}")
        rows = page.locator("table.timeline > tbody > tr")
        expect(rows).to_have_count(4)
        # The state diff from the step before: step 2 set n 1 -> 2 and appended 2 to seen.
        diff = rows.nth(1).locator("details.diff")
        diff.locator("summary").click()
        n = diff.locator("tr[data-path='n'] td")
        expect(n).to_have_text(["n", "changed", "1", "2"])
        expect(diff.locator("tr[data-path='seen'] td")).to_have_text(
            ["seen", "appended", "", re.compile(r"\[\s*2\s*\]")])
        expect(diff.locator("tr[data-path='last.step'] td")).to_have_text(
            ["last.step", "changed", "1", "2"])
        rows.nth(1).get_by_role("button", name="Fork from step 2").click()

        expect(page.locator(".notice")).to_have_text("Forked: this is the new run.")
        new = page.url.rsplit("/", 1)[1].split("?")[0]
        assert new != tid
        expect(page.locator("dl.summary")).to_contain_text(f"{tid} at step 2")
        expect(status_badge(page)).to_have_text("completed")  # live, as the worker runs it
        forked = c.get(f"/runs/{new}").json()
        assert forked["forked_from"] == tid and forked["forked_step"] == 2
        assert forked["state"]["n"] == 4 and forked["state"]["seen"] == [1, 2, 3, 4]
        expect(listing.locator(f"tr[data-thread='{new}']")).to_contain_text("fork")  # live
        assert listing.evaluate("window.__notReloaded") is True


def test_retry_a_dead_effect(server: Server, context: BrowserContext, tmp_path: Path) -> None:
    with server.client() as c:
        tid = start(c, "notifier", {"to": "ops"})
        wait_status(c, tid, "completed")
        page = context.new_page()
        page.goto(f"{server.base_url}/ui/effects")
        row = page.locator("table.effects tr", has_text=tid)
        expect(row).to_contain_text("dead")  # live: the effect dies after its one attempt
        expect(row).to_contain_text("mail relay refused 'ops'")
        (tmp_path / "relay-up").touch()
        row.get_by_role("button", name="Retry").click()
        expect(page.locator(".notice")).to_have_text("Effect queued for another attempt.")
        page.goto(f"{server.base_url}/ui/runs/{tid}")
        expect(page.locator("table.effects tbody tr")).to_contain_text("done")
        expect(page.locator("table.effects tbody tr")).to_contain_text('"sent"')


def test_a_failed_run_shows_its_traceback_and_is_retried(server: Server, context: BrowserContext,
                                                          tmp_path: Path) -> None:
    with server.client() as c:
        tid = start(c, "failing")
        wait_status(c, tid, "failed")
        page = context.new_page()
        page.goto(f"{server.base_url}/ui/runs/{tid}")
        expect(page.locator("section.failure .err")).to_have_text(
            "[exception] RuntimeError: the model returned nonsense")
        page.locator("section.failure summary").click()
        expect(page.locator("section.failure pre")).to_contain_text("Traceback")
        (tmp_path / "fixed").touch()  # the fix is deployed
        page.get_by_role("button", name="Retry run").click()
        expect(page.locator(".notice")).to_have_text("Run queued again from its failed step.")
        expect(status_badge(page)).to_have_text("completed")
        assert c.get(f"/runs/{tid}").json()["state"]["fixed"] is True
        page.goto(f"{server.base_url}/ui/runs/{tid}")
        expect(page.get_by_role("button", name="Retry run")).to_have_count(0)


# -- sign-in -------------------------------------------------------------------------------------


def test_with_a_token_nothing_works_without_it(procs: Procs, context: BrowserContext) -> None:
    server = procs.serve("--token", "s3cret", app=APP)
    procs.worker(app=APP)
    with server.client(token="s3cret") as c:
        tid = start(c, "approval", {"item": "secret plan"})
        wait_status(c, tid, "waiting")
        [pending] = c.get("/interrupts").json()["interrupts"]

    page = context.new_page()
    for path in ("/ui", "/ui/runs", f"/ui/runs/{tid}", "/ui/interrupts", "/ui/effects",
                 "/ui/deployments", "/ui/workers", f"/ui/go?thread_id={tid}"):
        page.goto(server.base_url + path)
        expect(page).to_have_url(re.compile(r"/ui/login\?next="))
        expect(page.get_by_label("Token")).to_be_visible()
        shown = page.locator("body").inner_text()  # the form keeps `next`, in a hidden field
        assert tid not in shown and "approval" not in shown and "waiting" not in shown
        assert "secret plan" not in page.content()

    with httpx.Client(base_url=server.base_url, timeout=30) as anon:
        for path, form in ((f"/ui/runs/{tid}/cancel", {}), (f"/ui/runs/{tid}/fork", {"step": "1"}),
                           ("/ui/interrupts/resume", {"thread_id": tid, "value": "1"}),
                           ("/ui/effects/retry", {"thread_id": tid, "key": "k"})):
            r = anon.post(path, data={**form, "csrf": "x"})
            assert r.status_code == 401, (path, r.status_code)
            assert tid not in r.text
        assert anon.get("/ui/live", params={"topic": f"run:{tid}"}).status_code == 401
        assert anon.get("/runs").status_code == 401  # the API still wants its bearer token
        anon.cookies.set("tether_ui", "1796000000.abc.0123abcd", path="/ui")
        forged = anon.get("/ui", follow_redirects=False)
        assert forged.status_code == 303 and forged.headers["location"].startswith("/ui/login")

    page.goto(f"{server.base_url}/ui/runs/{tid}")
    page.get_by_label("Token").fill("wrong")
    page.get_by_role("button", name="Sign in").click()
    expect(error_banner(page)).to_contain_text("Wrong token")
    page.get_by_label("Token").fill("s3cret")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(rf"/ui/runs/{tid}$"))
    expect(status_badge(page)).to_have_text("waiting")
    [cookie] = context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"

    page.goto(f"{server.base_url}/ui/interrupts")
    item = page.locator(f"li[data-interrupt='{pending['id']}']")
    item.get_by_label("Value (JSON)").fill("true")
    item.get_by_role("button", name="Resume").click()
    expect(status_badge(page)).to_have_text("completed")
    with server.client(token="s3cret") as c:
        assert c.get(f"/runs/{tid}").json()["state"]["answer"] is True
    # No actions were taken before signing in: the one answer is the signed-in one.

    [copied] = context.cookies()  # a copy of the session cookie, taken before signing out
    page.get_by_role("button", name="Sign out").click()
    page.goto(f"{server.base_url}/ui")
    expect(page).to_have_url(re.compile(r"/ui/login"))
    with httpx.Client(base_url=server.base_url, timeout=30) as thief:  # refused at once
        thief.cookies.set("tether_ui", copied["value"], path="/ui")
        replayed = thief.get(f"/ui/runs/{tid}", follow_redirects=False)
        assert replayed.status_code == 303, replayed.status_code
        assert replayed.headers["location"].startswith("/ui/login") and tid not in replayed.text


# -- bad input -----------------------------------------------------------------------------------


def test_bad_input_in_every_form_is_refused_plainly(server: Server,
                                                     context: BrowserContext) -> None:
    with server.client() as c:
        tid = start(c, "approval", {"item": "x"})
        wait_status(c, tid, "waiting")
        before = {r["thread_id"] for r in c.get("/runs").json()["runs"]}
        page = context.new_page()

        # Invalid JSON in the inbox: refused, the typed text kept, the interrupt still pending.
        page.goto(f"{server.base_url}/ui/interrupts")
        field = page.get_by_label("Value (JSON)")
        field.fill("{approved: yes")
        page.get_by_role("button", name="Resume").click()
        expect(error_banner(page)).to_contain_text("Value (JSON) is not valid JSON")
        expect(page.get_by_label("Value (JSON)")).to_have_value("{approved: yes")
        # Empty is not JSON either.
        page.get_by_label("Value (JSON)").fill("")
        page.get_by_role("button", name="Resume").click()
        expect(error_banner(page)).to_contain_text("not valid JSON")
        assert c.get(f"/runs/{tid}").json()["status"] == "waiting"

        # An unknown thread in "Go to run", and in a run's address.
        page.goto(f"{server.base_url}/ui")
        page.get_by_label("Go to run").fill("no-such-run")
        page.get_by_role("button", name="Open").click()
        expect(error_banner(page)).to_have_text("No run with thread_id 'no-such-run'.")
        resp = page.goto(f"{server.base_url}/ui/runs/no-such-run")
        assert resp is not None and resp.status == 404
        expect(error_banner(page)).to_contain_text("No run with thread_id 'no-such-run'")

        # The runs filter, from a hand-edited address.
        resp = page.goto(f"{server.base_url}/ui/runs?status=bogus")
        assert resp is not None and resp.status == 400
        expect(error_banner(page)).to_contain_text("Unknown status 'bogus'")
        page.goto(f"{server.base_url}/ui/runs?cursor=garbage")
        expect(error_banner(page)).to_contain_text("page cursor")
        resp = page.goto(f"{server.base_url}/ui/runs/{tid}?steps=last")
        assert resp is not None and resp.status == 400
        expect(error_banner(page)).to_contain_text("steps must be a step number")

        # Fork at a step that is not a number, and at one the run does not have.
        page.goto(f"{server.base_url}/ui/runs/{tid}")
        page.get_by_role("textbox", name="Fork from step").fill("two")
        page.get_by_role("button", name="Fork", exact=True).click()
        expect(error_banner(page)).to_contain_text("Step must be a whole number")
        page.get_by_role("textbox", name="Fork from step").fill("99")
        page.get_by_role("button", name="Fork", exact=True).click()
        expect(error_banner(page)).to_contain_text("cannot fork at 99")
        expect(error_banner(page)).to_contain_text("Nothing was forked")

        # A stale CSRF token (from another session): refused, nothing cancelled.
        page.goto(f"{server.base_url}/ui/runs/{tid}")
        page.locator("section.actions input[name=csrf]").first.evaluate(
            "el => el.value = 'a-token-from-yesterday'")
        page.get_by_role("button", name="Cancel run").click()
        expect(error_banner(page)).to_contain_text("This form is stale")
        expect(status_badge(page)).to_have_text("waiting")
        # ... and a form from before the session cookie was replaced.
        page.goto(f"{server.base_url}/ui/interrupts")
        page.context.clear_cookies()
        page.get_by_label("Value (JSON)").fill("1")
        page.get_by_role("button", name="Resume").click()
        expect(error_banner(page)).to_contain_text("This form is stale")

        assert c.get(f"/runs/{tid}").json()["status"] == "waiting"
        assert {r["thread_id"] for r in c.get("/runs").json()["runs"]} == before
        [pending] = c.get("/interrupts", params={"thread_id": tid}).json()["interrupts"]
        assert pending["status"] == "pending"


def test_read_only_serves_views_without_actions(procs: Procs, context: BrowserContext) -> None:
    writer = procs.serve(app=APP)
    procs.worker(app=APP)
    viewer = procs.serve("--read-only", app=APP)
    with writer.client() as c, viewer.client() as ro:
        tid = start(c, "approval", {"item": "y"})
        wait_status(c, tid, "waiting")
        assert ro.post("/runs", json={"agent": "ticker", "input": {}}).json()["error"][
            "type"] == "ReadOnly"
        assert ro.post(f"/runs/{tid}/cancel").status_code == 403

        page = context.new_page()
        page.goto(f"{viewer.base_url}/ui/runs/{tid}")
        expect(status_badge(page)).to_have_text("waiting")
        expect(page.locator(".badge.ro")).to_have_text("read-only")
        expect(page.locator("pre.payload")).to_contain_text("send 'reply to y'?")
        expect(page.locator("main form")).to_have_count(0)
        page.goto(f"{viewer.base_url}/ui/interrupts")
        expect(page.locator("li.interrupt")).to_have_count(1)
        expect(page.get_by_role("button", name="Resume")).to_have_count(0)

        r = httpx.post(f"{viewer.base_url}/ui/runs/{tid}/cancel", data={"csrf": "x"})
        assert r.status_code == 403 and "read-only" in r.text
        assert c.get(f"/runs/{tid}").json()["status"] == "waiting"
