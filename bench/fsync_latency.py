"""The disk's fsync latency, to quote beside figures on the commit path:
`python -m bench.fsync_latency [writes]` appends 4 KiB and fsyncs it `writes` times (default
500) in a temporary file beside the benchmarks' databases, and prints the median, p90 and
p99 in milliseconds with the load average."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time


def fsync_ms(writes: int) -> list[float]:
    fd, path = tempfile.mkstemp(prefix="tether_fsync_")
    try:
        block = b"x" * 4096
        took = []
        for _ in range(writes):
            os.write(fd, block)
            t0 = time.perf_counter()
            os.fsync(fd)
            took.append((time.perf_counter() - t0) * 1e3)
        return took
    finally:
        os.close(fd)
        os.remove(path)


def main(argv: list[str]) -> None:
    took = sorted(fsync_ms(int(argv[0]) if argv else 500))
    q = statistics.quantiles(took, n=100)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"fsync of 4 KiB, {len(took)} writes: median {statistics.median(took):.3f} ms, "
          f"p90 {q[89]:.3f} ms, p99 {q[98]:.3f} ms (load average {load})")


if __name__ == "__main__":
    main(sys.argv[1:])
