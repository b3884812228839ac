"""Interpreter settings for a process that runs thousands of runs' steps, starts or waits at
once.

On by default: while a runtime is open the cyclic collector runs less often (runtime_tuned),
and while a worker runs (`tether worker`, `tether serve`'s embedded worker, `runtime.work()`
in a program) it is sized for the worker's concurrency and the GIL's switch interval is
shortened (worker_tuned). Only a setting still at Python's default is changed: one the program
chose is never touched, and the defaults come back when the last tuned part of the process
ends (several runtimes and workers in one process share one tuning, at the largest size any of
them asks for). `Runtime(tune=False)` keeps the interpreter exactly as it is;
`runtime.work(tune=False)` leaves out the worker's part."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from typing import Final

_holds: list[tuple[int | None, bool]] = []
"""What each tuned part of the process asks for while it lasts (an open runtime, a running
worker): the collector's young threshold, and whether the GIL's switch interval is shortened.
The process runs with the largest threshold asked for, the switch interval shortened while any
worker runs; a setting found at Python's default when one comes in is changed, and the last one
out puts it back."""
_ours: dict[str, object] = {}
"""The settings this module set, by name, as it set them: one found otherwise later was
changed by the program, and is left alone from then on."""


@contextlib.contextmanager
def process_tuned(young: int | None, switch: bool) -> Iterator[None]:
    """Hold the collector's young threshold at `young` or above (None: no ask) and the switch
    interval short, if `switch`, for the block, alongside every other holder in the process."""
    # A setting at Python's default is ours from now on (also one the program set back to it).
    if "gc" not in _ours and gc.get_threshold() == _GC_DEFAULT:
        _ours["gc"] = _GC_DEFAULT
    if "switch" not in _ours and sys.getswitchinterval() == _SWITCH_DEFAULT:
        _ours["switch"] = _SWITCH_DEFAULT
    hold = (young, switch)
    _holds.append(hold)
    _apply()
    try:
        yield
    finally:
        _holds.remove(hold)
        _apply()


def _apply() -> None:
    """Set each setting still ours to what the holders ask for (the default when none)."""
    young = max((y for y, _ in _holds if y is not None), default=None)
    gc_want = _GC_DEFAULT if young is None else (young, _GC_WORKER[1], _GC_WORKER[2])
    switch_want = _SWITCH_WORKER if any(s for _, s in _holds) else _SWITCH_DEFAULT
    if "gc" in _ours:
        if gc.get_threshold() != _ours["gc"]:
            del _ours["gc"]  # the program changed it meanwhile: its choice stands
        else:
            gc.set_threshold(*gc_want)
            _ours["gc"] = gc_want
    if "switch" in _ours:
        if sys.getswitchinterval() != _ours["switch"]:
            del _ours["switch"]
        else:
            sys.setswitchinterval(switch_want)
            _ours["switch"] = switch_want


def worker_tuned(concurrency: int) -> contextlib.AbstractContextManager[None]:
    """Both settings below while the worker runs, each only if it was still at Python's
    default when the process's first tuned part started: the collector sized for the largest
    concurrency of the workers running (gc_thresholds), the switch interval shortened."""
    return process_tuned(gc_thresholds(concurrency)[0], switch=True)


def runtime_tuned() -> contextlib.AbstractContextManager[None]:
    """The collector's worker floor (_GC_WORKER) while a runtime is open, worker or not: a
    program that starts or waits for thousands of runs at once keeps thousands of tasks and
    coroutines alive, and with Python's defaults the collector took a third of the CPU of
    10,000 `runtime.start` calls gathered (0.61 s against 0.47 s, bench W2 queued)."""
    return process_tuned(_GC_WORKER[0], switch=False)


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
    return process_tuned(gc_thresholds(concurrency)[0], switch=False)


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
    return process_tuned(None, switch=True)
