"""Plans of the runs list (store/listing.py) on both stores: a page costs what it shows, not
what the table holds. The first page walks runs_created (on Postgres run_keys_created:
migration 0018), a time range is a range of it (read from the range, not walked to), a
thread_id prefix is a range of the primary key (never a LIKE over every run), a run's
children come from runs_parent, the failed ones from runs_failed (a partial index: failed on
a version that never failed reads only the failed runs), the cancelled ones from
runs_cancelled, the completed ones from runs_completed, an agent's from runs_agent, a
version's from runs_version (migration 0017: a filter that matches no recent run reads no
run). Checked before and after ANALYZE (Postgres: its choice of index once analyzed;
before, only that no plan reads the table whole). Between them, the cases run every list_runs_*
query of both dialects."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tether.store.listing import RunQuery
from tether.store.migrate import queries

RUNS = 20_000
# Runs r000000..r019999, created one a second from t=1000; every 100th has parent r000000,
# every 100th (others) failed, every 100th (others again) cancelled.
INSERT_SQLITE = """
    WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 - 1)
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash, epoch,
                      attempt, created_at, updated_at, parent_thread_id, finished_at)
    SELECT printf('r%06d', i), 'a', 'v',
           CASE i % 100 WHEN 50 THEN 'failed' WHEN 75 THEN 'cancelled' ELSE 'completed' END,
           NULL, '{}', 'h', 1, 1, 1000 + i,
           5000 + (i * 7919) % ?2, CASE WHEN i % 100 = 1 THEN 'r000000' END,
           5000 + (i * 7919) % ?2 FROM n"""  # (finished_at: set by SQLite's writers, 0018)
INSERT_PG = b"""
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash, epoch,
                      attempt, created_at, updated_at, parent_thread_id)
    SELECT 'r' || lpad(i::text, 6, '0'), 'a', 'v',
           CASE i %% 100 WHEN 50 THEN 'failed' WHEN 75 THEN 'cancelled' ELSE 'completed' END,
           NULL, '{}', 'h', 1, 1,
           1000 + i, 5000 + (i * 7919) %% %s, CASE WHEN i %% 100 = 1 THEN 'r000000' END
    FROM generate_series(0, %s - 1) i"""

CASES = {  # listing -> how many rows it returns
    "first page": (RunQuery(limit=51), 51),
    "oldest": (RunQuery(order="oldest", limit=51), 51),
    "a time range": (RunQuery(since=1500, until=1600, limit=51), 51),
    "a time range, oldest": (RunQuery(since=1500, until=1600, order="oldest", limit=51), 51),
    "a rare prefix": (RunQuery(prefix="r01234", limit=51), 10),
    "a prefix, oldest": (RunQuery(prefix="r0123", order="oldest", limit=51), 51),
    "a prefix, updated": (RunQuery(prefix="r01234", order="updated", limit=51), 10),
    "children": (RunQuery(parent="r000000", limit=51), 51),
    "children, oldest": (RunQuery(parent="r000000", order="oldest", limit=51), 51),
    "children, updated": (RunQuery(parent="r000000", order="updated", limit=51), 51),
    "a status": (RunQuery(status="failed", limit=51), 51),
    "a status, oldest": (RunQuery(status="failed", order="oldest", limit=51), 51),
    "a status and version": (RunQuery(status="failed", version="v", limit=51), 51),
    "a status and version, none": (RunQuery(status="failed", version="v2", limit=51), 0),
    "a status and version, oldest": (RunQuery(status="failed", version="v", order="oldest",
                                              limit=51), 51),
    "cancelled": (RunQuery(status="cancelled", limit=51), 51),
    "cancelled, oldest": (RunQuery(status="cancelled", order="oldest", limit=51), 51),
    "cancelled and version": (RunQuery(status="cancelled", version="v", limit=51), 51),
    "cancelled and version, oldest": (RunQuery(status="cancelled", version="v",
                                               order="oldest", limit=51), 51),
    "cancelled and version, none": (RunQuery(status="cancelled", version="v2", limit=51), 0),
    "completed": (RunQuery(status="completed", limit=51), 51),
    "completed, oldest": (RunQuery(status="completed", order="oldest", limit=51), 51),
    "an agent": (RunQuery(agent="a", limit=51), 51),
    "an agent, oldest": (RunQuery(agent="a", order="oldest", limit=51), 51),
    "an agent, none": (RunQuery(agent="b", limit=51), 0),
    "an agent and version, none": (RunQuery(agent="a", version="v2", limit=51), 0),
    "an agent, completed": (RunQuery(agent="a", status="completed", limit=51), 51),
    "a version": (RunQuery(version="v", limit=51), 51),
    "a version, oldest": (RunQuery(version="v", order="oldest", limit=51), 51),
    "a version, none": (RunQuery(version="v2", limit=51), 0),
}


def _scans(node: dict[str, Any]) -> list[tuple[str, str]]:
    here = ([(node["Node Type"], node.get("Index Name") or node.get("Relation Name", ""))]
            if "Scan" in node["Node Type"] else [])
    return here + [s for child in node.get("Plans", []) for s in _scans(child)]


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node] + [n for child in node.get("Plans", []) for n in _nodes(child)]


def _read(node: dict[str, Any]) -> int:
    """Rows the plan's scans produced, plus those their filters threw away."""
    here = 0
    if "Scan" in node["Node Type"] and node["Node Type"] != "Subquery Scan":  # a table's
        here = node["Actual Rows"] * node.get("Actual Loops", 1) + sum(
            v for k, v in node.items() if k.startswith("Rows Removed by"))
    return here + sum(_read(child) for child in node.get("Plans", []))


