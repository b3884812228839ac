"""Profile Postgres prune batches statement by statement: the time, buffers and WAL of each
statement the pruner sends (EXPLAIN (ANALYZE, BUFFERS, WAL) of the real queries, one
transaction per batch, committed: the runs are removed for real, so run it on a copy).

    createdb -h 127.0.0.1 -U postgres -T tether_prune_fill_1000000x10_<hash> prof   # a copy
    python -m bench.prune_profile postgresql://postgres@127.0.0.1:5432/prof 20 [--batch 1000]

(`python -m bench.prune --reuse-fill` keeps the fill it copies from.) Prints per statement
the mean per batch; bench/results/prune.md has its figures before and after the pruner's
walk moved to creation order.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import psycopg

from tether.store.migrate import queries
from tether.store.pg_retention import TABLES

KEYS = ("Shared Hit Blocks", "Shared Read Blocks", "Shared Dirtied Blocks",
        "Shared Written Blocks", "WAL Records", "WAL FPI", "WAL Bytes")


def main(url: str, batches: int, size: int) -> None:
    q = queries("postgres")
    agg: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def explain(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        row = conn.execute(b"EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) "
                           + q[name].encode(), params).fetchone()
        a = agg[name]
        a["n"] += 1
        a["ms"] += (time.perf_counter() - t0) * 1000
        top = row[0][0]["Plan"] if row else {}
        for k in KEYS:
            a[k] += top.get(k, 0)

    def scalar(conn: psycopg.Connection[Any], sql: bytes, *args: Any) -> Any:
        row = conn.execute(sql, args or None).fetchone()
        return row[0] if row else None

    with psycopg.connect(url, autocommit=True) as conn:
        now = float(scalar(conn, b"SELECT extract(epoch FROM clock_timestamp())::float8"))
        cut = {"completed": now - 30 * 86400, "failed": None, "cancelled": None, "agent": None}
        lsn0 = scalar(conn, b"SELECT pg_current_wal_lsn()")
        checkpoints = b"SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        ck0 = scalar(conn, checkpoints)
        after_at, after = float("-inf"), ""
        t_all = time.perf_counter()
        for _ in range(batches):
            t0 = time.perf_counter()
            rows = conn.execute(q["prune_candidates"].encode(), {
                **cut, "after_at": after_at, "after": after, "horizon": cut["completed"],
                "limit": size}).fetchall()
            agg["prune_candidates"]["n"] += 1
            agg["prune_candidates"]["ms"] += (time.perf_counter() - t0) * 1000
            if not rows:
                break
            after, after_at = rows[-1][0], rows[-1][1]
            ids = [r[0] for r in rows]
            conn.execute(b"BEGIN")
            explain(conn, "prune_mark", {**cut, "ids": ids})
            for t in TABLES:
                explain(conn, f"prune_{t}", {"ids": ids})
            t0 = time.perf_counter()
            conn.execute(b"COMMIT")
            agg["commit"]["n"] += 1
            agg["commit"]["ms"] += (time.perf_counter() - t0) * 1000
        total = time.perf_counter() - t_all
        wal = float(scalar(conn, b"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", lsn0))
        ck = scalar(conn, checkpoints) - ck0
    print(f"{batches} batches of {size} in {total:.1f} s; WAL {wal / 1e6:,.0f} MB (the whole "
          f"server's); checkpoints {ck}")
    print(f"{'statement':<20}{'ms':>8}" + "".join(f"{k.removesuffix(' Blocks'):>16}"
                                                 for k in KEYS))
    for name, a in agg.items():
        n = a["n"] or 1
        print(f"{name:<20}{a['ms'] / n:8.1f}" + "".join(f"{a[k] / n:16,.0f}" for k in KEYS))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("batches", type=int)
    p.add_argument("--batch", type=int, default=1000, help="runs a batch")
    a = p.parse_args()
    main(a.url, a.batches, a.batch)
