"""LangGraph's own test suite, with TetherSaver as its checkpointer.

    python -m bench.langgraph_suite                    # both stores, xdist -n 2 when available
    python -m bench.langgraph_suite --store sqlite --reference memory -- -k interrupt

Downloads the sdist of the installed langgraph from the package registry (`pip download
langgraph==<version> --no-deps --no-binary :all:`), unpacks it into a temporary directory,
replaces its tests/conftest.py with bench/langgraph_suite_conftest.py (TetherSaver, sync and
async, as the `sync_checkpointer` / `async_checkpointer` variant; a SQLite file or a Postgres
database per test, copied or cloned from a migrated template) and runs the tests that take a
checkpointer once per checkpointer, then prints: checkpointer, passed, failed, skipped,
by design, retried, seconds. A failure of a test named in TIMING is run again once, alone;
passing then, it counts as "retried", not failed.
The test-only packages LangGraph's tests import (pytest-mock, syrupy, langgraph-checkpoint-sqlite
and aiosqlite) are installed, when this interpreter lacks them, into
the temporary directory, not into the environment. Nothing is left behind (--keep keeps it).
Exit status 1 when a TetherSaver test failed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
CONFTEST = Path(__file__).resolve().parent / "langgraph_suite_conftest.py"
PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
# Tests of LangGraph's own Postgres saver (they build PostgresSaver themselves).
IGNORED = ("tests/test_prune_postgres.py",)
# Tests that assume how long a step takes (one task ends within 10 ms of another, a stream
# chunk 0.2 to 0.3 s after the start) and fail under CPU load with LangGraph's own savers too
# (docs/langgraph.md): one that fails is run again once, alone, and counted as "retried" when
# it passes then. Any other failure stands.
TIMING = ("test_imp_nested", "test_stream_subgraphs_during_execution",
          "test_stream_buffering_single_node")
# langgraph-checkpoint-sqlite: the `cache` fixture's SqliteCache, and `--reference sqlite`.
TEST_DEPS = {"pytest_mock": "pytest-mock", "syrupy": "syrupy",
             "langgraph.checkpoint.sqlite": "langgraph-checkpoint-sqlite",
             "aiosqlite": "aiosqlite"}
LABELS = {"tether-sqlite": "TetherSaver, SQLite", "tether-postgres": "TetherSaver, Postgres",
          "memory": "LangGraph InMemorySaver", "sqlite": "LangGraph SqliteSaver"}


@dataclass
class Result:
    checkpointer: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    by_design: int = 0
    retried: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


def _missing(modules: dict[str, str], extra_path: Path) -> list[str]:
    sys.path.insert(0, str(extra_path))
    try:
        return [pkg for mod, pkg in modules.items() if not _importable(mod)]
    finally:
        sys.path.remove(str(extra_path))


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"],
                   check=True)


def fetch_tests(work: Path) -> Path:
    """The unpacked sdist of the installed langgraph, its tests' conftest replaced by ours."""
    ver = version("langgraph")
    _pip("download", f"langgraph=={ver}", "--no-deps", "--no-binary", ":all:", "-d", str(work))
    archive = work / f"langgraph-{ver}.tar.gz"
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    src = work / f"langgraph-{ver}"
    # The installed langgraph is the one under test, not the sdist's copy of its source.
    shutil.rmtree(src / "langgraph")
    shutil.copyfile(CONFTEST, src / "tests" / "conftest.py")
    return src


def install_missing(deps_dir: Path) -> list[str]:
    missing = _missing(TEST_DEPS, deps_dir)
    if missing:
        print(f"installing into {deps_dir}: {' '.join(missing)}", flush=True)
        _pip("install", "--no-deps", "--target", str(deps_dir), *missing)
    return missing


