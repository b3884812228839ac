"""The API's audited writes under load: what a burst of `POST /runs`, of `POST
/runs/{id}/messages` and of interrupt answers costs the server. Every write made over HTTP is
audited (its actor: the token's name, else "anonymous"), and an audited write used to take a
slower path than the same write made in process: a transaction of its own on Postgres for a
message or an answer, a statement each for a start.

For each store, `wrk` (Debian's package: `apt-get install wrk`) sends, for `--seconds`, with
50 requests in flight, to a real `tether serve` (no worker, so the figure is the request's
alone):
- start: `POST /runs` of W2's agent, a new run each;
- message: `POST /runs/{id}/messages` to 1,000 queued runs in turn.
and, in process (the call the resume route makes), `--answers` runs waiting for input are
answered at once with `runtime.resume(..., actor=...)` (answer: seconds for them all).
Prints requests/s and the server's CPU per request (its process, from /proc), per checkout:
`--before <checkout>` alternates that checkout's src/ with this one's, `--rounds` times.

    python -m bench.http_writes [--backend sqlite|postgres|both] [--seconds 6] [--rounds 2]
                                [--before /path/to/other/checkout] [--answers 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.streams import HEADERS, cpu_seconds, free_port, migrate, stop, wait_up
from tether.bench.common import bench_db

ROOT = Path(__file__).resolve().parents[1]
TARGETS = 1000  # runs the messages go to, in turn

_LUA = {
    "start": r"""
wrk.method = "POST"
wrk.path = "/runs"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"agent": "bench_w2", "input": {"delays": [0.1, 0.1, 0.1, 0.1, 0.1], "replies": []}}'
""",
    "message": r"""
local n = 0
request = function()
  n = n + 1
  return wrk.format("POST", string.format("/runs/t%04d/messages", n % 1000),
                    {["Content-Type"] = "application/json"},
                    '{"message": {"ping": 1}, "sender": "bench"}')
end
""",
}


def _env(src: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(src), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("TETHER_TOKEN", None)
    return env


def _wrk(base: str, kind: str, seconds: float) -> tuple[int, int]:
    """(requests answered, of which not 2xx) in `seconds` of wrk."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "w.lua")
        script.write_text(_LUA[kind])
        done = subprocess.run(["wrk", "-t1", "-c50", f"-d{seconds:g}s", "-s", str(script), base],
                              capture_output=True, text=True, check=True)
    requests = bad = 0
    for line in done.stdout.splitlines():
        if " requests in " in line:
            requests = int(line.split()[0])
        if "Non-2xx" in line:
            bad = int(line.split()[-1])
    return requests, bad


async def served(backend: str, kind: str, src: Path, seconds: float) -> dict[str, float]:
    """One store, one kind of write, one checkout: requests/s and server CPU us a request."""
    async with bench_db(backend) as url:
        await migrate(url)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryFile() as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tether", "serve", "--app", "bench.http_burst:runtime",
                "--db", url, "--port", str(port), env=_env(src), stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                async with httpx.AsyncClient(base_url=base, headers=HEADERS, timeout=60) as c:
                    await wait_up(c, proc, out)
                    if kind == "message":
                        r = await c.post("/runs:batch", json={"runs": [
                            {"agent": "bench_w2", "thread_id": f"t{i:04d}",
                             "input": {"delays": [0.1] * 5, "replies": []}}
                            for i in range(TARGETS)]})
                        r.raise_for_status()
                await asyncio.to_thread(_wrk, base, kind, 2)  # warm-up
                cpu0 = cpu_seconds(proc.pid)
                requests, bad = await asyncio.to_thread(_wrk, base, kind, seconds)
                cpu = cpu_seconds(proc.pid) - cpu0
            finally:
                await stop(proc)
    if bad or not requests:
        raise RuntimeError(f"{kind} on {backend}: {bad} of {requests} requests failed")
    return {"per_s": requests / seconds, "cpu_us": cpu / requests * 1e6}


_ANSWERS = r"""
import asyncio, sys, time
import tether
agent = tether.Agent("bench_asks")

@agent.node(start=True)
async def ask(state, ctx):
    ctx.interrupt({"q": "go on?"})
    return tether.finish({})

async def main(url, n):
    rt = tether.Runtime(url, agents=[agent], version="bench")
    await rt.migrate()
    async with rt:
        await rt.start_many([{"agent": agent.name, "thread_id": f"q{i:05d}"} for i in range(n)])
        stop = asyncio.Event()
        worker = asyncio.create_task(rt.work(concurrency=n, stop=stop))
        while len(await rt.interrupts(limit=n)) < n:
            await asyncio.sleep(0.05)
        stop.set()
        await worker
        began = time.perf_counter()
        await asyncio.gather(*(rt.resume(f"q{i:05d}", 1, actor="bench") for i in range(n)))
        print(time.perf_counter() - began)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def answers(backend: str, n: int, src: Path) -> float:
    """Seconds for `n` audited answers made at once, in a process of `src`'s checkout."""
    async with bench_db(backend) as url:
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", _ANSWERS, url, str(n)], env=_env(src),
            capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="both", choices=("sqlite", "postgres", "both"))
    ap.add_argument("--seconds", type=float, default=6.0, help="of load per measurement")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--answers", type=int, default=2000, help="runs answered at once")
    ap.add_argument("--before", type=Path, help="a checkout to alternate with this one")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("bench.http_writes needs wrk (a C HTTP load generator): "
                         "apt-get install -y wrk")
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    checkouts = [("before", args.before / "src")] if args.before else []
    checkouts.append(("this", ROOT / "src"))
    console = Console(width=150)
    rows: list[tuple[str, ...]] = []
    for rnd in range(args.rounds):
        for backend in backends:
            for name, src in checkouts:
                got: dict[str, Any] = {}
                for kind in ("start", "message"):
                    got[kind] = asyncio.run(served(backend, kind, src, args.seconds))
                took = asyncio.run(answers(backend, args.answers, src))
                rows.append((str(rnd + 1), backend, name,
                             f"{got['start']['per_s']:,.0f}", f"{got['start']['cpu_us']:.0f}",
                             f"{got['message']['per_s']:,.0f}",
                             f"{got['message']['cpu_us']:.0f}", f"{took:.3f}"))
                console.print(f"  round {rnd + 1}, {backend}, {name}: done", style="dim")
    table = Table(title=f"Audited API writes ({args.seconds:g} s of wrk each, 50 in flight; "
                        f"{args.answers:,} answers at once)")
    for col in ("round", "store", "checkout", "POST /runs per s", "server CPU us a start",
                "POST .../messages per s", "server CPU us a message",
                f"{args.answers:,} answers, s"):
        table.add_column(col, justify="left" if col in ("store", "checkout") else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


if __name__ == "__main__":
    main()
