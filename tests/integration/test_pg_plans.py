"""Plans of the Postgres group commit's multi-row statements: they must cost what the batch
costs, not what the table holds. Autovacuum may be off, so they must not depend on planner
statistics either: checked before and after ANALYZE, against a real server."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pytest

from tether.store.migrate import queries

pytestmark = pytest.mark.postgres

RUNS = 20_000  # running runs in the table
BATCH = 200  # runs one group commit touches


def _scans(node: dict[str, Any]) -> list[tuple[str, str]]:
    here = ([(node["Node Type"], node.get("Index Name") or node.get("Relation Name", ""))]
            if "Scan" in node["Node Type"] and "Relation Name" in node else [])
    return here + [s for child in node.get("Plans", []) for s in _scans(child)]


@pytest.mark.parametrize("history", [False, True], ids=["fresh", "stats-of-finished-runs"])
def test_group_commit_locks_and_fences_look_runs_up_by_primary_key(pg_url: str,
                                                                   history: bool) -> None:
    """`history`: the table held 100,000 finished runs and no running one when it was last
    analyzed (a production store after a quiet spell): the statistics then say a 'running'
    run is rare, and a partial index on status looked cheaper than the primary key (lock_batch
    scanned runs_open for every id of the batch: W2 on Postgres at 5.9x ideal)."""
    q = queries("postgres")
    ids = [f"r{i:06d}" for i in range(0, RUNS, RUNS // BATCH)]
    journals = orjson.dumps([{"thread_id": t, "epoch": 1, "step": 1, "idx": 0, "name": "f",
                              "result": '"ok"'} for t in ids]).decode()
    steps = orjson.dumps([{"thread_id": t, "epoch": 1, "step": 1, "node": "n", "next_node": "n",
                           "kind": "d", "data": "{}", "worker": "w", "attempt": 1,
                           "started_at": 1.0, "finished_at": 1.0, "status": "running",
                           "wake_at": None, "waiting_for": None} for t in ids]).decode()
    finishes = steps.replace('"status":"running"', '"status":"completed"')
    assert finishes != steps
    statements = {"lock_batch": (q["lock_batch"], {"ids": orjson.dumps(ids).decode()}),
                  "insert_journals": (q["insert_journals"], {"rows": journals}),
                  "commit_steps": (q["commit_steps"], {"rows": steps}),
                  "commit_steps (last steps)": (q["commit_steps"], {"rows": finishes})}
    with psycopg.connect(pg_url, autocommit=True) as pg:
        if history:
            pg.execute(b"""
                INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                                  epoch, attempt, created_at, updated_at)
                SELECT 'done' || i, 'a', 'v', 'completed', 'n', '{}', 'h', 1, 1, 0, 0
                FROM generate_series(1, 100000) i""")
            pg.execute(b"ANALYZE runs")
        # Running runs, written directly: only their number matters here.
        pg.execute(b"""
            INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                              lease_owner, lease_expires_at, epoch, attempt, created_at,
                              updated_at)
            SELECT 'r' || lpad(i::text, 6, '0'), 'a', 'v', 'running', 'n', '{}', 'h', 'w',
                   1e12, 1, 1, 0, 0
            FROM generate_series(0, %s - 1) i""", (RUNS,))
        for analyzed in ((True,) if history else (False, True)):
            if analyzed and not history:
                pg.execute(b"ANALYZE runs")
            for name, (sql, params) in statements.items():
                pg.execute(b"BEGIN")  # ANALYZE runs the statement: undo what it wrote
                (plan,), = pg.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).encode(),
                                      params).fetchall()
                pg.execute(b"ROLLBACK")
                root = plan[0]["Plan"]
                runs_scans = [s for s in _scans(root) if s[1].startswith("runs")]
                assert ("Index Scan", "runs_pkey") in runs_scans, (name, analyzed, runs_scans)
                assert all(s in (("Index Scan", "runs_pkey"), ("Tid Scan", "runs"))
                           for s in runs_scans), (name, analyzed, runs_scans)
                if name != "lock_batch":  # every row of the batch is written
                    assert root["Actual Rows"] == len(ids), (name, root["Actual Rows"])


def _indexes(node: dict[str, Any]) -> set[str]:
    """The indexes the plan reads (index scans, bitmap index scans)."""
    here = {node["Index Name"]} if "Index Name" in node else set()
    return here.union(*(_indexes(child) for child in node.get("Plans", [])))


def _removed(node: dict[str, Any]) -> int:
    """Rows every node of the plan read and then threw away (filters, join filters)."""
    here = sum(v for k, v in node.items() if k.startswith("Rows Removed by"))
    return here + sum(_removed(child) for child in node.get("Plans", []))


def test_a_claim_reads_only_claimable_runs(pg_url: str) -> None:
    """Every in-flight step's run is 'running': a claim must not read them to find the few
    that are due or whose lease expired (it did, 5-9 ms at 10,000, on every claim)."""
    q = queries("postgres")
    params = {"worker": "w2", "version": "v", "agents": ["a"], "limit": 100, "ttl": 30.0}
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute(b"""
            INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                              lease_owner, lease_expires_at, epoch, attempt, created_at,
                              updated_at)
            SELECT 'r' || lpad(i::text, 6, '0'), 'a', 'v',
                   CASE WHEN i < 3 THEN 'queued' ELSE 'running' END, 'n', '{}', 'h',
                   CASE WHEN i < 3 THEN NULL ELSE 'w' END,
                   CASE WHEN i < 3 THEN NULL WHEN i < 5 THEN 1 ELSE 1e12 END,
                   1, 1, 0, 0
            FROM generate_series(0, %s - 1) i""", (RUNS,))
        for analyzed in (False, True):
            if analyzed:
                pg.execute(b"ANALYZE runs")
            pg.execute(b"BEGIN")
            (plan,), = pg.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " + q["claim_runs"]).encode(),
                                  params).fetchall()
            pg.execute(b"ROLLBACK")
            root = plan[0]["Plan"]
            assert root["Actual Rows"] == 5, analyzed  # 3 queued, 2 with expired leases
            runs_scans = {s for s in _scans(root) if s[1].startswith("runs")}
            assert runs_scans == {("Index Scan", "runs_due"), ("Index Scan", "runs_expiry"),
                                  ("Tid Scan", "runs")}, (analyzed, runs_scans)
            assert _removed(root) <= 5, (analyzed, _removed(root))


def _wake_statements(ids: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The statements that lock and wake runs parked for mail, each with mail to `ids` from
    the run "sender" (running, at step 1 under epoch 1)."""
    q = queries("postgres")
    mail = orjson.dumps([{"recipient": t, "sender": None, "message": "e30="} for t in ids]
                        ).decode()
    steps = orjson.dumps([{"thread_id": "sender", "epoch": 1, "step": 1, "parent": False,
                           "mail": False, "notify": False, "effects": False}]).decode()
    pairs = orjson.dumps([{"sender": "sender", "recipient": t} for t in ids]).decode()
    return {
        "send_messages": (q["send_messages"], {"mail": mail}),
        "wake_after_commit_many": (q["wake_after_commit_many"], {"steps": steps, "mail": pairs}),
        "lock_runs_many": (q["lock_runs_many"], {"ids": orjson.dumps(["sender", *ids]).decode(),
                                                  "terminal": '["sender"]'}),
        "lock_runs": (q["lock_runs"], {"ids": ["sender", *ids], "thread_id": "sender",
                                       "parent": True}),
        "wake_after_commit": (q["wake_after_commit"], {
            "thread_id": "sender", "epoch": 1, "step": 1, "recipients": ids, "mail": False,
            "parent": False, "notify": False, "effects": False}),
    }