# The scans of each plan, in order; a tuple: any one of them. The newest and oldest of all
# runs, an agent's and a version's walk run_keys (migration 0018) and read each run by
# primary key.
KEYS = ["run_keys_created", "runs_pkey"]
AGENT_KEYS = ["run_keys_agent", "runs_pkey"]
VERSION_KEYS = ["run_keys_version", "runs_pkey"]
WANT_PG: dict[str, Any] = {
    "first page": KEYS, "oldest": KEYS, "a time range": KEYS, "a time range, oldest": KEYS,
    "a rare prefix": "runs_pkey", "a prefix, oldest": "runs_pkey",
    "a prefix, updated": "runs_pkey",
    "children": "runs_parent", "a status": "runs_failed",
    "a status, oldest": "runs_failed", "a status and version": "runs_failed",
    "a status and version, none": "runs_failed",
    "children, oldest": "runs_parent", "children, updated": "runs_parent",
    "a status and version, oldest": "runs_failed", "cancelled": "runs_cancelled",
    "cancelled, oldest": "runs_cancelled", "cancelled and version": "runs_cancelled",
    "cancelled and version, oldest": "runs_cancelled",
    "cancelled and version, none": "runs_cancelled",
    "completed": "runs_completed", "completed, oldest": "runs_completed",
    "an agent": AGENT_KEYS, "an agent, oldest": AGENT_KEYS,
    "an agent, none": AGENT_KEYS, "an agent, completed": AGENT_KEYS,
    "an agent and version, none": (AGENT_KEYS, VERSION_KEYS),  # an empty range either way
    "a version": VERSION_KEYS, "a version, oldest": VERSION_KEYS,
    "a version, none": VERSION_KEYS}


def _wanted(want: Any) -> list[list[str]]:
    """WANT_PG's entry as the scan lists it allows."""
    alternatives = want if isinstance(want, tuple) else (want,)
    return [w if isinstance(w, list) else [w] for w in alternatives]


