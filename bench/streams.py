"""What open event streams cost `tether serve`: RSS and CPU with 200 streams, and after they
close (issue 28, item 10).

    python -m bench.streams                          # both stores, API and dashboard streams
    python -m bench.streams --backend sqlite --kind events --runs 1 --hold 5
    python -m bench.streams --src /tmp/old/src       # serve another checkout's code

Starts a real `tether serve` (a subprocess, no worker: the runs stay queued, so every stream
stays open), starts `--runs` runs, and measures the server process (/proc/<pid>): its RSS at
rest after a warm-up stream (the baseline), with `--streams` streams open (spread over the
runs: GET /runs/{thread_id}/events, or the dashboard's /ui/live on each run's page) and held
`--hold` seconds, then `--settle` seconds after every stream closed, twice (a second round
of as many streams shows whether what the first left is reused or grows); and the CPU seconds
the server spent while holding them (its polling). RSS is given in MiB and as a ratio to the
baseline of the same run. The per-client cap is raised (TETHER_MAX_STREAMS_PER_CLIENT) so that
one client may open them all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import tether
from tether.bench.common import bench_db

parked = tether.Agent("parked")


@parked.node(start=True)
async def only(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    return tether.finish(state)


runtime = tether.Runtime(agents=[parked])
"""The app `tether serve --app bench.streams:runtime` serves: one agent whose runs stay
queued (no worker runs them)."""

HEADERS = {"X-Tether-Client": "bench"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_up(c: httpx.AsyncClient, proc: Any, out: Any) -> None:
    """Until the `tether serve` subprocess `proc` (its output in file `out`) answers /healthz."""
    for _ in range(300):
        try:
            if (await c.get("/healthz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.returncode is not None:
            out.seek(0)
            raise RuntimeError(f"tether serve exited: {out.read()!r}")
        await asyncio.sleep(0.1)
    raise RuntimeError("tether serve did not answer within 30 s")


async def stop(proc: Any) -> None:
    """Stop the `tether serve` subprocess `proc`: SIGTERM, then SIGKILL after 15 s."""
    proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), 15)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def migrate(url: str) -> None:
    rt = tether.Runtime(url)
    await rt.migrate()
    await rt.close()


async def open_streams(base: str, tids: list[str], n: int, kind: str = "events") -> tuple[
        httpx.AsyncClient, list[Any]]:
    """`n` open streams over `tids` (round robin), each past its first event (or, for the
    dashboard's, its first line)."""
    client = httpx.AsyncClient(base_url=base, headers=HEADERS, timeout=60,
                               limits=httpx.Limits(max_connections=n + 10))
    if kind == "live":
        (await client.get("/ui")).raise_for_status()  # a session cookie
    streams: list[Any] = []

    async def one(tid: str) -> None:
        if kind == "live":
            cm = client.stream("GET", "/ui/live", params={"topic": f"run:{tid}"})
        else:
            cm = client.stream("GET", f"/runs/{tid}/events")
        resp = await cm.__aenter__()
        if resp.status_code != 200:
            raise RuntimeError(f"stream refused: {resp.status_code} {await resp.aread()!r}")
        lines = resp.aiter_lines()
        async for line in lines:
            if line.startswith("data: ") or kind == "live":
                break
        streams.append((cm, lines))

    await asyncio.gather(*(one(tids[i % len(tids)]) for i in range(n)))
    return client, streams


async def close_streams(client: httpx.AsyncClient, streams: list[Any]) -> None:
    for cm, lines in streams:
        await lines.aclose()
        await cm.__aexit__(None, None, None)
    await client.aclose()


async def measure(backend: str, kind: str, n: int, runs: int, hold: float, settle: float,
                  src: Path) -> dict[str, Any]:
    async with bench_db(backend) as url:
        await migrate(url)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        root = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(src), str(root), os.environ.get("PYTHONPATH", "")) if p),
            "TETHER_MAX_STREAMS_PER_CLIENT": str(n + 1)}
        env.pop("TETHER_TOKEN", None)
        with tempfile.TemporaryFile() as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tether", "serve", "--app", "bench.streams:runtime",
                "--db", url, "--port", str(port),
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                async with httpx.AsyncClient(base_url=base, headers=HEADERS) as c:
                    await wait_up(c, proc, out)
                    tids = []
                    for i in range(runs):
                        r = await c.post("/runs", json={"agent": "parked", "input": {"i": i}})
                        r.raise_for_status()
                        tids.append(r.json()["thread_id"])
                # Warm-up: one stream opened and closed, so the baseline has the code loaded.
                client, streams = await open_streams(base, tids, 1, kind)
                await close_streams(client, streams)
                await asyncio.sleep(1.0)
                before = rss_mib(proc.pid)
                rounds = []
                for _ in range(2):
                    began = time.monotonic()
                    client, streams = await open_streams(base, tids, n, kind)
                    opened = time.monotonic() - began
                    cpu0 = cpu_seconds(proc.pid)
                    await asyncio.sleep(hold)
                    cpu = cpu_seconds(proc.pid) - cpu0
                    during = rss_mib(proc.pid)
                    await close_streams(client, streams)
                    await asyncio.sleep(settle)
                    rounds.append((during, rss_mib(proc.pid), cpu, opened))
            finally:
                await stop(proc)
    (during, after, cpu, opened), (during2, after2, _, _) = rounds
    return {"backend": backend, "kind": kind, "streams": n, "runs": runs, "before": before,
            "during": during, "after": after, "during2": during2, "after2": after2,
            "cpu": cpu, "hold": hold, "opened": opened}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| store | streams | on runs | RSS before | with streams | after closing | "
             "again, with | again, after | server CPU while held | opened in |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        b = r["before"]

        def mib(key: str) -> str:
            return f"{r[key]:.1f} MiB ({r[key] / b:.2f}x)"  # noqa: B023

        what = "API events" if r["kind"] == "events" else "dashboard live"
        lines.append(
            f"| {r['backend']} | {r['streams']} {what} | {r['runs']} | {b:.1f} MiB (1.00x) | "
            f"{mib('during')} | {mib('after')} | {mib('during2')} | {mib('after2')} | "
            f"{r['cpu']:.2f} s in {r['hold']:.0f} s | {r['opened']:.2f} s |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="both", choices=("sqlite", "postgres", "both"))
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--runs", type=str, default="1,200",
                    help="comma-separated: the runs the streams are spread over, one row each")
    ap.add_argument("--kind", default="events,live",
                    help="comma-separated: events (the API's), live (the dashboard's)")
    ap.add_argument("--hold", type=float, default=5.0)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src",
                    help="the tether source the server runs (default: this checkout's)")
    args = ap.parse_args()
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    rows = []
    for backend in backends:
        for kind in args.kind.split(","):
            for runs in (int(x) for x in args.runs.split(",")):
                rows.append(asyncio.run(measure(backend, kind, args.streams, runs, args.hold,
                                                args.settle, args.src.resolve())))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
