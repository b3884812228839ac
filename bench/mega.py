"""M: the megaagent example (examples/megaagent/run.py) at 100, 1,000 and 10,000 agents.

The example is not part of the installed package, so M lives here in the checkout, beside
it: `python -m bench.workloads M sqlite 1000 300` runs it, `python -m bench.run` plans it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from tether.bench.common import Result, bench_db, pg_bytes, run_counts, suffix
from tether.bench.workloads import number_arg

RUN_PY = Path(__file__).resolve().parents[1] / "examples" / "megaagent" / "run.py"
USAGE = "usage: python -m bench.workloads M sqlite|postgres [agents] [timeout_s]"


def m_call(backend: str, args: list[str]) -> Coroutine[Any, Any, list[Result]]:
    """M with its command-line arguments: agents (default 1,000), timeout in seconds (300)."""
    agents = int(number_arg(args, 0, 1000, int, USAGE))
    return mega(backend, agents, number_arg(args, 1, 300.0, float, USAGE))


async def mega(backend: str, agents: int, timeout: float) -> list[Result]:
    """examples/megaagent/run.py's main (one in-process worker, verifies every result was
    counted once) on a fresh database; gives up after `timeout` seconds."""
    path = RUN_PY
    spec = importlib.util.spec_from_file_location("megaagent_run", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    async with bench_db(backend) as url:
        argv = ["--agents", str(agents), "--db", url, "--timeout", str(timeout)]
        try:
            # run.py prints progress (and a dict) on stdout: keep stdout for JSON lines.
            with contextlib.redirect_stdout(sys.stderr):
                async with asyncio.timeout(timeout):
                    fig = await module.main(argv)
        except TimeoutError:
            raise RuntimeError(f"M: {agents:,} agents did not finish within {timeout:g} s "
                               f"(runs by status: {await run_counts(url)})") from None
        tables = await pg_bytes(url) if backend == "postgres" else None
    s = suffix(agents)
    n = fig["agents"]
    out = [
        Result(backend, "M", f"agents_{s}", n, "count"),
        Result(backend, "M", f"wall_s_{s}", fig["wall_s"], "s"),
        Result(backend, "M", f"messages_{s}", fig["messages"], "count"),
        Result(backend, "M", f"messages_per_s_{s}", fig["messages_per_s"], "1/s"),
        Result(backend, "M", f"peak_rss_mib_{s}", fig["peak_rss_mib"], "MiB"),
        Result(backend, "M", f"db_bytes_{s}", fig["db_bytes"], "bytes"),
    ]
    if tables is not None:
        out.append(Result(backend, "M", f"table_bytes_{s}", tables, "bytes"))
    out.append(Result(backend, "M", f"cost_per_agent_ms_{s}", round(fig["wall_s"] / n * 1e3, 3),
                      "ms"))
    return out