@pytest.mark.postgres
def test_postgres_pages_read_an_index_range(pg_url: str) -> None:
    q = queries("postgres")
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute(INSERT_PG, (RUNS, RUNS))
        (ordered,), = pg.execute(q["code_point_order"].encode()).fetchall()
        assert ordered, "the test database orders text by code point (C.UTF-8)"
        for analyzed in (False, True):
            if analyzed:
                pg.execute(b"ANALYZE runs, run_keys")
            for what, (listing, rows) in CASES.items():
                name, params = listing.plan(code_point_order=True)
                (plan,), = pg.execute(("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                       + q[name]).encode(), params).fetchall()
                root = plan[0]["Plan"]
                assert root["Actual Rows"] == rows, (what, analyzed)
                if what.startswith("a time range"):  # the range's own pages, not a walk to it
                    keys = [n for n in _nodes(root) if n.get("Index Name") == "run_keys_created"]
                    assert keys and all(n["Shared Hit Blocks"] + n.get("Shared Read Blocks", 0)
                                        <= 10 for n in keys), (what, analyzed, keys)
                scans = _scans(root)
                assert "Seq Scan" not in {s[0] for s in scans}, (what, analyzed, scans)
                if analyzed:  # unanalyzed, the planner may walk all of runs_created's entries
                    assert [s[1] for s in scans] in _wanted(WANT_PG[what]), (what, scans)
                    # A prefix's range holds at most 100 runs here (r0123xx).
                    assert _read(root) <= 200, (what, _read(root))
                if what.endswith(", none"):  # the version is checked in the index: no row read
                    assert _read(root) == 0, _read(root)


WANT_SQLITE = {
    "first page": "SEARCH runs USING INDEX runs_created (created_at>? AND created_at<?)",
    "oldest": "SEARCH runs USING INDEX runs_created (created_at>? AND created_at<?)",
    "a time range": "SEARCH runs USING INDEX runs_created (created_at>? AND created_at<?)",
    "a time range, oldest": "SEARCH runs USING INDEX runs_created (created_at>? AND "
                            "created_at<?)",
    "a rare prefix": "SEARCH runs USING INDEX sqlite_autoindex_runs_1 (thread_id>? AND "
                     "thread_id<?)",
    "a prefix, oldest": "SEARCH runs USING INDEX sqlite_autoindex_runs_1 (thread_id>? AND "
                        "thread_id<?)",
    "a prefix, updated": "SEARCH runs USING INDEX sqlite_autoindex_runs_1 (thread_id>? AND "
                         "thread_id<?)",
    "children": "SEARCH runs USING INDEX runs_parent (parent_thread_id=?)",
    "a status": "SEARCH runs USING INDEX runs_failed (created_at>? AND created_at<?)",
    "a status, oldest": "SEARCH runs USING INDEX runs_failed (created_at>? AND created_at<?)",
    "a status and version": "SEARCH runs USING INDEX runs_failed (created_at>? AND "
                            "created_at<?)",
    "a status and version, none": "SEARCH runs USING INDEX runs_failed (created_at>? AND "
                                  "created_at<?)",
    "children, oldest": "SEARCH runs USING INDEX runs_parent (parent_thread_id=?)",
    "children, updated": "SEARCH runs USING INDEX runs_parent (parent_thread_id=?)",
    "a status and version, oldest": "SEARCH runs USING INDEX runs_failed (created_at>? AND "
                                    "created_at<?)",
    "completed": "SEARCH runs USING INDEX runs_completed (created_at>? AND created_at<?)",
    "completed, oldest": "SEARCH runs USING INDEX runs_completed (created_at>? AND "
                         "created_at<?)",
    **{what: "SEARCH runs USING INDEX runs_agent (agent=? AND created_at>? AND created_at<?)"
       for what in ("an agent", "an agent, oldest", "an agent, none",
                    "an agent and version, none", "an agent, completed")},
    **{what: "SEARCH runs USING INDEX runs_version (version=? AND created_at>? AND "
             "created_at<?)" for what in ("a version", "a version, oldest", "a version, none")},
    **{what: "SEARCH runs USING INDEX runs_cancelled (created_at>? AND created_at<?)"
       for what in ("cancelled", "cancelled, oldest", "cancelled and version",
                    "cancelled and version, oldest", "cancelled and version, none")},
}


def test_sqlite_pages_read_an_index_range(sqlite_template: Path, tmp_path: Path) -> None:
    path = tmp_path / "listing.db"
    shutil.copyfile(sqlite_template, path)
    q = queries("sqlite")
    with closing(sqlite3.connect(path)) as db:
        db.execute(INSERT_SQLITE, (RUNS, RUNS))
        db.commit()
        for analyzed in (False, True):
            if analyzed:
                db.execute("ANALYZE")
            for what, (listing, rows) in CASES.items():
                name, params = listing.plan(code_point_order=True)
                plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + q[name], params)]
                assert plan[0] == WANT_SQLITE[what], (what, analyzed, plan)
                assert not [p for p in plan if p.startswith("SCAN runs") and "INDEX" not in p]
                assert len(db.execute(q[name], params).fetchall()) == rows, what


