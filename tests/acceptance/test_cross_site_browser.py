"""Another site's page, in Debian's headless Chromium, against a real `tether serve` without a
token (the loopback default) and a real worker, on every store: it tries each action the API
and the dashboard offer, by plain form posts and no-cors fetches, with no user action, and
every one is refused (403 or 415) with nothing changed; a page reached under a foreign name
(DNS rebinding: the browser maps evil.example to 127.0.0.1) is refused with 421."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Response, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

import test_dashboard as dash
from browser import ARGS, CHROMIUM
from http_harness import Server, wait_until
from test_dashboard import start, wait_status

browser, context, procs, server = dash.browser, dash.context, dash.procs, dash.server

ATTACK = """<!doctype html><html><body><script>
const base = %(base)s, tid = %(tid)s;
const actions = [
  ["/runs/" + tid + "/cancel", {}], ["/runs/" + tid + "/resume", {value: "yes"}],
  ["/runs/" + tid + "/retry", {}], ["/runs/" + tid + "/fork", {step: 0}],
  ["/deployments/v1/drain", {}], ["/deployments/v1/retire", {}],
  ["/ui/runs/" + tid + "/cancel", {}], ["/ui/runs/" + tid + "/retry", {}],
  ["/ui/interrupts/resume", {thread_id: tid, value: '"yes"'}],
  ["/ui/deployments/drain", {version: "v1"}], ["/ui/deployments/route", {v1: "0"}],
];
window.sent = 0;
for (const [path, fields] of actions) {
  // A no-cors fetch: the browser sends it and hides the answer (text/plain, a simple request).
  fetch(base + path, {method: "POST", mode: "no-cors", body: JSON.stringify(fields),
                      headers: {"Content-Type": "text/plain"}})
    .finally(() => { window.sent += 1; });
}
// A plain HTML form per action, each posted into its own frame (a second post into one frame
// would cancel the first's navigation before its answer is seen).
let i = 0;
function next() {
  if (i === actions.length) { window.formsDone = true; return; }
  const [path, fields] = actions[i++];
  const sink = document.createElement("iframe");
  sink.name = "sink" + i; document.body.appendChild(sink);
  const form = document.createElement("form");
  form.method = "POST"; form.action = base + path; form.target = sink.name;
  for (const [k, v] of Object.entries(fields)) {
    const input = document.createElement("input");
    input.name = k; input.value = String(v); form.appendChild(input);
  }
  document.body.appendChild(form);
  form.submit();
  setTimeout(next, 150);
}
next();
</script></body></html>"""


class _Page(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def attacker() -> Iterator[ThreadingHTTPServer]:
    site = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        site.shutdown()
        site.server_close()
        thread.join(5)


def test_another_sites_page_changes_nothing(server: Server, browser: Browser,
                                            attacker: ThreadingHTTPServer) -> None:
    with server.client() as c:
        tid = start(c, "approval", {"item": "parked"})
        wait_status(c, tid, "waiting")
        deployments = c.get("/deployments").json()
        audit = c.get("/audit").json()

        _Page.body = (ATTACK % {"base": json.dumps(server.base_url),
                                "tid": json.dumps(tid)}).encode()
        page = browser.new_page()
        answers: list[tuple[str, int]] = []

        def seen(response: Response) -> None:
            if response.url.startswith(server.base_url):
                answers.append((response.request.method, response.status))

        page.on("response", seen)
        try:
            page.goto(f"http://127.0.0.1:{attacker.server_address[1]}/")
            page.wait_for_function("window.sent === 11 && window.formsDone === true",
                                   timeout=30_000)
            wait_until(lambda: len(answers) >= 22, 15, "every attempt answered")
        finally:
            page.close()

        # Every attempt reached the server and was refused there.
        assert len(answers) == 22, answers
        assert {status for _, status in answers} <= {403, 415}, answers
        assert wait_status(c, tid, "waiting")["status"] == "waiting"
        assert c.get("/deployments").json() == deployments
        assert c.get("/audit").json() == audit


def test_a_page_under_a_foreign_name_is_refused(server: Server) -> None:
    port = server.base_url.rsplit(":", 1)[1]
    rules = "--host-resolver-rules=MAP evil.example 127.0.0.1"
    with sync_playwright() as p:
        rebinding = p.chromium.launch(executable_path=CHROMIUM, args=[*ARGS, rules])
        try:
            page = rebinding.new_page()
            for path in ("/ui", "/ui/runs", "/runs", "/interrupts"):
                answer = page.goto(f"http://evil.example:{port}{path}")
                assert answer is not None and answer.status == 421, (path, answer)
            assert "does not answer to the host" in page.content()
            # The same server under its own name answers.
            ok = page.goto(f"{server.base_url}/runs")
            assert ok is not None and ok.status == 200
        finally:
            rebinding.close()
