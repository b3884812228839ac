"""While it runs, the worker raises the cyclic collector's thresholds and shortens the GIL's
switch interval, unless they were tuned already; it puts them back when it stops."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest

from tether.worker import (
    _GC_DEFAULT,
    _GC_WORKER,
    _SWITCH_DEFAULT,
    _SWITCH_WORKER,
    gc_tuned,
    switch_interval_tuned,
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
