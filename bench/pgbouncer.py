"""Postgres through PgBouncer against Postgres directly, in one run: a workload run alternately
on the server itself and through a PgBouncer of its own in front of it (Debian's pgbouncer,
transaction pooling, `?pool_mode=transaction&listen_url=` as docs/howto-ha.md says: LISTEN on
the server directly), each run in a fresh process, the order alternating, as bench/pairs.py
does for two checkouts.

    python -m bench.pgbouncer                          # W2 postgres 10000 queued, 3 pairs
    python -m bench.pgbouncer --pairs 5 W1 postgres
    python -m bench.pgbouncer --pool-size 20 W2 postgres 1000

Prints each run's figures, then the medians per side and the median of the pairs' own
ratios (through / direct). The PgBouncer runs as the `postgres` OS user on a port of its own,
with `default_pool_size` server connections (10 by default) for the workload's database.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "tests"))  # the tests' PgBouncer harness (tests/apps/pgbouncer.py)



def run_once(args: list[str], via: str | None) -> dict[str, float]:
    env = {**os.environ}
    env.pop("BENCH_PG_VIA", None)
    if via is not None:
        env["BENCH_PG_VIA"] = via
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "bench.workloads", *args], cwd=HERE, env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench.workloads {' '.join(args)} failed "
                         f"({'through PgBouncer' if via else 'direct'}):\n{out.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    metrics: dict[str, float] = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            metrics[row["metric"]] = float(row["value"])
    metrics["process_cpu_s"] = round((after.ru_utime - before.ru_utime)
                                     + (after.ru_stime - before.ru_stime), 3)
    return metrics


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pgbouncer")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--pool-size", type=int, default=10,
                        help="PgBouncer's server connections for the database (default 10)")
    parser.add_argument("workload", nargs="*", default=["W2", "postgres", "10000", "queued"],
                        help="bench.workloads arguments (default: W2 postgres 10000 queued)")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.pool_size < 1:
        parser.error("--pairs and --pool-size must be at least 1")
    if len(args.workload) < 2 or args.workload[1] != "postgres":
        parser.error("the workload must be a Postgres one, e.g. W2 postgres 10000 queued")
    from apps.pgbouncer import PgBouncer, available

    missing = available()
    if missing is not None:
        raise SystemExit(f"bench.pgbouncer: {missing}")
    from tether.bench.common import pg_admin_url

    server = pg_admin_url().split("?", 1)[0]
    host_port = server.split("@", 1)[-1].split("/", 1)[0]
    host, _, port = host_port.partition(":")
    load0 = os.getloadavg()
    rows: dict[str, list[dict[str, float]]] = {"direct": [], "pgbouncer": []}
    with PgBouncer(host or "127.0.0.1", int(port or 5432), pool_size=args.pool_size) as bouncer:
        via = (f"postgresql://postgres@127.0.0.1:{bouncer.listen_port}/{{db}}"
               "?sslmode=disable&pool_mode=transaction&listen_url={listen}")
        for i in range(args.pairs):
            order = ("direct", "pgbouncer") if i % 2 == 0 else ("pgbouncer", "direct")
            for side in order:
                m = run_once(args.workload, via if side == "pgbouncer" else None)
                rows[side].append(m)
                shown = " ".join(f"{k}={v:g}" for k, v in m.items())
                print(f"pair {i + 1} {side:9} {shown} load={os.getloadavg()[0]:.2f}",
                      flush=True)
    load1 = os.getloadavg()
    print(f"\n{' '.join(args.workload)}: direct against through PgBouncer (transaction pooling, "
          f"{args.pool_size} server connections), medians of {args.pairs} pairs (load average "
          f"{load0[0]:.2f} at start, {load1[0]:.2f} at end, {os.cpu_count()} CPUs)")
    print("| metric | direct | through PgBouncer | ratio of medians | median pair ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name in rows["direct"][0]:
        d = statistics.median(m[name] for m in rows["direct"])
        b = statistics.median(m[name] for m in rows["pgbouncer"])
        pairs = [p[name] / q[name] for p, q in zip(rows["pgbouncer"], rows["direct"], strict=True)
                 if q[name]]
        ratio = f"{b / d:.3f}" if d else "-"
        print(f"| {name} | {d:g} | {b:g} | {ratio} | "
              f"{statistics.median(pairs):.3f} |" if pairs else f"| {name} | {d:g} | {b:g} | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
