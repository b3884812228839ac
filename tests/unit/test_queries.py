"""The named-query loader: queries, and fragments several queries share."""

from __future__ import annotations

import pytest

from tether.store.migrate import parse_queries, queries

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
