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

from tether.tuning import (
    _GC_DEFAULT,
    _GC_WORKER,
    _SWITCH_DEFAULT,
    _SWITCH_WORKER,
    gc_thresholds,
    gc_tuned,
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
    """The second worker neither re-tunes nor, stopping first, untunes the one still running;
    the last one out restores Python's defaults."""
    before = gc.get_threshold(), sys.getswitchinterval()
    try:
        gc.set_threshold(*_GC_DEFAULT)
        sys.setswitchinterval(_SWITCH_DEFAULT)
        first, second = worker_tuned(10), worker_tuned(10_000)
        first.__enter__()
        second.__enter__()
        assert gc.get_threshold() == _GC_WORKER
        first.__exit__(None, None, None)  # the first one stops while the second still runs
        assert gc.get_threshold() == _GC_WORKER
        assert sys.getswitchinterval() == _SWITCH_WORKER
        second.__exit__(None, None, None)
        assert gc.get_threshold() == _GC_DEFAULT
        assert sys.getswitchinterval() == _SWITCH_DEFAULT
    finally:
        gc.set_threshold(*before[0])
        sys.setswitchinterval(before[1])


@pytest.mark.parametrize("tune", [None, False])
def test_a_programs_worker_is_tuned_unless_it_says_not(tune: bool | None,
                                                       tmp_path: Path) -> None:
    """`runtime.work()` as a program writes it tunes (round 2 made it opt-in: W2 10,000 went
    1.65x slower for every program); `tune=False` keeps the interpreter as it is."""
    import asyncio

    import tether

    seen: list[tuple[int, int, int]] = []
    before = gc.get_threshold()

    async def main() -> None:
        rt = tether.Runtime(f"sqlite:///{tmp_path}/t.db", agents=[], version="v1")
        await rt.migrate()
        async with rt:
            stop = asyncio.Event()
            kwargs = {} if tune is None else {"tune": tune}
            task = asyncio.create_task(rt.work(concurrency=10, stop=stop, **kwargs))
            await asyncio.sleep(0.2)
            seen.append(gc.get_threshold())
            stop.set()
            await task

    try:
        gc.set_threshold(*_GC_DEFAULT)
        asyncio.run(main())
        assert seen == [_GC_DEFAULT if tune is False else _GC_WORKER]
        assert gc.get_threshold() == _GC_DEFAULT
    finally:
        gc.set_threshold(*before)
