"""Async versus threads for I/O-bound LLM calls, measured in a fresh process per variant.

    python -m tether.demo.concurrency asyncio 10000
    python -m tether.demo.concurrency threads 10000

Each of N concurrent "LLM calls" waits uniform(50, 150) ms (seeded). Prints one JSON line:
wall seconds (start of the first to end of the last, thread creation included), the ideal
(the longest single call), baseline and peak RSS (VmRSS before, VmHWM after, from
/proc/self/status), the most calls alive at once, the extra resident memory per live call,
and peak virtual memory (threads reserve their stacks there). (Holding all 10,000 threads
blocked and releasing them at once takes ~40 s here: the GIL convoy.)
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import threading
import time


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def run(kind: str, n: int) -> dict[str, float | int | str]:
    rng = random.Random(42)
    delays = [rng.uniform(0.05, 0.15) for _ in range(n)]
    baseline = _status_kib("VmRSS")
    alive = n
    t0 = time.perf_counter()
    if kind == "asyncio":
        async def call(d: float) -> None:
            await asyncio.sleep(d)  # the awaited HTTP request of a real client

        async def main() -> None:
            await asyncio.gather(*(call(d) for d in delays))

        asyncio.run(main())
    elif kind == "threads":
        alive = 0
        # One thread per call, each blocking in its (simulated) HTTP request. Starting 10,000
        # threads takes seconds, so early ones finish before late ones start: the number
        # alive at once is sampled, and memory is reported per live thread.
        threads = [threading.Thread(target=time.sleep, args=(d,)) for d in delays]
        for i, t in enumerate(threads):
            t.start()
            if i % 100 == 0:
                alive = max(alive, threading.active_count() - 1)
        for t in threads:
            t.join()
    else:
        raise SystemExit(f"unknown variant {kind!r}: use asyncio or threads")
    wall = time.perf_counter() - t0
    peak = _status_kib("VmHWM")
    return {"variant": kind, "n": n, "wall_s": round(wall, 3), "ideal_s": round(max(delays), 3),
            "virtual_peak_mib": round(_status_kib("VmPeak") / 1024, 1),
            "baseline_rss_mib": round(baseline / 1024, 1), "peak_rss_mib": round(peak / 1024, 1),
            "max_alive": alive,
            "kib_per_call": round(max(0, peak - baseline) / max(1, alive), 2)}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], int(sys.argv[2]))))
