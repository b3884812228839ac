"""A Prometheus of the tests' own (Debian's `prometheus` package, 2.42): its configuration and
its storage in a temporary directory, a free loopback port, scraping the targets it is given
every `interval` seconds. The machine's prometheus service is never started nor touched.

    with Prometheus({"tether-worker": ["127.0.0.1:9464"]}, interval=1) as prom:
        prom.query("rate(tether_steps_total[30s])")     # the result's list of series
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from .ports import free_port


def binary() -> str | None:
    return shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)


def available() -> str | None:
    """None if a Prometheus can be run here, else why not."""
    if binary() is None:
        return "no prometheus on PATH (apt-get install -y --no-install-recommends prometheus)"
    return None


def config(jobs: Mapping[str, Sequence[str]], interval: float) -> str:
    """prometheus.yml: one scrape job per name, its targets host:port, /metrics on each."""
    lines = ["global:", f"  scrape_interval: {interval:g}s", f"  scrape_timeout: {interval:g}s",
             f"  evaluation_interval: {interval:g}s", "scrape_configs:"]
    for job, targets in jobs.items():
        listed = ", ".join(f'"{t}"' for t in targets)
        lines += [f"  - job_name: {job}", "    metrics_path: /metrics",
                  f"    static_configs: [{{targets: [{listed}]}}]"]
    return "\n".join(lines) + "\n"


class Prometheus:
    def __init__(self, jobs: Mapping[str, Sequence[str]], *, interval: float = 1.0) -> None:
        self.jobs = jobs
        self.interval = interval
        self.root = Path(tempfile.mkdtemp(prefix="tether-prometheus-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.root / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        exe = binary()
        if exe is None:
            raise RuntimeError(available())
        conf = self.root / "prometheus.yml"
        conf.write_text(config(self.jobs, self.interval))
        with open(self.log, "wb") as out:
            self._proc = subprocess.Popen(
                [exe, f"--config.file={conf}", f"--storage.tsdb.path={self.root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.root)
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log = self.log_text()
                self.close()
                raise RuntimeError(f"prometheus did not start: {log}")
            time.sleep(0.05)

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        """GET /api/v1/query?query=expr (an instant query, now): the result's series, each
        {"metric": {labels}, "value": [ts, "number"]}."""
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"query {expr!r}: {r.status_code} {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def values(self, expr: str, *by: str) -> dict[tuple[str, ...], float]:
        """The query's series as {(label values of `by`): value}."""
        return {tuple(s["metric"].get(k, "") for k in by): float(s["value"][1])
                for s in self.query(expr)}

    def targets(self) -> dict[str, str]:
        """Each active target's scrape URL and its health (up, down, unknown)."""
        r = httpx.get(self.url + "/api/v1/targets", timeout=10)
        r.raise_for_status()
        return {t["scrapeUrl"]: t["health"] for t in r.json()["data"]["activeTargets"]}

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
