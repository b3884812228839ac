"""The blob delta codec of tether.langgraph: a value stored as a chain reads back byte for byte."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from tether.errors import StoreError
from tether.langgraph._blobs import (
    MAX_CHAIN,
    BlobCache,
    BlobRows,
    array_header,
    assemble,
    garbage,
    pack_header,
)

serde = JsonPlusSerializer()
items = st.one_of(st.text(max_size=40), st.integers(-(2**63), 2**63 - 1), st.none(), st.binary(max_size=20),
                  st.dictionaries(st.text(max_size=5), st.integers(-1000, 1000), max_size=3))


def store(cache: BlobCache, rows: BlobRows, version: str, value: Any) -> Any:
    type_, data = serde.dumps_typed(value)
    blob = cache.encode("t", "", "ch", version, type_, data)
    rows[("ch", version)] = (blob.type, blob.blob, blob.base)
    return blob


@pytest.mark.parametrize("count", [0, 1, 15, 16, 65535, 65536])
def test_array_headers_round_trip(count: int) -> None:
    assert array_header(pack_header(count) + b"\xc0") == (count, len(pack_header(count)))


@given(st.lists(st.lists(items, max_size=20), min_size=1, max_size=8))
def test_appended_lists_read_back_exactly(appends: list[list[Any]]) -> None:
    cache, rows, value = BlobCache(), BlobRows(), []
    for i, more in enumerate(appends):
        value = value + more
        store(cache, rows, f"v{i}", value)
        type_, data = assemble(rows, "ch", f"v{i}")
        assert (type_, data) == serde.dumps_typed(value)
        assert serde.loads_typed((type_, data or b"")) == value


def test_deltas_hold_only_new_items_and_other_values_are_whole() -> None:
    cache, rows = BlobCache(), BlobRows()
    first = store(cache, rows, "1", ["x" * 100] * 10)
    assert first.base is None
    second = store(cache, rows, "2", ["x" * 100] * 10 + ["y"])
    assert second.base == "1" and len(second.blob) < 10
    changed = store(cache, rows, "3", ["z"] + ["x" * 100] * 10)  # not an extension
    assert changed.base is None
    scalar = store(cache, rows, "4", "text")
    assert scalar.base is None and assemble(rows, "ch", "4") == serde.dumps_typed("text")


def test_chains_are_bounded() -> None:
    cache, rows, value = BlobCache(), BlobRows(), []
    bases = []
    for i in range(MAX_CHAIN * 2 + 3):
        value = [*value, i]
        bases.append(store(cache, rows, str(i), value).base)
    full = [i for i, b in enumerate(bases) if b is None]
    assert full == [0, MAX_CHAIN + 1, 2 * MAX_CHAIN + 2]
    assert serde.loads_typed(assemble(rows, "ch", str(len(bases) - 1))) == value  # type: ignore[arg-type]


def test_a_missing_base_is_an_error() -> None:
    cache, rows = BlobCache(), BlobRows()
    store(cache, rows, "1", [1])
    store(cache, rows, "2", [1, 2])
    del rows[("ch", "1")]
    with pytest.raises(StoreError, match="missing"):
        assemble(rows, "ch", "2")


def test_garbage_keeps_live_versions_and_their_bases() -> None:
    stored = [("a", "1", None), ("a", "2", "1"), ("a", "3", "2"), ("a", "4", None),
              ("b", "1", None), ("b", "2", None)]
    assert sorted(garbage([("a", "3"), ("b", "2")], stored)) == [("a", "4"), ("b", "1")]
    assert sorted(garbage([], stored)) == sorted((c, v) for c, v, _ in stored)