# The mail a run sent (the dashboard's "Sent"): an index range of mailbox_sender, not a read of
# every message. 20,000 messages from 200 senders.
MAIL_SQLITE = """
    WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 20000 - 1)
    INSERT INTO mailbox (thread_id, sender, message, created_at)
    SELECT 'to', printf('s%03d', i % 200), x'7b7d', i FROM n"""
MAIL_PG = b"""
    INSERT INTO mailbox (thread_id, sender, message, created_at)
    SELECT 'to', 's' || lpad((i % 200)::text, 3, '0'), '\\x7b7d'::bytea, i
    FROM generate_series(0, 20000 - 1) i"""


@pytest.mark.postgres
def test_postgres_sent_mail_reads_mailbox_sender(pg_url: str) -> None:
    q = queries("postgres")
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute(MAIL_PG)
        pg.execute(b"ANALYZE mailbox")
        (plan,), = pg.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " + q["sent_mail"]).encode(),
                              {"sender": "s007", "limit": 10}).fetchall()
        root = plan[0]["Plan"]
        assert root["Actual Rows"] == 10
        assert [s[1] for s in _scans(root)] == ["mailbox_sender"], _scans(root)
        assert _read(root) <= 10


def test_sqlite_sent_mail_reads_mailbox_sender(sqlite_template: Path, tmp_path: Path) -> None:
    path = tmp_path / "mail.db"
    shutil.copyfile(sqlite_template, path)
    with closing(sqlite3.connect(path)) as db:
        db.execute(MAIL_SQLITE)
        db.commit()
        params = {"sender": "s007", "limit": 10}
        q = queries("sqlite")["sent_mail"]
        plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + q, params)]
        assert plan == ["SEARCH mailbox USING INDEX mailbox_sender (sender=?)"], plan
        assert len(db.execute(q, params).fetchall()) == 10


# The latest-updated list (migrations 0012, 0017): the running runs from runs_open (per
# version), a page of each resting status down runs_idle, the finished ones down
# runs_finished, never a read and sort of every run. The runs above, every 100th (25th) of
# them running again, every 100th (60th) waiting and every 100th (61st) sleeping, each
# updated after every other run.
OPEN = "runs_open"  # or, on Postgres, another partial index of open runs only
OPEN_INDEXES = ("runs_open", "runs_expiry", "runs_claimable")  # runs_expiry: only running
ALL_PARTS = {OPEN, "runs_idle", "runs_finished"}
UPDATED = {  # listing -> (rows, the indexes read, at most how many rows read)
    "updated": (RunQuery(order="updated", limit=51), ALL_PARTS, 200 + 3 * 60 + 60 + 20),
    "updated, running": (RunQuery(order="updated", status="running", limit=51), {OPEN},
                         200 + 20),
    "updated, waiting": (RunQuery(order="updated", status="waiting", limit=51), {"runs_idle"},
                         60),
    "updated, sleeping, a page on": (RunQuery(order="updated", status="sleeping", limit=51,
                                              before=(85000.0 + 1000 + RUNS / 2, "")),
                                     {"runs_idle"}, 60),
    "updated, completed": (RunQuery(order="updated", status="completed", limit=51),
                           {"runs_finished"}, 60),
    "updated, a page on": (RunQuery(order="updated", limit=51, before=(5000.0 + RUNS / 2, "")),
                           ALL_PARTS, 200 + 3 * 60 + 60 + 20),
}
REOPEN = ("UPDATE runs SET status = 'running', updated_at = 90000 + created_at "
          "WHERE CAST(created_at AS INTEGER) % 100 = 25")
REST = ("UPDATE runs SET status = CASE CAST(created_at AS INTEGER) % 100 WHEN 60 THEN "
        "'waiting' ELSE 'sleeping' END, updated_at = CASE CAST(created_at AS INTEGER) % 100 "
        "WHEN 60 THEN 80000 ELSE 85000 END + created_at "
        "WHERE CAST(created_at AS INTEGER) % 100 IN (60, 61)")