def _with_db(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


async def _migrate(url: str) -> None:
    if url.startswith("sqlite:"):
        from tether.store.sqlite import SQLiteStore

        store: object = SQLiteStore(url)
    else:
        from tether.store.postgres import PostgresStore

        store = PostgresStore(url)
    await store.open(check_schema=False)  # type: ignore[attr-defined]
    try:
        await store.migrate()  # type: ignore[attr-defined]
    finally:
        await store.close()  # type: ignore[attr-defined]


def _pg_exec(server: str, statement: str, *idents: str) -> list[tuple[object, ...]]:
    import psycopg
    from psycopg import sql

    with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
        cur = conn.execute(sql.SQL(statement).format(*map(sql.Identifier, idents)))
        return cur.fetchall() if cur.description else []


def _empty_tables(url: str) -> list[str]:
    """The template's tables that hold no row: what a used clone is emptied of."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        tables = conn.execute(
            "SELECT schemaname, relname FROM pg_stat_user_tables ORDER BY 1, 2").fetchall()
        return [f"{schema}.{name}" for schema, name in tables if not conn.execute(
            sql.SQL("SELECT EXISTS (SELECT FROM {})").format(sql.Identifier(schema, name))
        ).fetchone()[0]]  # type: ignore[index]


def _pg_cleanup(server: str, template: str) -> None:
    """Drops the template and its clones (the workers leave theirs to this)."""
    import psycopg

    with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s OR datname LIKE %s",
            (template, template + "\\_%"))]
    # Clones first (a template cannot be dropped while a clone is being made of it: none is
    # by now), all at once: each DROP waits for a checkpoint, and concurrent ones share it.
    clones = [n for n in names if n != template]
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(clones)))) as pool:
        list(pool.map(lambda n: _drop(server, n), clones))
    if template in names:
        _drop(server, template)


def _drop(server: str, name: str) -> None:
    """DROP DATABASE, retried for a minute while the server has no connection to spare."""
    import psycopg

    for attempt in range(60):
        try:
            _pg_exec(server, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)
            return
        except psycopg.OperationalError:
            if attempt == 59:
                raise
            time.sleep(1)


def _pytest(checkpointer: str, src: Path, env: dict[str, str], report: Path,
            args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
           "addopts=--strict-markers", "-o", "asyncio_default_fixture_loop_scope=function",
           f"--junitxml={report}", "--rootdir", str(src),
           *[f"--ignore={p}" for p in IGNORED], *args]
    print(f"\n== {LABELS[checkpointer]}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=src, env={**env, "TETHER_LGS_CHECKPOINTER": checkpointer},
                   check=False)


def _node_id(src: Path, classname: str, name: str) -> str:
    """pytest's node id for a junit test case (`tests.test_x.TestY` -> tests/test_x.py::TestY)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (src / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return f"{classname}::{name}"


def _retry_timing(checkpointer: str, src: Path, work: Path, env: dict[str, str],
                  ids: list[str]) -> set[str]:
    """Runs the timing-sensitive failures again, one at a time, without xdist; the passed."""
    passed: set[str] = set()
    for node in ids:
        report = work / f"junit-{checkpointer}-retry.xml"
        report.unlink(missing_ok=True)
        _pytest(checkpointer, src, env, report, ["-p", "no:xdist", node])
        if report.exists() and all(case.find("failure") is None and case.find("error") is None
                                   and case.find("skipped") is None
                                   for case in ET.parse(report).iter("testcase")):
            passed.add(node)
    return passed


def run_one(checkpointer: str, src: Path, work: Path, env: dict[str, str],
            pytest_args: list[str]) -> Result:
    report = work / f"junit-{checkpointer}.xml"
    args = list(pytest_args)
    if not any(a.startswith("tests") for a in pytest_args):
        args.append("tests")
    start = time.monotonic()
    _pytest(checkpointer, src, env, report, args)
    result = Result(LABELS[checkpointer])
    if report.exists():
        cases = list(ET.parse(report).iter("testcase"))
        failing = [_node_id(src, c.get("classname", ""), c.get("name", "")) for c in cases
                   if c.find("failure") is not None or c.find("error") is not None]
        timing = [n for n in failing if n.split("::")[-1].split("[")[0] in TIMING]
        retried = _retry_timing(checkpointer, src, work, env, timing) if timing else set()
        for name in failing:
            if name in retried:
                result.retried += 1
                print(f"RETRIED [{result.checkpointer}] {name}: timing-sensitive, "
                      "failed under load, passed alone")
            else:
                result.failed += 1
                result.failures.append(name)
        for case in cases:
            if case.find("failure") is not None or case.find("error") is not None:
                continue
            elif (skip := case.find("skipped")) is not None:
                if skip.get("type") == "pytest.xfail":
                    result.by_design += 1
                else:
                    result.skipped += 1
            else:
                result.passed += 1
    else:
        result.failed = -1
    result.seconds = time.monotonic() - start
    return result


def table(results: list[Result]) -> str:
    head = ("checkpointer", "passed", "failed", "skipped", "by design", "retried", "seconds")
    rows = [(r.checkpointer, str(r.passed), str(r.failed), str(r.skipped), str(r.by_design),
             str(r.retried), f"{r.seconds:.0f}")
            for r in results]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines = [" | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in (head, *rows)]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--store", choices=("sqlite", "postgres", "both", "none"), default="both",
                        help="TetherSaver's store (none: only --reference)")
    parser.add_argument("--reference", choices=("memory", "sqlite"), action="append",
                        default=[], help="also run LangGraph's own saver (repeatable)")
    parser.add_argument("-n", "--workers", default="2",
                        help="pytest-xdist workers (0: no xdist; default 2)")
    parser.add_argument("--pg", default=os.environ.get("TETHER_TEST_PG", PG_DEFAULT))
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="tether-lgsuite-"))
    template = f"tether_lgs_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    stores = {"both": ["sqlite", "postgres"], "none": []}.get(args.store, [args.store])
    pg_made = False
    try:
        src = fetch_tests(work)
        deps = work / "deps"
        deps.mkdir()
        install_missing(deps)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(deps), str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
        sqlite_tpl = work / "template.db"
        asyncio.run(_migrate(f"sqlite:///{sqlite_tpl}"))
        env["TETHER_LGS_SQLITE_TEMPLATE"] = str(sqlite_tpl)
        if "postgres" in stores:
            _pg_exec(args.pg, "CREATE DATABASE {}", template)
            pg_made = True
            asyncio.run(_migrate(_with_db(args.pg, template)))
            env["TETHER_LGS_PG"], env["TETHER_LGS_PG_TEMPLATE"] = args.pg, template
            env["TETHER_LGS_PG_TRUNCATE"] = ",".join(_empty_tables(_with_db(args.pg, template)))
        pytest_args = list(args.pytest_args)
        if args.workers != "0" and _importable("xdist"):
            pytest_args = ["-n", args.workers, *pytest_args]
        results = [run_one(f"tether-{s}", src, work, env, pytest_args) for s in stores]
        results += [run_one(r, src, work, env, pytest_args) for r in args.reference]
    finally:
        try:
            if pg_made:
                start = time.monotonic()
                _pg_cleanup(args.pg, template)
                print(f"Postgres test databases dropped in {time.monotonic() - start:.1f} s")
        finally:
            if args.keep:
                print(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
    for r in results:
        for name in r.failures:
            print(f"FAILED [{r.checkpointer}] {name}")
    print()
    print(table(results))
    return 1 if any(r.failed and r.checkpointer.startswith("TetherSaver") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
