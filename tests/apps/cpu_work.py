"""Functions that ctx.cpu_call runs in a worker's process pool: importable by module name
(the pool's processes unpickle them by reference)."""

from __future__ import annotations

import os
import time


def burn(seconds: float) -> dict[str, int]:
    """Pure-Python CPU work for `seconds`; returns the pid that did it and a count."""
    deadline = time.process_time() + seconds
    n = 0
    while time.process_time() < deadline:
        n += 1
    return {"pid": os.getpid(), "loops": n}
