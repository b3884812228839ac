"""The named-query loader: queries, and fragments several queries share."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from tether.store.base import CHECKPOINT_COLUMNS, RUN_COLUMNS, EffectRecord, InterruptRecord
from tether.store.migrate import parse_queries, parse_query_files, queries

TEXT = """-- preamble
-- name: one
-- what one guarantees
WITH u AS (
    {{upd}}
    RETURNING id
)
SELECT id FROM u;

-- fragment: upd
-- what the fragment is (not copied into the queries)
    UPDATE t
    SET x = 1

-- name: two
SELECT 2;
"""


def test_fragments_are_taken_in_and_are_no_queries() -> None:
    q = parse_queries(TEXT, "test")
    assert set(q) == {"one", "two"}
    assert q["one"] == ("-- what one guarantees\nWITH u AS (\n    UPDATE t\n    SET x = 1\n"
                        "    RETURNING id\n)\nSELECT id FROM u")
    assert q["two"] == "SELECT 2"


def test_an_unknown_fragment_or_a_name_used_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown fragment 'nope' in test"):
        parse_queries("-- name: one\nSELECT\n    {{nope}}\n", "test")
    with pytest.raises(ValueError, match="duplicate query name 'one' in test"):
        parse_queries("-- name: one\nSELECT 1;\n-- fragment: one\n  x\n", "test")


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_every_shipped_query_has_its_fragments_in(dialect: str) -> None:
    assert not [name for name, sql in queries(dialect).items() if "{{" in sql]


def test_fragments_are_shared_across_files_and_may_be_used_inline() -> None:
    q = parse_query_files({
        "a.sql": "-- fragment: cols\n-- the columns\na, b\n\n-- name: one\nSELECT {{cols}} FROM t;\n",
        "b.sql": "-- name: two\nSELECT {{cols}}, c FROM t WHERE x\n    {{cond}}\n"
                 "-- fragment: cond\n    AND y\n",
    })
    assert q == {"one": "SELECT a, b FROM t", "two": "SELECT a, b, c FROM t WHERE x\n    AND y"}


def test_a_name_defined_in_two_files_is_an_error_naming_both() -> None:
    with pytest.raises(ValueError, match=r"duplicate query name 'one' in b.sql \(also in a.sql\)"):
        parse_query_files({"a.sql": "-- name: one\nSELECT 1;\n",
                           "b.sql": "-- fragment: one\n  x\n"})


def _columns(sql: str, table: str) -> tuple[str, ...]:
    m = re.search(rf"SELECT (.*?)\s+FROM {table}\b", sql, re.S)
    assert m is not None, sql
    return tuple(c.strip() for c in m.group(1).split(","))


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_the_column_fragments_are_the_records_fields_in_order(dialect: str) -> None:
    q = queries(dialect)
    assert _columns(q["get_run"], "runs") == RUN_COLUMNS
    assert _columns(q["get_effect"], "outbox") == tuple(EffectRecord.__dataclass_fields__)
    assert _columns(q["get_interrupt"], "interrupts") == tuple(
        InterruptRecord.__dataclass_fields__)
    assert _columns(q["load_checkpoints"], "checkpoints") == CHECKPOINT_COLUMNS


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_queries_come_from_several_files_each_under_600_lines(dialect: str) -> None:
    folder = resources.files("tether.store") / "sql" / dialect / "queries"
    files = [entry for entry in folder.iterdir() if entry.name.endswith(".sql")]
    assert len(files) > 3
    for entry in files:
        assert len(entry.read_text("utf-8").splitlines()) <= 600, entry.name
    assert not (resources.files("tether.store") / "sql" / dialect / "queries.sql").is_file()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_no_query_aborts_by_a_division(dialect: str) -> None:
    """A statement that must not commit writes nothing and says so in its result: no query
    divides by zero (or by a CASE that may be zero) to make the server refuse it."""
    for name, sql in queries(dialect).items():
        assert not re.search(r"/\s*\(?\s*(0\b|CASE)", sql, re.I), name
