"""While it runs, the worker raises the cyclic collector's thresholds and shortens the GIL's
switch interval, unless they were tuned already; it puts them back when it stops."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tether import tuning
from tether.tuning import (
    _GC_DEFAULT,
    _GC_WORKER,
    _SWITCH_DEFAULT,
    _SWITCH_WORKER,
    gc_thresholds,
    gc_tuned,
    runtime_tuned,
    switch_interval_tuned,
    worker_tuned,
)


class Setting(NamedTuple):
    get: Callable[[], Any]
    put: Callable[[Any], None]
    default: Any
    tuned: Any
    other: Any
    context: Callable[[], contextlib.AbstractContextManager[None]]


SETTINGS = {
    "gc": Setting(gc.get_threshold, lambda t: gc.set_threshold(*t), _GC_DEFAULT, _GC_WORKER,
                  (5000, 20, 20), gc_tuned),
    "switch": Setting(sys.getswitchinterval, sys.setswitchinterval, _SWITCH_DEFAULT,
                      _SWITCH_WORKER, 0.002, switch_interval_tuned),
}


@pytest.fixture(autouse=True)
def _no_other_holders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no tuned part in the process: a runtime another test of this
    process left open would hold the collector tuned until the process ends."""
    monkeypatch.setattr(tuning, "_holds", [])
    monkeypatch.setattr(tuning, "_ours", {})


@pytest.fixture(params=list(SETTINGS))
def setting(request: pytest.FixtureRequest) -> Iterator[Setting]:
    s = SETTINGS[request.param]
    before = s.get()
    yield s
    s.put(before)


def test_defaults_are_tuned_then_restored(setting: Setting) -> None:
    setting.put(setting.default)
    with setting.context():
        assert setting.get() == setting.tuned
    assert setting.get() == setting.default


def test_values_someone_tuned_are_left_alone(setting: Setting) -> None:
    setting.put(setting.other)
    with setting.context():
        assert setting.get() == setting.other
    assert setting.get() == setting.other


def test_restored_even_when_the_worker_fails(setting: Setting) -> None:
    setting.put(setting.default)
    with pytest.raises(RuntimeError), setting.context():
        raise RuntimeError("boom")
    assert setting.get() == setting.default


def test_a_change_made_while_running_is_kept(setting: Setting) -> None:
    setting.put(setting.default)
    with setting.context():
        setting.put(setting.other)
    assert setting.get() == setting.other


def test_the_young_threshold_grows_with_concurrency() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(*_GC_DEFAULT)
        with gc_tuned(10):
            assert gc.get_threshold() == _GC_WORKER  # never below the worker's floor
        with gc_tuned(10_000):
            assert gc.get_threshold() == (1_000_000, _GC_WORKER[1], _GC_WORKER[2])
        assert gc.get_threshold() == _GC_DEFAULT
        assert gc_thresholds(50_000)[0] == 5_000_000
    finally:
        gc.set_threshold(*before)


def test_workers_of_one_process_share_one_tuning() -> None:
    """The process runs at the largest size its workers ask for; the first one stopping does
    not untune the one still running; the last one out restores Python's defaults."""
    before = gc.get_threshold(), sys.getswitchinterval()
    try:
        gc.set_threshold(*_GC_DEFAULT)
        sys.setswitchinterval(_SWITCH_DEFAULT)
        first, second = worker_tuned(10), worker_tuned(10_000)
        first.__enter__()
        assert gc.get_threshold() == _GC_WORKER
        second.__enter__()
        assert gc.get_threshold() == gc_thresholds(10_000)
        first.__exit__(None, None, None)  # the first one stops while the second still runs
        assert gc.get_threshold() == gc_thresholds(10_000)
        assert sys.getswitchinterval() == _SWITCH_WORKER
        second.__exit__(None, None, None)
        assert gc.get_threshold() == _GC_DEFAULT
        assert sys.getswitchinterval() == _SWITCH_DEFAULT
    finally:
        gc.set_threshold(*before[0])
        sys.setswitchinterval(before[1])


@pytest.mark.parametrize("tune", [None, False])
def test_a_programs_runtime_and_worker_are_tuned_unless_it_says_not(tune: bool | None,
                                                                     tmp_path: Path) -> None:
    """`runtime.work()` as a program writes it tunes (round 2 made it opt-in: W2 10,000 went
    1.65x slower for every program), and so does an open runtime, for the starts and waits
    of a burst (the worker's concurrency raises it further); `Runtime(tune=False)` keeps the
    interpreter as it is. Closing the runtime restores Python's defaults."""
    import asyncio

    import tether

    seen: list[tuple[int, int, int]] = []
    before = gc.get_threshold(), sys.getswitchinterval()

    async def main() -> None:
        kwargs = {} if tune is None else {"tune": tune}
        rt = tether.Runtime(f"sqlite:///{tmp_path}/t.db", agents=[], version="v1", **kwargs)
        await rt.migrate()
        async with rt:
            seen.append(gc.get_threshold())  # open, no worker yet
            stop = asyncio.Event()
            task = asyncio.create_task(rt.work(concurrency=10_000, stop=stop))
            await asyncio.sleep(0.2)
            seen.append(gc.get_threshold())
            stop.set()
            await task
            seen.append(gc.get_threshold())  # the worker stopped, the runtime still open

    try:
        gc.set_threshold(*_GC_DEFAULT)
        sys.setswitchinterval(_SWITCH_DEFAULT)
        asyncio.run(main())
        if tune is False:
            assert seen == [_GC_DEFAULT] * 3
        else:
            assert seen == [_GC_WORKER, gc_thresholds(10_000), _GC_WORKER]
        assert gc.get_threshold() == _GC_DEFAULT
        assert sys.getswitchinterval() == _SWITCH_DEFAULT
    finally:
        gc.set_threshold(*before[0])
        sys.setswitchinterval(before[1])


def test_a_worker_without_tuning_on_a_tuned_runtime(tmp_path: Path) -> None:
    """`work(tune=False)` leaves out the worker's part only: the open runtime's stays."""
    import asyncio

    import tether

    seen: list[tuple[tuple[int, int, int], float]] = []
    before = gc.get_threshold(), sys.getswitchinterval()

    async def main() -> None:
        rt = tether.Runtime(f"sqlite:///{tmp_path}/t.db", agents=[], version="v1")
        await rt.migrate()
        async with rt:
            stop = asyncio.Event()
            task = asyncio.create_task(rt.work(concurrency=10_000, stop=stop, tune=False))
            await asyncio.sleep(0.2)
            seen.append((gc.get_threshold(), sys.getswitchinterval()))
            stop.set()
            await task

    try:
        gc.set_threshold(*_GC_DEFAULT)
        sys.setswitchinterval(_SWITCH_DEFAULT)
        asyncio.run(main())
        assert seen == [(_GC_WORKER, _SWITCH_DEFAULT)]
        assert gc.get_threshold() == _GC_DEFAULT
    finally:
        gc.set_threshold(*before[0])
        sys.setswitchinterval(before[1])


def test_a_change_the_program_makes_while_tuned_is_kept() -> None:
    """Once the program sets the collector itself, no holder coming or going touches it."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(*_GC_DEFAULT)
        with runtime_tuned():
            gc.set_threshold(5000, 20, 20)
            with worker_tuned(10_000):
                assert gc.get_threshold() == (5000, 20, 20)
        assert gc.get_threshold() == (5000, 20, 20)
    finally:
        gc.set_threshold(*before)