# On SQLite, as the store's statements do: idle_at and finished_at set with the status
# (Postgres computes them).
RESTING = ", idle_at = {idle}, finished_at = NULL WHERE"
REOPEN_SQLITE = REOPEN.replace(" WHERE", RESTING.format(idle="NULL"), 1)
REST_SQLITE = REST.replace(" WHERE", RESTING.format(  # (SET reads the row as it was)
    idle="CASE CAST(created_at AS INTEGER) % 100 WHEN 60 THEN 80000 ELSE 85000 END + created_at"), 1)


@pytest.mark.postgres
def test_postgres_latest_updated_reads_each_part_apart(pg_url: str) -> None:
    q = queries("postgres")
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute(INSERT_PG, (RUNS, RUNS))
        pg.execute(REOPEN.encode())
        pg.execute(REST.encode())
        every = pg.execute(b"SELECT thread_id, updated_at, status FROM runs").fetchall()
        for analyzed in (False, True):
            if analyzed:
                pg.execute(b"ANALYZE runs, run_keys")
            for what, (listing, indexes, most) in UPDATED.items():
                name, params = listing.plan(code_point_order=True)
                got = [r[0] for r in pg.execute(q[name].encode(), params).fetchall()]
                assert got == _want(every, listing), what
                (plan,), = pg.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " + q[name]).encode(),
                                      params).fetchall()
                root = plan[0]["Plan"]
                scans = _scans(root)
                # Unanalyzed, the planner may read every finished run for the finished part
                # (a scan of runs; before migration 0018, a bitmap of all of runs_created):
                # the same rows either way. Analyzed, it reads each part's index.
                if analyzed:
                    assert "Seq Scan" not in {s[0] for s in scans}, (what, analyzed, scans)
                    used = {s[1] for s in scans if s[1] not in ("", "runs")}
                    assert {OPEN if i in OPEN_INDEXES else i for i in used} == indexes, (
                        what, scans)
                    assert _read(root) <= most, (what, _read(root))


def _want(every: list[tuple[str, float, str]], listing: RunQuery) -> list[str]:
    """The listing worked out from every run's (thread_id, updated_at, status)."""
    cur = listing.before or (float("inf"), "")
    keep = [(u, t) for t, u, s in every if (u, t) < cur
            and (listing.status is None or s == listing.status)]
    return [t for _, t in sorted(keep, reverse=True)[: listing.limit]]


def test_sqlite_latest_updated_reads_each_part_apart(sqlite_template: Path,
                                                     tmp_path: Path) -> None:
    path = tmp_path / "updated.db"
    shutil.copyfile(sqlite_template, path)
    q = queries("sqlite")
    with closing(sqlite3.connect(path)) as db:
        db.execute(INSERT_SQLITE, (RUNS, RUNS))
        db.execute(REOPEN_SQLITE)
        db.execute(REST_SQLITE)
        db.commit()
        every = db.execute("SELECT thread_id, updated_at, status FROM runs").fetchall()
        for analyzed in (False, True):
            if analyzed:
                db.execute("ANALYZE")
            for what, (listing, indexes, _) in UPDATED.items():
                name, params = listing.plan(code_point_order=True)
                got = [r[0] for r in db.execute(q[name], params)]
                assert got == _want(every, listing), (what, analyzed)
                plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + q[name], params)]
                used = [p for p in plan if p.startswith(("SCAN runs", "SEARCH runs"))]
                assert {next((i for i in indexes if i in p), p) for p in used} == indexes, (
                    what, plan)
                # The walk of the versions reads the first entry of runs_open.
                assert all("INDEX" in p for p in plan if p.startswith("SCAN runs")), plan


