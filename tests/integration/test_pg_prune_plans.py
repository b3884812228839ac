"""Plans of a Postgres prune batch, with statistics (autovacuum's ANALYZE; the bench's fill
ends with one): the walk goes down run_keys_created (the order the rows were written in) in
order, never sorting the runs, and the deletes find their rows through the tables' primary
keys, never by scanning a table. Against a real server; a batch a small part of the tables,
as in any store where pruning matters (without statistics the planner may sort instead)."""

from __future__ import annotations

import time
from typing import Any

import orjson
import psycopg
import pytest

from tether.store.migrate import queries
from tether.store.pg_retention import TABLES

pytestmark = pytest.mark.postgres

RUNS, STEPS, BATCH = 20_000, 5, 50
DAY = 86400.0


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node] + [n for child in node.get("Plans", []) for n in _nodes(child)]


def _scans(node: dict[str, Any]) -> list[tuple[str, str]]:
    here = ([(node["Node Type"], node.get("Index Name") or node.get("Relation Name", ""))]
            if "Scan" in node["Node Type"] and "Relation Name" in node else [])
    return here + [s for child in node.get("Plans", []) for s in _scans(child)]


def test_a_prune_batch_walks_runs_created_and_deletes_by_primary_key(pg_url: str) -> None:
    q = queries("postgres")
    now = time.time()
    old = now - 40 * DAY
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute(b"""
            INSERT INTO runs (thread_id, agent, version, status, step, input, input_hash,
                              created_at, updated_at)
            SELECT md5('r' || i), 'a', 'v1', 'completed', %(steps)s, '{}', 'h',
                   %(old)s + i, %(old)s + i + 1
            FROM generate_series(1, %(runs)s) i""", {"steps": STEPS, "old": old, "runs": RUNS})
        pg.execute(b"""
            INSERT INTO checkpoints (thread_id, step, node, kind, data, worker, attempt,
                                     started_at, finished_at)
            SELECT thread_id, s, 'n', 'd', '{}', 'w', 1, 0, 0
            FROM runs, generate_series(1, %(steps)s) s""", {"steps": STEPS})
        pg.execute(b"""
            INSERT INTO journal (thread_id, step, idx, name, result)
            SELECT thread_id, s, 0, 'f', '1' FROM runs, generate_series(1, %(steps)s) s""",
                   {"steps": STEPS})
        pg.execute(b"ANALYZE")
        cut = {"completed": now - 30 * DAY, "failed": None, "cancelled": None, "agent": None}
        ids = [r[0] for r in pg.execute(
            b"SELECT thread_id FROM runs ORDER BY created_at LIMIT %(n)s", {"n": BATCH})]
        statements = {
            "prune_candidates": {**cut, "after_at": float("-inf"), "after": "",
                                 "horizon": cut["completed"], "limit": BATCH},
            "prune_mark": {**cut, "ids": ids},
            **{f"prune_{t}": {"ids": ids} for t in TABLES}}
        plans, kinds, indexes = {}, {}, {}
        for name, params in statements.items():
            row = pg.execute(b"EXPLAIN (FORMAT JSON) " + q[name].encode(), params).fetchone()
            assert row is not None
            plan = row[0] if isinstance(row[0], list) else orjson.loads(row[0])
            plans[name] = _scans(plan[0]["Plan"])
            kinds[name] = {n["Node Type"] for n in _nodes(plan[0]["Plan"])}
            indexes[name] = {n["Index Name"] for n in _nodes(plan[0]["Plan"]) if "Index Name" in n}
    # run_keys_created (migration 0018), each run then read by primary key.
    assert {("Index Scan", "run_keys_created"), ("Index Only Scan", "run_keys_created")} & set(
        plans["prune_candidates"]) and ("Index Scan", "runs_pkey") in plans["prune_candidates"], plans
    assert "Sort" not in kinds["prune_candidates"], kinds["prune_candidates"]
    for name, scans in plans.items():  # (outbox, mailbox: empty here, scanned whole)
        assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in (
            "runs", "checkpoints", "journal")], (name, scans)
    assert "runs_pkey" in indexes["prune_mark"], indexes["prune_mark"]
    for table in ("checkpoints", "journal"):
        assert indexes[f"prune_{table}"] == {f"{table}_pkey"}, indexes
