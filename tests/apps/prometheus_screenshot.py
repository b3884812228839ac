"""A picture of Prometheus's graph page for docs/howto-observability.md
(`scripts/screenshot-prometheus`): the setup that page describes, on a throwaway SQLite
database in a temporary directory. A `tether worker --metrics-port` and a `tether serve`
(both on research_app.py), Debian's prometheus scraping them every second, runs of
`research` started at a rate that rises then falls for two and a half minutes (SHOT_SECONDS),
then Debian's Chromium on the graph page: steps per second by node, the median step time by
node, and the runs in the store not completed, by status (`tether serve`'s gauge).

    scripts/screenshot-prometheus [OUT.png]        # default docs/images/prometheus-graph.png
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tether
from apps.browser import launch
from apps.http_harness import Procs, free_port, wait_until
from apps.prometheus import Prometheus

APP = "research_app:runtime"
ROOT = Path(__file__).resolve().parents[2]
SECONDS = int(os.environ.get("SHOT_SECONDS", "150"))
QUERIES = ["sum by (node) (rate(tether_steps_total[15s]))",
           "histogram_quantile(0.5, sum by (le, node) "
           "(rate(tether_step_duration_seconds_bucket[30s])))",
           'sum by (status) (tether_runs{status!="completed"})']


def graph_url(base: str, minutes: int) -> str:
    """The classic graph page (Debian's build has no other) with one graph per query."""
    params: dict[str, str] = {}
    for i, expr in enumerate(QUERIES):
        params.update({f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.stacked": "0",
                       f"g{i}.range_input": f"{minutes}m"})
    return f"{base}/classic/graph?{urlencode(params)}"


def per_second(t: float) -> int:
    """Runs to start in the second `t` of the workload: up to 7 a second and back (more, for
    a while, than the worker's 3 slots keep up with: a queue builds, then drains)."""
    half = SECONDS / 2
    return round(7 * (1 - abs(t - half) / half))


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "images" / "prometheus-graph.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/research.db"
        asyncio.run(tether.Runtime(db).migrate())
        procs = Procs(Path(tmp), db)
        try:
            port = free_port()
            server = procs.serve(app=APP)
            procs.worker("--metrics-port", str(port), "--concurrency", "3", app=APP)
            jobs = {"tether-worker": [f"127.0.0.1:{port}"],
                    "tether-serve": [server.base_url.removeprefix("http://")]}
            with Prometheus(jobs, interval=1) as prom, server.client() as c:
                wait_until(lambda: set(prom.targets().values()) == {"up"}, 30,
                           "Prometheus scraping both targets")
                t0 = time.monotonic()
                while (t := time.monotonic() - t0) < SECONDS:
                    for i in range(per_second(t)):
                        c.post("/runs", json={"agent": "research",
                                              "input": {"rounds": 2 + i % 4}}
                               ).raise_for_status()
                    time.sleep(max(0.0, 1 - (time.monotonic() - t0 - t)))
                time.sleep(10)  # the last runs finish, the graphs come down
                shoot(graph_url(prom.url, 3), out)
        finally:
            procs.close()
    print(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out)
    return 0


def shoot(url: str, out: Path) -> None:
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            for i in range(len(QUERIES)):  # its lines drawn, or "No datapoints found."
                page.locator(f"#graph_wrapper{i}").locator("svg, .error:visible").first.wait_for(
                    timeout=30_000)
            page.wait_for_timeout(500)  # the legend is drawn after the lines
            # The whole page in the viewport (its fixed menu bar stays on top), nothing focused.
            height = page.evaluate("document.documentElement.scrollHeight")
            page.set_viewport_size({"width": 1280, "height": int(height)})
            page.evaluate("document.activeElement && document.activeElement.blur()")
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(out))
        finally:
            browser.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