@pytest.mark.parametrize("history", [False, True], ids=["fresh", "stats-of-finished-runs"])
def test_mail_wakes_its_recipients_by_primary_key(pg_url: str, history: bool) -> None:
    """Mail to a few of many parked actors locks and wakes them by primary key, whatever the
    planner's statistics say: planned from runs_open (status = 'waiting' looks rare to a table never
    analyzed since it filled, or last analyzed when it held finished runs), each statement
    walked every parked run once per recipient (761 ms for 500 messages among 20,000); the
    locks read the whole table (a hash join, an OR)."""
    ids = [f"p{i:06d}" for i in range(0, RUNS, RUNS // BATCH)]
    with psycopg.connect(pg_url, autocommit=True) as pg:
        if history:
            pg.execute(b"""
                INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                                  epoch, attempt, created_at, updated_at)
                SELECT 'done' || i, 'a', 'v', 'completed', 'n', '{}', 'h', 1, 1, 0, 0
                FROM generate_series(1, 100000) i""")
            pg.execute(b"ANALYZE runs")
        pg.execute(b"""
            INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                              waiting_for, epoch, attempt, step, created_at, updated_at)
            SELECT 'p' || lpad(i::text, 6, '0'), 'a', 'v', 'waiting', 'n', '{}', 'h', 'mail',
                   1, 1, 1, 0, 0
            FROM generate_series(0, %s - 1) i""", (RUNS,))
        pg.execute(b"""
            INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                              epoch, attempt, step, created_at, updated_at)
            VALUES ('sender', 'a', 'v', 'running', 'n', '{}', 'h', 1, 1, 1, 0, 0)""")
        for analyzed in ((True,) if history else (False, True)):
            if analyzed and not history:
                pg.execute(b"ANALYZE runs")
            for name, (sql, params) in _wake_statements(ids).items():
                pg.execute(b"BEGIN")  # ANALYZE runs the statement: undo what it wrote
                (plan,), = pg.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).encode(),
                                      params).fetchall()
                woken = pg.execute(b"SELECT count(*) FROM runs WHERE status = 'queued'"
                                   ).fetchone()
                pg.execute(b"ROLLBACK")
                root = plan[0]["Plan"]
                if name.startswith("lock_"):  # the sender and every recipient, locked
                    assert (woken, root["Actual Rows"]) == ((0,), len(ids) + 1), name
                else:
                    assert woken == (len(ids),), (name, analyzed, woken)
                runs_scans = {s for s in _scans(root) if s[1].startswith("runs")}
                assert ("Index Scan", "runs_pkey") in runs_scans, (name, analyzed, runs_scans)
                assert runs_scans <= {("Index Scan", "runs_pkey"), ("Tid Scan", "runs")}, (
                    name, analyzed, runs_scans)
                assert _removed(root) <= len(ids), (name, analyzed, _removed(root))


