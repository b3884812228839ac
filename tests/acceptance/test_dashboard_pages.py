"""The dashboard's metrics page (/ui/metrics), the overview's throughput sparkline and the agent
pages (/ui/agents/{name}) in Debian's headless Chromium, against a real `tether serve` and a
real `tether worker` on every store: the charts and tables show what a known workload did."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from browser import launch
from http_harness import Procs, Server, wait_until

APP = "dashboard_app:runtime"
TIMEOUT = 30_000
TICKERS = 4
expect.set_options(timeout=TIMEOUT)


@pytest.fixture
def browser(db_url: str) -> Iterator[Browser]:
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
def server(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setenv("DASH_FX_OK", str(tmp_path / "relay-up"))
    monkeypatch.setenv("DASH_FIXED", str(tmp_path / "fixed"))  # never made: `failing` fails
    p = Procs(tmp_path, db_url)
    try:
        s = p.serve(app=APP)
        p.worker(app=APP)
        yield s
    finally:
        p.close()


def start(c: httpx.Client, agent: str, input: dict[str, object]) -> str:
    r = c.post("/runs", json={"agent": agent, "input": input})
    assert r.status_code == 201, r.text
    tid: str = r.json()["thread_id"]
    return tid


def settle(c: httpx.Client, tid: str, *statuses: str) -> dict[str, object]:
    def check() -> dict[str, object] | None:
        run: dict[str, object] = c.get(f"/runs/{tid}").json()
        return run if run["status"] in statuses else None

    got: dict[str, object] = wait_until(check, 30, f"run {tid} to be {'/'.join(statuses)}")
    return got


def workload(c: httpx.Client) -> dict[str, object]:
    """TICKERS ticker runs of 3 steps, one failed run, two approval runs (one answered and
    completed, one left waiting): TICKERS + 2 finished, one parked."""
    tickers = [start(c, "ticker", {"steps": 3, "delay": 0.01}) for _ in range(TICKERS)]
    failed = start(c, "failing", {})
    done, waiting = start(c, "approval", {"item": "a"}), start(c, "approval", {"item": "b"})
    for tid in (done, waiting):
        settle(c, tid, "waiting")
    r = c.post(f"/runs/{done}/resume", json={"value": {"approved": True}})
    assert r.status_code in (200, 202), r.text
    runs = [settle(c, t, "completed") for t in (*tickers, done)]
    runs.append(settle(c, failed, "failed"))
    runs.append(settle(c, waiting, "waiting"))
    return {"steps": sum(int(str(r["step"])) for r in runs), "done": done,
            "waiting": waiting, "failed": failed, "tickers": tickers}


def figure(page: Page, window: str, name: str) -> object:
    return page.locator(f"section[data-window={window}] [data-figure={name}]")


def test_metrics_page_and_overview_show_what_the_workload_did(server: Server,
                                                              context: BrowserContext) -> None:
    with server.client() as c:
        w = workload(c)
        page = context.new_page()
        page.goto(f"{server.base_url}/ui")
        spark = page.locator("section.throughput")
        expect(spark.locator("[data-figure=runs]")).to_have_text(str(TICKERS + 2))
        expect(spark.locator("[data-figure=steps]")).to_have_text(str(w["steps"]))
        assert spark.locator("svg.spark").count() == 2
        page.get_by_role("navigation").get_by_role("link", name="Metrics").click()
        expect(page).to_have_url(re.compile(r"/ui/metrics$"))
        for window in ("hour", "day"):
            expect(figure(page, window, "runs")).to_have_text(str(TICKERS + 2))
            expect(figure(page, window, "steps")).to_have_text(str(w["steps"]))
            sec = page.locator(f"section[data-window={window}]")
            # The bars add up to the totals: the chart draws what the store holds.
            for kind, total in (("runs", TICKERS + 2), ("steps", w["steps"])):
                svg = sec.locator(f"svg.chart.{kind}")
                assert svg.get_attribute("data-total") == str(total)
                ns = [int(n or 0) for n in svg.locator("rect.bar").evaluate_all(
                    "rs => rs.map(r => r.dataset.n)")]
                assert sum(ns) == total
            expect(sec.locator("table.failures tr[data-category=exception] td").first
                   ).to_have_text("1")
            lat = sec.locator("table.latency tr[data-agent=ticker]")
            expect(lat.locator("[data-col=steps]")).to_have_text(str(3 * TICKERS))
            expect(lat.locator("[data-col=runs]")).to_have_text(str(TICKERS))
            expect(sec.locator("table.queue tr[data-agent=approval] [data-col=runs]")
                   ).to_have_text("2")
        expect(page.locator("table.parked tr[data-version='(all)'] td[data-status=waiting]")
               ).to_have_text("1")

        # Live: another run finishing shows without a reload.
        expect(page.locator("body[data-live=connected]")).to_be_attached()
        page.evaluate("window.__notReloaded = true")
        settle(c, start(c, "ticker", {"steps": 1, "delay": 0.01}), "completed")
        expect(figure(page, "hour", "runs")).to_have_text(str(TICKERS + 3))
        assert page.evaluate("window.__notReloaded") is True


def test_agent_page_shows_nodes_edges_and_one_runs_path(server: Server,
                                                        context: BrowserContext) -> None:
    with server.client() as c:
        w = workload(c)
        page = context.new_page()
        page.goto(f"{server.base_url}/ui/runs/{w['waiting']}")
        page.locator("dl.summary").get_by_role("link", name="approval", exact=True).click()
        expect(page).to_have_url(re.compile(r"/ui/agents/approval$"))
        edges = page.locator("table.edges tbody tr")
        expect(edges).to_have_count(2)
        expect(page.locator("table.edges tr[data-from=draft][data-to=ask] td").nth(2)
               ).to_have_text("2")
        expect(page.locator("table.edges tr[data-from=ask][data-to='(end)'] td").nth(2)
               ).to_have_text("1")
        expect(page.locator("table.nodes tbody tr")).to_have_count(2)
        graph = page.locator("svg.graph")
        expect(graph.locator("g.node[data-node=draft]")).to_be_visible()
        expect(graph.locator("g.node[data-node=ask]")).to_be_visible()
        assert graph.locator("g.edge[data-from=draft][data-to=ask]").get_attribute(
            "data-count") == "2"
        expect(graph.locator("g.edge.on")).to_have_count(0)

        # The waiting run's path: draft -> ask only.
        page.goto(f"{server.base_url}/ui/runs/{w['waiting']}")
        page.get_by_role("link", name="(this run's path)").click()
        expect(page).to_have_url(re.compile(rf"/ui/agents/approval\?thread_id={w['waiting']}$"))
        expect(page.locator("p.highlight")).to_contain_text("draft → ask")
        expect(page.locator("table.edges tr.on")).to_have_count(1)
        expect(page.locator("table.edges tr.on[data-from=draft][data-to=ask]")).to_have_count(1)
        expect(graph.locator("g.edge.on[data-from=draft][data-to=ask]")).to_have_count(1)
        # The completed one's: draft -> ask -> (end).
        page.goto(f"{server.base_url}/ui/agents/approval?thread_id={w['done']}")
        expect(page.locator("table.edges tr.on")).to_have_count(2)
        expect(graph.locator("g.edge.on")).to_have_count(2)

        # The ticker's loop, from the runs list's agent link.
        page.goto(f"{server.base_url}/ui/runs?agent=ticker")
        page.locator("table tbody tr").first.get_by_role("link", name="ticker").click()
        expect(page).to_have_url(re.compile(r"/ui/agents/ticker$"))
        expect(page.locator("table.edges tr[data-from=tick][data-to=tick] td").nth(2)
               ).to_have_text(str(2 * TICKERS))
        expect(page.locator("table.edges tr[data-from=tick][data-to='(end)'] td").nth(2)
               ).to_have_text(str(TICKERS))

        resp = page.goto(f"{server.base_url}/ui/agents/nope")
        assert resp is not None and resp.status == 404
        expect(page.locator("p.error[role=alert]")).to_contain_text("No agent named 'nope'")
        resp = page.goto(f"{server.base_url}/ui/agents/ticker?thread_id={w['done']}")
        assert resp is not None and resp.status == 404
        expect(page.locator("p.error[role=alert]")).to_contain_text(
            "is a run of agent 'approval'")