# An open status in created order (migration 0016): per version, a range of runs_open past
# the cursor, a page each, merged; never every parked run. 20,000 open runs over two versions
# beside the finished ones above: all waiting but every 100th queued, created in batches of
# 1,000 sharing one created_at (start_many's), older than the finished runs.
PARKED = 20_000
INSERT_OPEN = """
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash, epoch,
                      attempt, created_at, updated_at, waiting_for)
    SELECT {id}, 'a', CASE WHEN i % 3 = 0 THEN 'v2' ELSE 'v' END,
           CASE WHEN i % 100 = 7 THEN 'queued' ELSE 'waiting' END, 'n', '{{}}', 'h', 1, 1,
           {batch}, 900, 'mail' FROM {series}"""
OPEN_PG = INSERT_OPEN.format(id="'w' || lpad(i::text, 6, '0')", batch="(i / 1000) * 0.01",
                             series=f"generate_series(0, {PARKED} - 1) i")
OPEN_SQLITE = (f"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < "
               f"{PARKED} - 1)" + INSERT_OPEN.format(id="printf('w%06d', i)",
                                                     batch="(i / 1000) * 0.01", series="n"))
OPEN_CASES = {  # listing -> at most how many index entries and rows it reads
    "waiting": (RunQuery(status="waiting", limit=51), 4 * 51 + 20),
    "waiting, oldest": (RunQuery(status="waiting", order="oldest", limit=51), 4 * 51 + 20),
    "waiting, a page on": (RunQuery(status="waiting", limit=51, before=(0.1, "w010500")),
                           4 * 51 + 20),
    "queued": (RunQuery(status="queued", limit=51), 4 * 51 + 20),
    "waiting, a version": (RunQuery(status="waiting", version="v2", limit=51), 4 * 51 + 20),
    "waiting, another agent": (RunQuery(status="waiting", agent="b", limit=51), PARKED),
}


def _want_open(every: list[tuple[str, str, float, str, str]], listing: RunQuery) -> list[str]:
    """The listing worked out from every run's (thread_id, status, created_at, version,
    agent)."""
    down = listing.order != "oldest"
    keep = sorted(((c, t) for t, s, c, v, a in every if s == listing.status
                   and (listing.version is None or v == listing.version)
                   and (listing.agent is None or a == listing.agent)
                   and (listing.before is None
                        or ((c, t) < listing.before if down else (c, t) > listing.before))),
                  reverse=down)
    return [t for _, t in keep[: listing.limit]]


@pytest.mark.postgres
def test_postgres_open_status_pages_read_a_page_per_version(pg_url: str) -> None:
    q = queries("postgres")
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute(INSERT_PG, (RUNS, RUNS))
        pg.execute(OPEN_PG.encode())
        every = pg.execute(b"SELECT thread_id, status, created_at, version, agent "
                           b"FROM runs").fetchall()
        pg.execute(b"SET enable_sort = off")  # as the store reads a page (read_by_index)
        pg.execute(b"SET enable_seqscan = off")
        for analyzed in (False, True):
            if analyzed:
                pg.execute(b"ANALYZE runs, run_keys")
            for what, (listing, most) in OPEN_CASES.items():
                name, params = listing.plan(code_point_order=True)
                assert name.endswith("_open"), name
                got = [r[0] for r in pg.execute(q[name].encode(), params).fetchall()]
                assert got == _want_open(every, listing), (what, analyzed)
                (plan,), = pg.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " + q[name]).encode(),
                                      params).fetchall()
                scans = _scans(plan[0]["Plan"])
                # An agent's range (runs_agent) is as good a read of an agent's open runs.
                allowed = {"runs_open", ""} | ({"runs_agent"} if listing.agent else set())
                assert {s[1] for s in scans} <= allowed, (what, analyzed, scans)
                assert _read(plan[0]["Plan"]) <= most, (what, analyzed, _read(plan[0]["Plan"]))


