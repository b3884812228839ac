"""L: the physical limits of the same disk and database, the reference for W1's ratios.
Raw drivers, no tether: 256-byte rows into a table keyed like `checkpoints`."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time

from .common import Result, bench_db, libpq_url, peak_rss_mib, sqlite_path

W1_MSG_BYTES = 256

PAYLOAD = b"x" * W1_MSG_BYTES
BATCH = 100


def _rate(rows: int, seconds: float) -> float:
    return round(rows / seconds, 1)


def sqlite_raw(path: str, synchronous: str, batch: int, seconds: float,
               table: str | None = None) -> float:
    """Rows/s of INSERT + COMMIT into a WAL database, `batch` rows per commit, for about
    `seconds` seconds."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    table = table or f"raw_{synchronous.lower()}_{batch}"
    conn.execute(f"CREATE TABLE {table} (thread_id TEXT NOT NULL, step INTEGER NOT NULL, "
                 "data BLOB NOT NULL, PRIMARY KEY (thread_id, step)) WITHOUT ROWID")
    q = f"INSERT INTO {table} VALUES (?, ?, ?)"
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        conn.execute("BEGIN IMMEDIATE")
        for _ in range(batch):
            conn.execute(q, ("t", n, PAYLOAD))
            n += 1
        conn.execute("COMMIT")
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - t0
    conn.close()
    return _rate(n, elapsed)


def pg_raw(url: str, connections: int, batch: int, seconds: float,
           table: str | None = None, drop: bool = False) -> float:
    """Rows/s of INSERT + COMMIT via psycopg, `batch` rows per commit (single rows in
    autocommit, batches in one transaction with executemany), one thread per connection."""
    import psycopg  # only on Postgres: the core install has no driver for it

    table = table or f"raw_{connections}_{batch}"
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (thread_id TEXT NOT NULL, step INTEGER NOT NULL, "
                     "data BYTEA NOT NULL, PRIMARY KEY (thread_id, step))".encode())
    q = f"INSERT INTO {table} VALUES (%s, %s, %s)".encode()
    conns = [psycopg.connect(libpq_url(url), autocommit=True) for _ in range(connections)]
    counts = [0] * connections
    barrier = threading.Barrier(connections + 1)
    deadline = [0.0]

    def insert(i: int) -> None:
        conn, key, n = conns[i], f"t{i}", 0
        cur = conn.cursor()
        cur.execute(q, (key, -1, PAYLOAD))  # prepare outside the clock
        barrier.wait()
        while True:
            if batch == 1:
                cur.execute(q, (key, n, PAYLOAD))
            else:
                with conn.transaction():
                    cur.executemany(q, [(key, n + j, PAYLOAD) for j in range(batch)])
            n += batch
            if time.perf_counter() >= deadline[0]:
                break
        counts[i] = n

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    deadline[0] = t0 + seconds
    barrier.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    for c in conns:
        c.close()
    if drop:
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}".encode())
    return _rate(sum(counts), elapsed)


async def raw_commit_probe(url: str, name: str, seconds: float = 1.0) -> float:
    """Single-row INSERT + COMMIT rate on the same storage as the workload, right now: the
    disk's fsync rate drifts, so W1 is also compared with a probe taken around it. On
    SQLite it is a separate file beside the database (WAL, synchronous=FULL); on Postgres a
    table in the same database, dropped afterwards."""
    if url.startswith("sqlite"):
        path = os.path.join(os.path.dirname(sqlite_path(url)), f"{name}.db")
        return await asyncio.to_thread(sqlite_raw, path, "FULL", 1, seconds, "probe")
    return await asyncio.to_thread(pg_raw, url, 1, 1, seconds, name, True)


async def limits(backend: str, seconds: float) -> list[Result]:
    out: list[Result] = []
    async with bench_db(backend) as url:
        if backend == "sqlite":
            path = sqlite_path(url)
            for sync in ("NORMAL", "FULL"):
                for batch, label in ((1, "single"), (BATCH, "batch100")):
                    rate = await asyncio.to_thread(sqlite_raw, path, sync, batch, seconds)
                    out.append(Result(backend, "L", f"{label}_{sync.lower()}_rows_per_s", rate,
                                      "1/s"))
        else:
            for connections in (1, 16):
                for batch, label in ((1, "single"), (BATCH, "batch100")):
                    rate = await asyncio.to_thread(pg_raw, url, connections, batch, seconds)
                    out.append(Result(backend, "L", f"{label}_{connections}conn_rows_per_s",
                                      rate, "1/s"))
    out.append(Result(backend, "L", "peak_rss_mib", round(peak_rss_mib(), 1), "MiB"))
    return out


class RawCommits:
    """W1's reference, taken in the same run, interleaved with it: single-row INSERT + COMMIT
    through the plain driver (sqlite3 or psycopg), on the same storage (SQLite: a file beside
    the workload's database, WAL, synchronous=FULL; Postgres: a table in the same database,
    autocommit), with rows of the size W1's checkpoint rows have. `commit(n)` makes n more
    commits; `rate` is commits/s over all of them."""

    def __init__(self, url: str, row_bytes: int) -> None:
        self.commits, self.seconds = 0, 0.0
        self._payload = b"x" * max(1, row_bytes)
        ddl = ("CREATE TABLE w1_raw (thread_id TEXT NOT NULL, step INTEGER NOT NULL, data {} "
               "NOT NULL, PRIMARY KEY (thread_id, step))")
        if url.startswith("sqlite"):
            self._path = os.path.join(os.path.dirname(sqlite_path(url)), "w1_raw.db")
            self._lite: sqlite3.Connection | None = sqlite3.connect(
                self._path, isolation_level=None, check_same_thread=False)  # commit() on a thread
            self._lite.execute("PRAGMA journal_mode=WAL")
            self._lite.execute("PRAGMA synchronous=FULL")
            self._lite.execute(ddl.format("BLOB") + " WITHOUT ROWID")
            self._pg = None
        else:
            import psycopg  # only on Postgres: the core install has no driver for it

            self._lite = None
            self._pg = psycopg.connect(libpq_url(url), autocommit=True)
            self._pg.execute(ddl.format("BYTEA").encode())
            self._pg.execute(b"INSERT INTO w1_raw VALUES ('prepare', -1, '')")  # outside the clock

    def commit(self, n: int) -> None:
        """n commits of one row each, timed."""
        key, first, payload = "t", self.commits, self._payload
        t0 = time.perf_counter()
        if self._lite is not None:
            conn = self._lite
            for i in range(first, first + n):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO w1_raw VALUES (?, ?, ?)", (key, i, payload))
                conn.execute("COMMIT")
        else:
            assert self._pg is not None
            cur = self._pg.cursor()
            for i in range(first, first + n):
                cur.execute(b"INSERT INTO w1_raw VALUES (%s, %s, %s)", (key, i, payload))
        self.seconds += time.perf_counter() - t0
        self.commits += n

    @property
    def rate(self) -> float:
        return _rate(self.commits, self.seconds) if self.seconds else 0.0

    def close(self) -> None:
        """Close the connection and drop what the reference wrote (it is not W1's bytes)."""
        if self._lite is not None:
            self._lite.close()
            for p in (self._path, self._path + "-wal", self._path + "-shm"):
                if os.path.exists(p):
                    os.remove(p)
        if self._pg is not None:
            self._pg.execute(b"DROP TABLE w1_raw")
            self._pg.close()