@pytest.mark.parametrize("analyzed", [False, True], ids=["never-analyzed", "analyzed"])
def test_a_claims_reads_look_each_run_up_by_index(pg_url: str, analyzed: bool) -> None:
    """The reads of a claim's runs (Store.load_claimed) cost what the claim holds, not what
    the tables hold: each run's checkpoints since its snapshot, its next step's journal and
    its unconsumed mail, looked up in the primary key or mailbox_pending (an index scan, or a
    bitmap of one), run by run, whatever the statistics."""
    q = queries("postgres")
    ids = [f"p{i:06d}" for i in range(0, RUNS, RUNS // BATCH)]
    with psycopg.connect(pg_url, autocommit=True) as pg:
        # Every run: steps 1-4, a snapshot at 2; two calls journaled in step 5; five
        # messages, the first three consumed.
        pg.execute(b"""
            INSERT INTO checkpoints (thread_id, step, node, kind, data, worker, attempt,
                                     started_at, finished_at)
            SELECT 'p' || lpad(i::text, 6, '0'), s, 'n', CASE WHEN s = 2 THEN 's' ELSE 'd' END,
                   '{}', 'w', 1, 0, 0
            FROM generate_series(0, %(runs)s - 1) i, generate_series(1, 4) s""", {"runs": RUNS})
        pg.execute(b"""
            INSERT INTO journal (thread_id, step, idx, name, result)
            SELECT 'p' || lpad(i::text, 6, '0'), 5, c, 'f', '1'
            FROM generate_series(0, %(runs)s - 1) i, generate_series(0, 1) c""", {"runs": RUNS})
        pg.execute(b"""
            INSERT INTO mailbox (thread_id, message, created_at, consumed_step)
            SELECT 'p' || lpad(i::text, 6, '0'), '{}', 0, CASE WHEN m < 3 THEN 4 END
            FROM generate_series(0, 4) m, generate_series(0, %(runs)s - 1) i""", {"runs": RUNS})
        if analyzed:
            pg.execute(b"ANALYZE checkpoints, journal, mailbox")
        ids_json = orjson.dumps(ids).decode()
        statements = {
            "load_checkpoints_many": (q["load_checkpoints_many"], {"ids": ids_json}, 3,
                                      "checkpoints", {"checkpoints_pkey"}),
            "load_journal_many": (q["load_journal_many"], {"runs": orjson.dumps(
                [{"thread_id": t, "step": 5} for t in ids]).decode()}, 2, "journal",
                                  {"journal_pkey"}),
            "load_inbox_many": (q["load_inbox_many"], {"ids": ids_json, "limit": 1000}, 2,
                                "mailbox", {"mailbox_pending"}),
        }
        for name, (sql, params, each, table, indexes) in statements.items():
            (plan,), = pg.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).encode(),
                                  params).fetchall()
            root = plan[0]["Plan"]
            assert root["Actual Rows"] == each * len(ids), (name, root["Actual Rows"])
            scans = {s for s in _scans(root) if s[1].startswith(table)}
            assert scans and all(kind in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan")
                                 for kind, _ in scans), (name, scans)
            assert _indexes(root) == indexes, (name, _indexes(root))
