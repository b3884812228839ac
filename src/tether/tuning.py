"""Interpreter settings for a process that runs a worker with thousands of steps in flight.

On by default for every way of running a worker (`tether worker`, `tether serve`'s embedded
worker, `runtime.work()` in a program), scoped to the worker's lifetime and only where a
setting is still at Python's default: a setting the program chose is never touched, and the
defaults come back when the last worker of the process stops (several runtimes' workers in one
process share one tuning). `runtime.work(tune=False)` keeps the interpreter exactly as it is.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

T = TypeVar("T")


_tuning: list[contextlib.ExitStack] = []
"""One entry per worker of this process inside worker_tuned, the first one's stack holding the
settings: the first one in tunes, the last one out restores (a worker that stops must not
untune another that still runs)."""


@contextlib.contextmanager
def worker_tuned(concurrency: int) -> Iterator[None]:
    """Both settings below while any worker of the process runs, each only if it was still at
    Python's default when the first worker started (sized for that worker's concurrency)."""
    stack = contextlib.ExitStack()
    if not _tuning:
        stack.enter_context(gc_tuned(concurrency))
        stack.enter_context(switch_interval_tuned())
        _tuning.append(stack)
    else:
        _tuning.append(_tuning[0])
    try:
        yield
    finally:
        owner = _tuning[0]
        _tuning.pop()
        if not _tuning:
            owner.close()


_GC_DEFAULT: Final = (700, 10, 10)
_GC_WORKER: Final = (100_000, 20, 20)
_GC_PER_SLOT: Final = 100


def gc_thresholds(concurrency: int) -> tuple[int, int, int]:
    """The collector's thresholds for a worker running up to `concurrency` steps at once:
    _GC_WORKER, with the young threshold raised to _GC_PER_SLOT allocations per slot."""
    young, middle, old = _GC_WORKER
    return max(young, _GC_PER_SLOT * concurrency), middle, old


def gc_tuned(concurrency: int = 1) -> contextlib.AbstractContextManager[None]:
    """Collect less often while the worker runs, if nobody tuned the collector already.

    Thousands of in-flight steps keep many young objects (tasks, futures, coroutines) alive
    for a step's duration. A young collection scans every young object still alive, so its
    cost grows with the steps in flight (30-50 tracked objects each), and with a threshold
    below that live set every collection scans about a threshold's worth: the total is then
    the same whatever the threshold. With Python's defaults the collector took about half of
    a worker's CPU at 10,000 concurrent runs (bench W2); at (100000, 20, 20) it still took
    0.25 s of 2.9 s, and (300000, 20, 20) the same. Once the threshold is above the live set
    (100 per slot: 1,000,000 at 10,000), collections become rare and cost 0.05 s there. Counts,
    not memory, trigger collections; objects freed by reference counting (nearly all of a
    step's) never wait for the collector, so only cyclic garbage waits longer, at most about
    a threshold's worth of objects."""
    return _tuned(gc.get_threshold, lambda t: gc.set_threshold(*t), _GC_DEFAULT,
                  gc_thresholds(concurrency))


_SWITCH_DEFAULT: Final = 0.005
_SWITCH_WORKER: Final = 0.0005


def switch_interval_tuned() -> contextlib.AbstractContextManager[None]:
    """Hand the GIL between threads sooner while the worker runs, if nobody changed the
    interval already.

    The SQLite store ends its group commits on a thread, which needs the GIL back after each
    statement; while the loop thread runs steps it waits up to the switch interval for it.
    With Python's default of 5 ms that was about 20 ms per group commit at 10,000 concurrent
    runs (bench W2), every step waiting on it. The interval only matters when threads
    contend for the GIL."""
    return _tuned(sys.getswitchinterval, sys.setswitchinterval, _SWITCH_DEFAULT, _SWITCH_WORKER)


@contextlib.contextmanager
def _tuned(get: Callable[[], T], put: Callable[[T], None], default: T, tuned: T
           ) -> Iterator[None]:
    """Set an interpreter setting to `tuned` for the block if it is at `default`, and back
    after (unless someone changed it meanwhile); leave it alone if it was not at default."""
    if get() != default:
        yield
        return
    put(tuned)
    try:
        yield
    finally:
        if get() == tuned:
            put(default)


