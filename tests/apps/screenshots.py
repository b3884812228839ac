"""Pictures of each dashboard view for the docs (`scripts/screenshots`): a real `tether
serve` with an embedded worker on a fresh SQLite database in a temporary directory, a few runs
of tests/apps/dashboard_app.py in every interesting state, and Debian's Chromium.

    scripts/screenshots [OUT_DIR]        # default docs/images
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))

from browser import launch
from http_harness import Procs, wait_until

import tether

APP = "dashboard_app:runtime"
ROOT = Path(__file__).resolve().parents[2]


def seed(c: Any) -> dict[str, str]:
    def start(agent: str, input: dict[str, Any]) -> str:
        r = c.post("/runs", json={"agent": agent, "input": input})
        r.raise_for_status()
        tid: str = r.json()["thread_id"]
        return tid

    def status(tid: str) -> str:
        s: str = c.get(f"/runs/{tid}").json()["status"]
        return s

    ids = {
        "ticker": start("ticker", {"steps": 8, "delay": 0.02}),
        "approval": start("approval", {"item": "the refund for order 1182"}),
        "notifier": start("notifier", {"to": "ops@example.com"}),
        "failing": start("failing", {}),
    }
    for _ in range(3):
        start("ticker", {"steps": 3, "delay": 0.01})
    start("approval", {"item": "the Q3 report"})
    wait_until(lambda: status(ids["ticker"]) == "completed", 60, "the ticker run")
    wait_until(lambda: status(ids["approval"]) == "waiting", 60, "the approval run")
    wait_until(lambda: status(ids["failing"]) == "failed", 60, "the failing run")
    r = c.post(f"/runs/{ids['ticker']}/fork", json={"step": 5})
    r.raise_for_status()
    return ids


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "images"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/dashboard.db"
        asyncio.run(tether.Runtime(db).migrate())
        procs = Procs(Path(tmp), db)
        try:
            server = procs.serve(app=APP, worker=True)
            os.environ["DASH_VERSION"] = "v2"  # a worker of a second version
            try:
                procs.worker(app=APP)
            finally:
                del os.environ["DASH_VERSION"]
            with server.client() as c:
                ids = seed(c)
                wait_until(lambda: len(c.get("/workers").json()["workers"]) == 2, 60,
                           "both workers")
                # v1 drains: new runs go to v2, v1's waiting runs finish on it.
                c.put("/deployments", json={"weights": {"v1": 0, "v2": 100}}).raise_for_status()
                wait_until(lambda: "dead" in effect_statuses(db, ids["notifier"]), 60,
                           "the dead effect")
            shots(server.base_url, ids, out)
        finally:
            procs.close()
    for p in sorted(out.glob("dashboard-*.png")):
        print(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
    return 0


def effect_statuses(db: str, thread_id: str) -> list[str]:
    async def read() -> list[str]:  # the HTTP API has no effects endpoint
        async with tether.Runtime(db) as rt:
            return [e.status for e in await rt.effects(thread_id)]

    return asyncio.run(read())


def shots(base: str, ids: dict[str, str], out: Path) -> None:
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            views = [("overview", "/ui"), ("runs", "/ui/runs"),
                     ("run", f"/ui/runs/{ids['ticker']}"), ("inbox", "/ui/interrupts"),
                     ("effects", "/ui/effects"), ("failed-run", f"/ui/runs/{ids['failing']}"),
                     ("step", f"/ui/runs/{ids['approval']}/steps/1"),
                     ("deployments", "/ui/deployments"), ("workers", "/ui/workers"),
                     ("metrics", "/ui/metrics"),
                     ("agent", f"/ui/agents/approval?thread_id={ids['approval']}")]
            for name, path in views:
                page.goto(base + path)
                if name == "run":
                    page.locator("table.timeline > tbody > tr").nth(2).locator(
                        "details.diff summary").click()
                if name == "failed-run":
                    page.locator("section.failure summary").click()
                if name == "inbox":
                    page.get_by_label("Value (JSON)").first.fill('{"approved": true}')
                page.screenshot(path=str(out / f"dashboard-{name}.png"), full_page=True)
        finally:
            browser.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
