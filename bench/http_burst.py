"""W2 started in a burst over HTTP: another process POSTs N W2 runs (5 steps, each a journaled
simulated LLM call of 50-150 ms) to a real `tether serve --worker`, one POST /runs per run or
POST /runs:batch of `--batch` runs, `--inflight` requests in flight; the server's own worker
runs them. The third way of starting W2 (issue 35 goal 2), beside the in-process handover and
queued paths, which run in the same invocation as its reference (`--no-reference`: skip).

The load comes from `wrk` (Debian's package: `apt-get install wrk`), a C client that sends
each request for a few microseconds of CPU, so that the figure is the server's: Python's
httpx took about 5 ms of CPU a request, more than the server itself, and capped the old
version of this bench at 150-250 requests/s (`--client httpx` keeps it, for comparison).

Prints, per store: seconds to have every run accepted, requests/s, wall until every run
completed, wall over W2's ideal (the longest run's sleeps), wall over the bare asyncio loop
(the same sleeps, no persistence, measured here), the server's and the client's CPU.

    python -m bench.http_burst [--backend sqlite|postgres|both] [--runs 10000] [--batch 0]
    python -m bench.http_burst --src /path/to/other/checkout/src     # before/after
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.table import Table

import tether
from bench.pairs import metrics_of
from bench.streams import HEADERS, cpu_seconds, free_port, migrate, stop, wait_up
from tether.bench.checkpoint import W2_STEPS, w2_agent, w2_bare, w2_delays
from tether.bench.common import bench_db

runtime = tether.Runtime(agents=[w2_agent], version="bench")
"""The app `tether serve --app bench.http_burst:runtime --worker` serves: W2's agent."""

_WRK_SCRIPT = r"""
-- Sends the request bodies of $BURST_BODIES (one per line) once each as POST $BURST_PATH,
-- then GET /healthz every 250 ms while the last answers come in; exits at the last POST's
-- answer.
local bodies = {}
for line in io.lines(os.getenv("BURST_BODIES")) do bodies[#bodies + 1] = line end
local path, n, sent, answered, failed = os.getenv("BURST_PATH"), #bodies, 0, 0, 0
local headers = {["Content-Type"] = "application/json", ["X-Tether-Client"] = "bench"}
local primed = false
request = function()
  -- wrk builds a thread's first request once before it connects, and may throw it away:
  -- that one is a GET, so no body is lost.
  if not primed then primed = true; return wrk.format("GET", "/healthz") end
  sent = sent + 1
  if sent <= n then return wrk.format("POST", path, headers, bodies[sent]) end
  return wrk.format("GET", "/healthz")
end
delay = function()  -- a connection with no body left to send waits, not hammers /healthz
  if sent >= n then return 250 end
  return 0
end
response = function(status, hdrs, body)
  if status == 200 then return end  -- /healthz (every POST here creates: 201)
  answered = answered + 1
  if status ~= 201 then
    failed = failed + 1
    if failed <= 3 then io.stderr:write(status .. " " .. body:sub(1, 300) .. "\n") end
  end
  if answered >= n then
    io.stderr:write("burst: " .. answered .. " answered, " .. failed .. " failed\n")
    io.stderr:flush()
    os.exit(0)  -- wrk.thread:stop() would leave wrk asleep until -d ends
  end
end
"""


def _bodies(runs: int, batch: int) -> list[bytes]:
    """One request body per POST: W2's input for run i (thread_id w2-i, as in-process W2)."""
    def item(i: int) -> dict[str, Any]:
        return {"agent": w2_agent.name, "thread_id": f"w2-{i:05d}",
                "input": {"delays": w2_delays(i), "replies": []}}

    if not batch:
        return [orjson.dumps(item(i)) for i in range(runs)]
    return [orjson.dumps({"runs": [item(j) for j in range(i, min(runs, i + batch))]})
            for i in range(0, runs, batch)]