def test_sqlite_open_status_pages_read_a_page_per_version(sqlite_template: Path,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "open.db"
    shutil.copyfile(sqlite_template, path)
    q = queries("sqlite")
    with closing(sqlite3.connect(path)) as db:
        db.execute(INSERT_SQLITE, (RUNS, RUNS))
        db.execute(OPEN_SQLITE)
        db.commit()
        every = db.execute("SELECT thread_id, status, created_at, version, agent "
                           "FROM runs").fetchall()
        for analyzed in (False, True):
            if analyzed:
                db.execute("ANALYZE")
            for what, (listing, _) in OPEN_CASES.items():
                name, params = listing.plan(code_point_order=True)
                got = [r[0] for r in db.execute(q[name], params)]
                assert got == _want_open(every, listing), (what, analyzed)
                plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + q[name], params)]
                reads = [p for p in plan if p.startswith(("SCAN runs", "SEARCH runs"))]
                assert reads and all("runs_open" in p or "INTEGER PRIMARY KEY" in p
                                     for p in reads), (what, plan)
                assert not [p for p in plan if "TEMP B-TREE" in p and "runs_open" in p], plan


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_the_cases_run_every_listing_query(dialect: str) -> None:
    """Each list_runs_* query has its plan pinned above: a new variant needs a case."""
    run = {listing.plan(code_point_order=True)[0]
           for listing, _ in CASES.values()} | {
        listing.plan(code_point_order=True)[0] for listing, _, _ in UPDATED.values()} | {
        listing.plan(code_point_order=True)[0] for listing, _ in OPEN_CASES.values()}
    assert run == {name for name in queries(dialect) if name.startswith("list_runs_")}


# Effects shown to a person (migration 0017): the dead ones of every run from outbox_dead,
# the pending and running ones from outbox_live, and the capped counts of each the same way;
# never a read of every done effect. 20,000 effects: 4 dead, 5 pending, the others done.
EFFECTS = """
    INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at,
                        created_at)
    SELECT {id}, 'k', 1, 0, 'charge', x'7b7d',
           CASE WHEN i % 5000 = 7 THEN 'dead' WHEN i % 4000 = 9 THEN 'pending' ELSE 'done' END,
           0, i FROM {series}"""
EFFECTS_PG = EFFECTS.format(id="'e' || i", series="generate_series(0, 20000 - 1) i").replace(
    "x'7b7d'", "'\\x7b7d'::bytea")
EFFECTS_SQLITE = ("WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < "
                  "20000 - 1)" + EFFECTS.format(id="'e' || i", series="n"))
EFFECT_READS = {  # query -> (its parameters, rows it returns)
    "dead": ("list_effects", {"thread_id": None, "status": "dead", "limit": 500}, 4),
    "pending": ("list_effects", {"thread_id": None, "status": "pending", "limit": 500}, 5),
    "counts": ("status_counts_capped", {"cap": 10000, "versions": []}, 2),
}


@pytest.mark.postgres
def test_postgres_effects_shown_read_their_own_index(pg_url: str) -> None:
    q = queries("postgres")
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute(EFFECTS_PG.encode())
        for analyzed in (False, True):
            if analyzed:
                pg.execute(b"ANALYZE outbox")
            for what, (name, params, rows) in EFFECT_READS.items():
                (plan,), = pg.execute(("EXPLAIN (ANALYZE, FORMAT JSON) " + q[name]).encode(),
                                      params).fetchall()
                root = plan[0]["Plan"]
                assert root["Actual Rows"] == rows, (what, analyzed)
                scans = _scans(root)
                assert ("Seq Scan", "outbox") not in scans, (what, analyzed, scans)
                assert _read(root) <= 50, (what, analyzed, _read(root), scans)  # of 20,000


def test_sqlite_effects_shown_read_their_own_index(sqlite_template: Path,
                                                    tmp_path: Path) -> None:
    path = tmp_path / "effects.db"
    shutil.copyfile(sqlite_template, path)
    q = queries("sqlite")
    with closing(sqlite3.connect(path)) as db:
        db.execute(EFFECTS_SQLITE)
        db.commit()
        for analyzed in (False, True):
            if analyzed:
                db.execute("ANALYZE")
            for what, (name, params, rows) in EFFECT_READS.items():
                assert len(db.execute(q[name], params).fetchall()) == rows, what
                plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + q[name], params)]
                reads = [p for p in plan if p.startswith(("SCAN outbox", "SEARCH outbox"))]
                # The one bare scan is list_effects' last branch, for a run or any status:
                # it runs only when neither of the first two does.
                bare = [p for p in reads if "INDEX" not in p]
                assert len(bare) == (1 if name == "list_effects" else 0), (what, plan)
                assert any("outbox_dead" in p for p in reads), (what, plan)
