"""The worker raises the cyclic collector's thresholds while it runs, unless they were tuned."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tether.worker import _GC_DEFAULT, _GC_WORKER, gc_tuned


@pytest.fixture(autouse=True)
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_default_thresholds_are_raised_then_restored() -> None:
    gc.set_threshold(*_GC_DEFAULT)
    with gc_tuned():
        assert gc.get_threshold() == _GC_WORKER
    assert gc.get_threshold() == _GC_DEFAULT


def test_thresholds_someone_tuned_are_left_alone() -> None:
    gc.set_threshold(5000, 20, 20)
    with gc_tuned():
        assert gc.get_threshold() == (5000, 20, 20)
    assert gc.get_threshold() == (5000, 20, 20)


def test_restored_even_when_the_worker_fails() -> None:
    gc.set_threshold(*_GC_DEFAULT)
    with pytest.raises(RuntimeError), gc_tuned():
        raise RuntimeError("boom")
    assert gc.get_threshold() == _GC_DEFAULT