def _wrk(base: str, bodies: list[bytes], inflight: int, batch: int) -> tuple[float, float]:
    """Send every body with wrk: (seconds until the last answer, wrk's CPU seconds)."""
    if shutil.which("wrk") is None:
        raise SystemExit("bench.http_burst needs wrk (a C HTTP load generator): "
                         "apt-get install -y wrk   (or --client httpx, which is slower "
                         "than the server it measures)")
    with tempfile.TemporaryDirectory() as tmp:
        script, data = Path(tmp, "burst.lua"), Path(tmp, "bodies.jsonl")
        script.write_text(_WRK_SCRIPT)
        data.write_bytes(b"\n".join(bodies) + b"\n")
        env = {**os.environ, "BURST_BODIES": str(data),
               "BURST_PATH": "/runs:batch" if batch else "/runs"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run(
            ["wrk", "-t1", f"-c{min(inflight, len(bodies))}", "-d600s", "--timeout", "120s",
             "-s", str(script), base], env=env, capture_output=True, text=True)
        took = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = [line for line in done.stderr.splitlines() if line.startswith("burst:")]
    if done.returncode != 0 or not summary or not summary[-1].endswith(" 0 failed"):
        raise RuntimeError(f"wrk: exit {done.returncode}\n{done.stderr[-2000:]}"
                           f"\n{done.stdout[-2000:]}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


async def _httpx(base: str, bodies: list[bytes], inflight: int, batch: int
                 ) -> tuple[float, float]:
    """Send every body with httpx from this process: (seconds, this process's CPU seconds)."""
    limits = httpx.Limits(max_connections=inflight, max_keepalive_connections=inflight)
    path = "/runs:batch" if batch else "/runs"
    headers = {**HEADERS, "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits,
                                 timeout=120) as c:
        sem = asyncio.Semaphore(inflight)

        async def one(body: bytes) -> None:
            async with sem:
                r = await c.post(path, content=body)
                if r.status_code != 201:
                    raise RuntimeError(f"{r.status_code}: {r.text[:200]}")

        began, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - began, time.process_time() - cpu0


async def measure(backend: str, runs: int, inflight: int, batch: int, client: str,
                  src: Path | None, serve_args: list[str]) -> dict[str, float]:
    bodies = _bodies(runs, batch)
    ideal = max(sum(w2_delays(i)) for i in range(runs))
    async with bench_db(backend) as url:
        await migrate(url)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        root = Path(__file__).resolve().parents[1]
        paths = [str(src)] if src else []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [*paths, str(root), os.environ.get("PYTHONPATH", "")])}
        env.pop("TETHER_TOKEN", None)
        with tempfile.TemporaryFile() as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tether", "serve", "--app", "bench.http_burst:runtime",
                "--db", url, "--port", str(port), "--worker", "--concurrency", str(runs),
                *serve_args,
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            watcher = tether.Runtime(url)
            try:
                async with httpx.AsyncClient(base_url=base, headers=HEADERS) as c:
                    await wait_up(c, proc, out)
                cpu0 = cpu_seconds(proc.pid)
                began = time.perf_counter()
                try:
                    if client == "wrk":
                        posted, client_cpu = await asyncio.to_thread(
                            _wrk, base, bodies, inflight, batch)
                    else:
                        posted, client_cpu = await _httpx(base, bodies, inflight, batch)
                except Exception:
                    out.seek(0)
                    sys.stderr.write(out.read().decode(errors="replace")[-3000:])
                    raise
                while True:
                    counts = await watcher.status_counts()
                    done = sum(n for (status, _), n in counts.runs.items()
                               if status == "completed")
                    if done >= runs:
                        break
                    await asyncio.sleep(0.02)
                wall = time.perf_counter() - began
                cpu = cpu_seconds(proc.pid) - cpu0
            finally:
                await watcher.close()
                await stop(proc)
    bare, _ = await w2_bare(runs)
    return {"posted_s": posted, "requests_per_s": len(bodies) / posted,
            "runs_per_s": runs / posted, "wall_s": wall, "wall_over_ideal": wall / ideal,
            "wall_vs_bare": wall / bare,
            "server_cpu_us_per_step": cpu / (runs * W2_STEPS) * 1e6,
            "client_cpu_s": client_cpu}


def reference(backend: str, runs: int, path: str, src: Path | None) -> dict[str, float]:
    """In-process W2 on the same store and runs (`python -m bench.workloads`, its own process,
    the same checkout as the server)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [*([str(src)] if src else []), str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "bench.workloads", "W2", backend, str(runs),
                          path], cwd=root, env=env, capture_output=True, text=True, check=True)
    return metrics_of(out.stdout, unsized=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="both", choices=("sqlite", "postgres", "both"))
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--inflight", type=int, default=50, help="requests in flight at once")
    ap.add_argument("--batch", type=int, default=0,
                    help="runs per POST /runs:batch (0: one POST /runs per run)")
    ap.add_argument("--client", default="wrk", choices=("wrk", "httpx"))
    ap.add_argument("--no-reference", action="store_true",
                    help="skip in-process W2 (handover and queued) on the same runs")
    ap.add_argument("--src", type=Path, help="serve this checkout's src/ instead")
    ap.add_argument("--serve-args", default="", help="more flags for tether serve")
    args = ap.parse_args()
    if args.runs < 1 or args.inflight < 1 or not 0 <= args.batch <= 10_000:
        ap.error("--runs and --inflight must be >= 1, --batch 0 to 10000")
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    how = f"POST /runs:batch of {args.batch}" if args.batch else "one POST /runs each"
    table = Table(title=f"W2, {args.runs:,} runs over HTTP ({how}, {args.inflight} in flight, "
                        f"{args.client}); in-process W2 beside it")
    cols = ("posted_s", "requests_per_s", "wall_s", "wall_over_ideal", "wall_vs_bare",
            "server_cpu_us_per_step", "client_cpu_s")
    table.add_column("store")
    table.add_column("start path")
    for col in cols:
        table.add_column(col.replace("_", " "), justify="right")
    console = Console(width=max(Console().width, 150))
    for backend in backends:
        with console.status(f"{backend}: {args.runs:,} runs over HTTP"):
            r = asyncio.run(measure(backend, args.runs, args.inflight, args.batch, args.client,
                                    args.src, args.serve_args.split()))
        table.add_row(backend, "HTTP burst", *(f"{r[c]:,.2f}" for c in cols))
        if args.no_reference:
            continue
        for path in ("handover", "queued"):
            with console.status(f"{backend}: in-process W2, {path}"):
                ref = reference(backend, args.runs, path, args.src)
            table.add_row(backend, f"in process, {path}", f"{ref['start_s']:,.2f}", "",
                          f"{ref['wall_s']:,.2f}", f"{ref['wall_over_ideal']:,.2f}",
                          f"{ref['wall_vs_bare']:,.2f}",
                          f"{ref['cpu_us_per_step']:,.2f}", "")
    console.print(table)


if __name__ == "__main__":
    main()
