"""Plans of the SQLite store's claim: it must cost what it claims, not what the table holds
(every in-flight step's run is 'running', and a claim runs inside the write transaction
every group commit waits on)."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import orjson

from tether.store.migrate import queries


def test_a_claim_reads_only_claimable_runs(sqlite_template: Path, tmp_path: Path) -> None:
    path = tmp_path / "plans.db"
    shutil.copyfile(sqlite_template, path)
    params = {"worker": "w2", "version": "v", "agents": orjson.dumps(["a"]).decode(),
              "limit": 100, "ttl": 30.0}
    with closing(sqlite3.connect(path)) as db:
        db.executemany(
            "INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,"
            " lease_owner, lease_expires_at, epoch, attempt, created_at, updated_at)"
            " VALUES (?, 'a', 'v', ?, 'n', '{}', 'h', ?, ?, 1, 1, 0, 0)",
            [(f"r{i:05d}", "queued", None, None) if i < 3 else
             (f"r{i:05d}", "running", "w", 1.0 if i < 5 else 1e12) for i in range(5000)])
        for analyzed in (False, True):
            if analyzed:
                db.execute("ANALYZE")
            plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + queries("sqlite")[
                "claim_runs"], params)]
            runs_reads = [p for p in plan if " runs " in f"{p} "]
            assert "SEARCH runs USING INDEX runs_due (version=? AND <expr><?)" in runs_reads, plan
            assert ("SEARCH runs USING INDEX runs_expiry (version=? AND lease_expires_at<?)"
                    in runs_reads), plan
            assert not [p for p in runs_reads if p.startswith("SCAN")], plan
            # The cross-process wake-up's check reads the same range, and stops at one row.
            due = {k: params[k] for k in ("version", "agents")}
            plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + queries("sqlite")[
                "any_due"], due)]
            assert [p for p in plan if " runs " in f"{p} "] == [
                "SEARCH runs USING INDEX runs_due (version=? AND <expr><?)"], plan
        assert db.execute(queries("sqlite")["any_due"], due).fetchone() == (1,)
        claimed = db.execute(queries("sqlite")["claim_runs"], params).fetchall()
        assert len(claimed) == 5  # 3 queued, 2 whose lease expired
        assert db.execute(queries("sqlite")["any_due"], due).fetchone() == (0,)
