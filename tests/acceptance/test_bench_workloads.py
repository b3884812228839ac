"""Acceptance: the W3 (crash and resume) and W4 (queue) benchmarks at a tiny size, on every
store, with real `tether worker` subprocesses (one SIGKILLed), as `tether bench` runs them;
and `tether bench`'s answers to bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from apps.backends import BACKENDS
from tether.bench.crash import w3
from tether.bench.queue import w4

pytestmark = pytest.mark.slow


@pytest.fixture
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The store to measure; on Postgres, BENCH_PG_URL names the test server (skips or
    fails, as the other Postgres tests do, when it is not there)."""
    name: str = request.param
    if name == "postgres":
        monkeypatch.setenv("BENCH_PG_URL", request.getfixturevalue("pg_admin").url)
    for var in ("LEASE_TTL", "POLL_INTERVAL", "CONCURRENCY"):
        monkeypatch.delenv(f"TETHER_{var}", raising=False)
    return name


def lines(results: list[Any]) -> dict[str, Any]:
    """metric -> value, through the JSON lines the workload process prints."""
    out: dict[str, Any] = {}
    for r in results:
        d = json.loads(r.to_json())
        assert d["system"] == "tether" and d["workload"] in ("W3", "W4")
        out[d["metric"]] = d["value"]
    return out


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
async def test_w3_and_w4_tiny(backend: str) -> None:
    plain = lines(await w3(backend, "plain", runs=10, steps=3, lease_ttl=1.0))
    assert plain["lost_runs"] == 0 and plain["double_committed_steps"] == 0
    assert plain["steps_at_kill"] >= 15 and plain["recovery_s"] > 0
    # A plain side effect of a step in flight at the kill happens again: counted, not hidden.
    assert plain["duplicate_effects"] == plain["repeated_steps"]

    outbox = lines(await w3(backend, "outbox", runs=10, steps=3, lease_ttl=1.0))
    assert outbox["lost_runs_outbox"] == 0 and outbox["duplicate_effects_outbox"] == 0
    assert outbox["effects_settled_s_outbox"] >= outbox["recovery_s_outbox"] > 0

    queue = lines(await w4(backend, jobs=200, workers=2))
    assert queue["jobs"] == 200 and queue["workers"] == 2
    assert queue["enqueue_per_s"] > 0 and queue["drain_jobs_per_s"] > 0
    assert queue["drain_wall_s"] >= queue["drain_s"]


def tether_bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tether", "bench", *args], capture_output=True,
                          text=True, timeout=60)


def test_bench_bad_input() -> None:
    proc = tether_bench("--workloads", "W1,W9")
    assert proc.returncode == 2
    assert "unknown workload 'W9'; choose from W1, W2, W3, W4, W5, E, M, L" in proc.stderr

    proc = tether_bench("--workloads", "W3", "--pg-url", "postgresql://postgres@127.0.0.1:1/x")
    assert proc.returncode == 2
    assert "tether: error: Postgres is not answering at postgresql://postgres@127.0.0.1:1/x" \
        in proc.stderr
    assert "--backend sqlite" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_runs_a_workload_and_prints_the_table() -> None:
    """The whole path: a workload subprocess, JSON lines on stdout, the table."""
    proc = tether_bench("--backend", "sqlite", "--workloads", "L", "--quick")
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert {r["metric"] for r in results} >= {"single_full_rows_per_s", "peak_rss_mib"}
    assert "tether benchmarks" in proc.stdout and "done sqlite L" in proc.stderr


async def test_c_cpu_offload_tiny() -> None:
    """C at a tiny size on SQLite: CPU-bound steps on the loop stall the I/O-bound runs beside
    them; offloaded to the worker's process pool (ctx.cpu_call) they do not, as much."""
    from tether.bench.cpu import cpu_offload

    got = {r.metric: r.value for r in await cpu_offload("sqlite", runs=50, cpu_runs=4,
                                                        burn_ms=100, cpu_workers=1)}
    assert got["cpu_workers"] == 1
    # Inline, 4 runs x 5 steps x 100 ms = 2 s of the loop's time against an ideal of <= 0.75 s.
    assert got["w2_wall_over_ideal_cpu_inline"] > got["w2_wall_over_ideal_cpu_offloaded"]
    assert got["w2_wall_over_ideal_cpu_inline"] > 2.5
