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



def test_fragments_may_take_in_fragments() -> None:
    q = parse_query_files({
        "a.sql": "-- fragment: cols\na, {{more}}\n\n-- fragment: more\nb\n\n"
                 "-- fragment: select\n-- what select is\nSELECT {{cols}}\n{{where}}\n",
        "b.sql": "-- fragment: where\nWHERE {{more}} > 0\n\n"
                 "-- name: one\n-- one's comment\n{{select}}\nFROM t;\n",
    })
    assert q == {"one": "-- one's comment\nSELECT a, b\nWHERE b > 0\nFROM t"}


def test_an_unknown_fragment_inside_a_fragment_names_the_way_to_it() -> None:
    text = "-- fragment: a\n{{b}}\n-- fragment: b\nSELECT {{nope}}\n-- name: one\n{{a}}\n"
    with pytest.raises(ValueError, match=r"unknown fragment 'nope' in test \(used by one -> a "
                                         r"-> b\)"):
        parse_queries(text, "test")


@pytest.mark.parametrize(("text", "cycle"), [
    ("-- fragment: a\nx {{b}}\n-- fragment: b\n{{c}}\n-- fragment: c\n  {{a}}\n",
     "a -> b -> c -> a"),
    ("-- fragment: a\nSELECT {{a}}\n", "a -> a"),
    ("-- fragment: a(x)\n{{a({{x}})}}\n", "a -> a"),
], ids=["three", "itself", "with arguments"])
def test_a_cycle_of_fragments_is_an_error_naming_it(text: str, cycle: str) -> None:
    use = "{{a(1)}}" if "a(x)" in text else "{{a}}"
    with pytest.raises(ValueError, match=rf"fragment cycle in test: one -> {cycle}$"):
        parse_queries(f"{text}-- name: one\n{use}\n", "test")


PAGE = """-- fragment: page(key, dir, cond)
-- a parametrized fragment (its comment is not copied either)
SELECT * FROM t
WHERE {{key}} > 0
  {{cond}}
ORDER BY {{key}} {{dir}}

-- fragment: newest(cond)
{{page(created_at, DESC, {{cond}})}}

-- fragment: open
AND status IN ('a', 'b,c')
"""


def test_a_fragment_takes_the_arguments_of_each_use() -> None:
    q = parse_queries(PAGE + """
-- name: plain
{{newest()}}

-- name: failed
{{newest(AND status = 'failed' AND f(x, y) = 1)}}

-- name: of_open
WITH o AS ({{newest({{open}})}})
SELECT * FROM o;

-- name: inline
SELECT {{page(a, ASC, AND b)}}
""", "test")
    assert q["plain"] == "SELECT * FROM t\nWHERE created_at > 0\nORDER BY created_at DESC"
    assert q["failed"] == ("SELECT * FROM t\nWHERE created_at > 0\n"
                           "  AND status = 'failed' AND f(x, y) = 1\nORDER BY created_at DESC")
    assert q["of_open"] == ("WITH o AS (SELECT * FROM t\nWHERE created_at > 0\n"
                         "  AND status IN ('a', 'b,c')\nORDER BY created_at DESC)\n"
                         "SELECT * FROM o")
    assert q["inline"] == "SELECT SELECT * FROM t\nWHERE a > 0\n  AND b\nORDER BY a ASC"


def test_a_use_with_the_wrong_arguments_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"fragment 'page' takes 3 argument\(s\) \(key, dir, "
                                         r"cond\), got 2 in test \(used by one\)"):
        parse_queries(PAGE + "-- name: one\n{{page(a, b)}}\n", "test")
    with pytest.raises(ValueError, match=r"fragment 'open' takes 0 argument\(s\) \(\), got 1"):
        parse_queries(PAGE + "-- name: one\n{{open(a)}}\n", "test")
    with pytest.raises(ValueError, match=r"fragment 'newest' takes 1 argument\(s\) \(cond\), "
                                         r"got 0"):
        parse_queries(PAGE + "-- name: one\n{{newest}}\n", "test")


def test_parameters_are_fragments_only_and_never_a_fragments_name() -> None:
    with pytest.raises(ValueError, match="query 'one' in test has parameters"):
        parse_queries("-- name: one(x)\nSELECT {{x}};\n", "test")
    with pytest.raises(ValueError, match="parameter 'open' of fragment 'f' in test is also a "
                                         "fragment's name"):
        parse_queries(PAGE + "-- fragment: f(open)\n{{open}}\n", "test")
    with pytest.raises(ValueError, match=r"fragment 'f' in test: parameters must be distinct "
                                         r"names, got \(x, x\)"):
        parse_queries("-- fragment: f(x, x)\n{{x}}\n", "test")


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
