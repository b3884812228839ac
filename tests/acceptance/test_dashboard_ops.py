"""The dashboard's operator views in Debian's headless Chromium (Playwright), against a real
`tether serve` and real workers of two versions, on every store: route and drain a version
and watch its state change (live, in a second tab), bad weights refused with nothing changed,
the workers list, the runs list's filters and orders in the URL, a run's children tree."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import BrowserContext, Page, expect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

import test_dashboard as dash
from http_harness import Procs, Server, wait_until
from test_dashboard import APP, error_banner, start, wait_status

# The browser, its context, the processes and a server of one version: test_dashboard's.
browser, context, procs, server = dash.browser, dash.context, dash.procs, dash.server


def deployment(c: httpx.Client, version: str) -> dict[str, Any]:
    found = [d for d in c.get("/deployments").json()["deployments"] if d["version"] == version]
    assert found, version
    return found[0]


def row(page: Page, version: str) -> Any:
    return page.locator(f"table.deployments tr[data-version='{version}']")


@pytest.fixture
def two_versions(procs: Procs, monkeypatch: pytest.MonkeyPatch) -> Server:
    """A server and a worker of v1, and a worker of v2 (the app reads $DASH_VERSION)."""
    s = procs.serve(app=APP)
    procs.worker(app=APP)
    monkeypatch.setenv("DASH_VERSION", "v2")
    procs.worker(app=APP)
    monkeypatch.delenv("DASH_VERSION")
    with s.client() as c:
        wait_until(lambda: {w["version"] for w in c.get("/workers").json()["workers"]
                            if w["alive"]} == {"v1", "v2"}, 30, "a live worker of each version")
    return s


def test_route_then_drain_a_version_and_watch_its_state(two_versions: Server,
                                                        context: BrowserContext) -> None:
    server = two_versions
    with server.client() as c:
        tid = start(c, "approval", {"item": "on v1"})  # no weights yet: the server's v1
        wait_status(c, tid, "waiting")
        watcher = context.new_page()  # a second tab, left open on the deployments page
        watcher.goto(f"{server.base_url}/ui/deployments")
        expect(watcher.locator("body[data-live=connected]")).to_be_attached()
        watcher.evaluate("window.__notReloaded = true")

        page = context.new_page()
        page.goto(f"{server.base_url}/ui/deployments")
        expect(row(page, "v1").locator("[data-field=state]")).to_have_text("active")
        expect(row(page, "v2").locator("td.num").nth(1)).to_have_text("1")  # live workers
        form = page.get_by_role("form", name="Routing weights")
        form.get_by_label("v1").fill("50")
        form.get_by_label("v2").fill("50")
        form.get_by_role("button", name="Save weights").click()
        expect(page.locator(".notice")).to_have_text("Weights saved: new runs are routed by "
                                                     "them.")
        expect(row(page, "v1").locator("[data-field=weight]")).to_have_text("50")
        expect(row(page, "v2").locator("[data-field=weight]")).to_have_text("50")
        assert (deployment(c, "v1")["weight"], deployment(c, "v2")["weight"]) == (50, 50)

        row(page, "v1").get_by_role("button", name="Drain v1").click()
        expect(page.locator(".notice")).to_contain_text("Draining")
        # Its waiting run keeps it draining: it finishes on v1.
        expect(row(page, "v1").locator("[data-field=state]")).to_have_text("draining")
        expect(row(page, "v1").locator("[data-field=weight]")).to_have_text("0")
        expect(row(page, "v1").get_by_role("button", name="Drain v1")).to_have_count(0)
        expect(row(watcher, "v1").locator("[data-field=state]")).to_have_text("draining")

        r = c.post(f"/runs/{tid}/resume", json={"value": True})
        assert r.status_code == 200, r.text
        assert wait_status(c, tid, "completed")["version"] == "v1"
        # The other tab sees v1 drained without a reload.
        expect(row(watcher, "v1").locator("[data-field=state]")).to_have_text("drained")
        assert watcher.evaluate("window.__notReloaded") is True
        assert deployment(c, "v1")["state"] == "drained"

        events = c.get("/audit").json()["events"]
        assert [(e["action"], e["actor"]) for e in events if e["action"] in ("route", "drain")
                ] == [("drain", "dashboard"), ("route", "dashboard")]


def test_bad_weights_are_refused_and_change_nothing(two_versions: Server,
                                                    context: BrowserContext) -> None:
    server = two_versions
    with server.client() as c:
        before = c.get("/deployments").json()
        page = context.new_page()
        page.goto(f"{server.base_url}/ui/deployments")
        form = page.get_by_role("form", name="Routing weights")
        for v1, v2, message in (("-5", "10", "The weight of 'v1' must be a whole number"),
                                ("1.5", "10", "The weight of 'v1' must be a whole number"),
                                ("ten", "10", "The weight of 'v1' must be a whole number"),
                                ("0", "0", "The weights sum to 0")):
            form.get_by_label("v1").fill(v1)
            form.get_by_label("v2").fill(v2)
            form.get_by_role("button", name="Save weights").click()
            expect(error_banner(page)).to_contain_text(message)
            expect(error_banner(page)).to_contain_text("Nothing was changed.")
            expect(form.get_by_label("v1")).to_have_value(v1)  # what was typed stays
        # A version no worker ever registered (a hand-edited form).
        form.get_by_label("v1").fill("10")
        form.get_by_label("v2").evaluate("el => el.name = 'weight:v9'")
        form.get_by_role("button", name="Save weights").click()
        expect(error_banner(page)).to_contain_text("unknown version 'v9'")
        # Draining the only version that would take new runs: the runtime refuses.
        assert c.put("/deployments", json={"weights": {"v1": 0, "v2": 10}}).status_code == 200
        before = c.get("/deployments").json()
        page.goto(f"{server.base_url}/ui/deployments")
        row(page, "v2").get_by_role("button", name="Drain v2").click()
        expect(error_banner(page)).to_contain_text("would leave no version for new runs")
        assert c.get("/deployments").json() == before


def test_workers_are_listed_with_their_slots_and_heartbeat(two_versions: Server,
                                                           context: BrowserContext) -> None:
    server = two_versions
    with server.client() as c:
        workers = c.get("/workers").json()["workers"]
    page = context.new_page()
    page.goto(f"{server.base_url}/ui/workers")
    rows = page.locator("table.workers tbody tr")
    expect(rows).to_have_count(len(workers))
    for w in workers:
        r = page.locator(f"tr[data-worker='{w['id']}']")
        expect(r).to_contain_text(w["host"])
        expect(r).to_contain_text(w["version"])
        expect(r).to_contain_text(f"{w['busy']} / {w['concurrency']}")
        expect(r.locator("[data-field=alive]")).to_have_text("alive")
        expect(r).to_contain_text("approval")


def test_runs_list_filters_and_orders_live_in_the_url(server: Server,
                                                      context: BrowserContext) -> None:
    with server.client() as c:
        made = []
        for name in ("order-1", "order-2", "order-3", "order_x", "invoice-1"):
            r = c.post("/runs", json={"agent": "ticker", "input": {"steps": 1},
                                      "thread_id": name})
            assert r.status_code == 201, r.text
            made.append(name)
        for name in made:
            wait_status(c, name, "completed")
    page = context.new_page()
    page.goto(f"{server.base_url}/ui/runs")
    page.get_by_label("thread_id starts with").fill("order-")
    page.get_by_label("Order").select_option("oldest")
    page.get_by_label("Per page").select_option("20")
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"prefix=order-.*order=oldest"))
    ids = page.locator("table.runs > tbody > tr")
    expect(ids).to_have_count(3)  # not order_x: the prefix is no LIKE pattern
    expect(ids.first).to_have_attribute("data-thread", "order-1")
    page.get_by_label("Order").select_option("newest")
    page.get_by_role("button", name="Filter").click()
    expect(ids.first).to_have_attribute("data-thread", "order-3")
    page.goto(f"{server.base_url}/ui/runs?prefix=order_")
    expect(ids).to_have_count(1)
    page.goto(f"{server.base_url}/ui/runs?version=v1&since=2000-01-01&until=2999-01-01"
              "&limit=20")
    expect(ids).to_have_count(5)
    page.goto(f"{server.base_url}/ui/runs?version=v7")
    expect(page.get_by_text("No runs match.")).to_be_visible()
    page.goto(f"{server.base_url}/ui/runs?since=2999-01-01T00:00")
    expect(page.get_by_text("No runs match.")).to_be_visible()
    resp = page.goto(f"{server.base_url}/ui/runs?since=yesterday")
    assert resp is not None and resp.status == 400
    expect(error_banner(page)).to_contain_text("Created since must be a date")
    resp = page.goto(f"{server.base_url}/ui/runs?order=sideways")
    assert resp is not None and resp.status == 400
    expect(error_banner(page)).to_contain_text("Unknown order 'sideways'")


def test_a_runs_children_are_a_tree(server: Server, context: BrowserContext) -> None:
    with server.client() as c:
        r = c.post("/runs", json={"agent": "family", "input": {"kids": 2}, "thread_id": "fam"})
        assert r.status_code == 201, r.text
        for tid in ("fam", "fam.0", "fam.1", "fam.0.0", "fam.1.0"):
            wait_status(c, tid, "completed")
    page = context.new_page()
    page.goto(f"{server.base_url}/ui/runs/fam")
    tree = page.locator("section.children")
    expect(tree.locator("li[data-child]")).to_have_count(4)
    kid = tree.locator("li[data-child='fam.0']")
    expect(kid.locator("> .status")).to_have_text("completed")
    expect(kid.locator("li[data-child='fam.0.0']")).to_be_visible()  # nested under its parent
    kid.get_by_role("link", name="fam.0.0").click()
    expect(page).to_have_url(re.compile(r"/ui/runs/fam\.0\.0$"))
    expect(page.locator("dl.summary")).to_contain_text("fam.0")  # its parent
    expect(page.locator("section.children")).to_have_count(0)  # a leaf


def test_a_runs_mail_out_beside_its_inbox_read_or_not_live(server: Server,
                                                           context: BrowserContext) -> None:
    with server.client() as c:
        for tid, agent in (("mail-ask", "approval"), ("mail-box", "listener")):
            r = c.post("/runs", json={"agent": agent, "input": {"item": "x"}, "thread_id": tid})
            assert r.status_code == 201, r.text
            wait_status(c, tid, "waiting")
        r = c.post("/runs", json={"agent": "messenger", "thread_id": "mail-from",
                                  "input": {"to": ["mail-box", "mail-ask"]}})
        assert r.status_code == 201, r.text
        wait_status(c, "mail-from", "completed")
        # The listener wakes for its message and reads it; the approval waits for a person.
        wait_until(lambda: c.get("/runs/mail-box").json()["state"].get("got"), 30,
                   "the listener to read its mail")
        wait_status(c, "mail-box", "waiting")

        page = context.new_page()
        page.goto(f"{server.base_url}/ui/runs/mail-from")
        expect(page.locator("body[data-live=connected]")).to_be_attached()
        page.evaluate("window.__notReloaded = true")
        sent = page.locator("section.mail-out tbody tr")
        expect(sent).to_have_count(2)
        # Newest first: one step sent both, mail-ask's after mail-box's.
        expect(sent.nth(0).locator("td").nth(1)).to_have_text("mail-ask")
        expect(sent.nth(0)).to_contain_text('{"hello":"mail-ask"}')
        expect(sent.nth(0).locator("td").nth(4)).to_have_text("unread")
        expect(sent.nth(1).locator("td").nth(1)).to_have_text("mail-box")
        expect(sent.nth(1).locator("td").nth(4)).to_have_text(re.compile(r"^at step \d+$"))
        expect(page.locator("section.mail-in")).to_contain_text("No unread messages.")

        # The recipient's page shows the message unread in its mailbox, from mail-from.
        other = context.new_page()
        other.goto(f"{server.base_url}/ui/runs/mail-ask")
        expect(other.locator("section.mail-in tbody tr")).to_contain_text("mail-from")
        expect(other.locator("section.mail-out")).to_contain_text("This run sent no messages.")

        # Answered, mail-ask's next step reads the message: the sender's page follows live.
        r = c.post("/runs/mail-ask/resume", json={"value": True})
        assert r.status_code == 200, r.text
        wait_status(c, "mail-ask", "completed")
        expect(sent.nth(0).locator("td").nth(4)).to_have_text(re.compile(r"^at step \d+$"))
        assert page.evaluate("window.__notReloaded") is True
        sent.nth(0).get_by_role("link", name="mail-ask").click()
        expect(page).to_have_url(re.compile(r"/ui/runs/mail-ask$"))
        expect(page.locator("section.mail-in")).to_contain_text("No unread messages.")


def test_retire_a_drained_version_refused_while_it_has_open_runs(two_versions: Server,
                                                                 context: BrowserContext) -> None:
    server = two_versions
    with server.client() as c:
        tid = start(c, "approval", {"item": "on v1"})  # no weights yet: the server's v1
        wait_status(c, tid, "waiting")
        assert c.put("/deployments", json={"weights": {"v1": 0, "v2": 10}}).status_code == 200
        page = context.new_page()
        page.goto(f"{server.base_url}/ui/deployments")
        expect(row(page, "v1").locator("[data-field=state]")).to_have_text("draining")
        expect(row(page, "v2").get_by_role("button", name="Retire v2")).to_have_count(0)
        before = c.get("/deployments").json()
        row(page, "v1").get_by_role("button", name="Retire v1").click()
        expect(error_banner(page)).to_contain_text(f"version 'v1' still has open runs: {tid}")
        expect(error_banner(page)).to_contain_text("Nothing was changed.")
        assert c.get("/deployments").json() == before

        # The refused action's page (at its POST URL) still follows the view live.
        assert c.post(f"/runs/{tid}/cancel").status_code == 200
        expect(row(page, "v1").locator("[data-field=state]")).to_have_text("drained")
        row(page, "v1").get_by_role("button", name="Retire v1").click()
        expect(page.locator(".notice")).to_have_text("Retired: that version never takes a run "
                                                     "again.")
        expect(row(page, "v1").locator("[data-field=state]")).to_have_text("retired")
        expect(row(page, "v1").get_by_role("button")).to_have_count(0)
        expect(page.get_by_role("form", name="Routing weights").get_by_label("v1")
               ).to_have_count(0)
        assert deployment(c, "v1")["state"] == "retired"
        events = c.get("/audit").json()["events"]
        assert [(e["action"], e["actor"], e["target"]) for e in events
                if e["action"] == "retire"] == [("retire", "dashboard", "v1")]


def test_the_runs_table_fits_a_narrow_window(server: Server, context: BrowserContext) -> None:
    with server.client() as c:
        long_id = "customer-" + "x" * 60
        r = c.post("/runs", json={"agent": "ticker", "input": {"steps": 1},
                                  "thread_id": long_id})
        assert r.status_code == 201, r.text
        wait_status(c, long_id, "completed")
    page = context.new_page()
    page.set_viewport_size({"width": 400, "height": 800})
    page.goto(f"{server.base_url}/ui/runs")
    expect(page.locator(f"tr[data-thread='{long_id}']")).to_be_visible()
    table = page.locator("table.runs")
    width = table.evaluate("t => t.getBoundingClientRect().right")
    assert width <= 400, width  # no sideways scrolling for the table
    expect(table.locator("th", has_text="status")).to_be_visible()
    expect(table.locator("th", has_text="updated")).to_be_hidden()
    page.set_viewport_size({"width": 1200, "height": 800})
    expect(table.locator("th", has_text="updated")).to_be_visible()


def test_the_overview_flags_a_waiting_person_and_mail_goes_from_the_run_page(
        server: Server, context: BrowserContext) -> None:
    with server.client() as c:
        tid = start(c, "approval", {"item": "po 12"})
        wait_status(c, tid, "waiting")
    page = context.new_page()
    page.goto(f"{server.base_url}/ui")
    attention = page.locator("section.attention")
    expect(attention).to_contain_text("a person has been asked for")
    expect(attention).to_contain_text(tid)
    attention.get_by_role("link", name=re.compile("a person has been asked")).click()
    expect(page).to_have_url(re.compile(r"/ui/interrupts$"))
    page.goto(f"{server.base_url}/ui/runs/{tid}")
    page.get_by_label("Message (JSON)").fill("status")
    page.get_by_role("button", name="Send").click()
    expect(error_banner(page)).to_contain_text("a string is quoted")
    expect(page.get_by_label("Message (JSON)")).to_have_value("status")  # kept as typed
    page.get_by_label("Message (JSON)").fill('{"ask": "status"}')
    page.get_by_label("Sender").fill("ops")
    page.get_by_role("button", name="Send").click()
    expect(page.locator(".notice")).to_have_text(
        "Message sent: the run reads it at its next receive().")
    with server.client() as c:
        inbox = c.get(f"/runs/{tid}/messages").json()["messages"]
    assert [(m["message"], m["sender"]) for m in inbox] == [({"ask": "status"}, "ops")]
