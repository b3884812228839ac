"""SQLite store: the embedded default.

SQLiteStore owns its connections part (sqlite_io.py: the settings, the two connections and
their group commit) and holds the Store protocol's methods on top of it. Which kind a step
commit is, and whom it wakes, is plan.py's to decide; this module says it in SQLite.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import orjson

from ..errors import LeaseLost, RunConflict, RunNotFound, SchemaError
from .base import (
    COMPENSATION_STEP,
    INBOX_LIMIT,
    SLEEP_CALL,
    TERMINAL,
    Audit,
    AuditRecord,
    CheckpointRecord,
    ClaimedReads,
    CommitObserver,
    EffectRecord,
    InterruptRecord,
    JournalRecord,
    Lease,
    MessageRecord,
    NewRun,
    Park,
    RunRecord,
    SentRecord,
    StatusCounts,
    StepCommit,
)
from .listing import RunQuery
from .measure import LoadStats
from .measure import measure as measure_load
from .migrate import behind_message, latest, queries
from .plan import ADVANCE, FINISH, StepWakes, step_kind, step_wakes
from .rows import finished_run, mail_refused, new_run_params, same_run
from .sessions import SQLiteSessionsPart
from .sqlite_answers import Answers, answer_one
from .sqlite_claimed import ALL_STEPS, claimed_reads
from .sqlite_create import FRESH_WRITES, fresh_insert
from .sqlite_deploy import SQLiteDeployments
from .sqlite_io import Fenced, SQLiteConnections, audited
from .sqlite_retention import SQLiteRetention
from .sqlite_schema import apply_migrations, missing_file, parse_sqlite_url, schema_applied
from .sqlite_steps import step_job
from .sqlite_watch import OthersWatch

__all__ = ["SQLiteStore", "apply_migrations", "parse_sqlite_url"]

T = TypeVar("T")


def _run(row: sqlite3.Row | tuple[Any, ...]) -> RunRecord:
    return RunRecord(*row)


def _checkpoint(row: tuple[Any, ...]) -> CheckpointRecord:
    return CheckpointRecord(*row)


class SQLiteStore(SQLiteSessionsPart):
    dialect = "sqlite"

    def __init__(self, url: str, *, synchronous: str | None = None, busy_timeout: float = 30.0):
        self._conns = conns = SQLiteConnections(url, synchronous=synchronous,
                                                busy_timeout=busy_timeout)
        self.url, self.path, self.memory = url, conns.path, conns.memory
        self.synchronous, self.busy_timeout = conns.synchronous, conns.busy_timeout
        self._q = queries("sqlite")
        self.work_available: asyncio.Event = conns.wake
        self.effects_available = asyncio.Event()
        # The part's two entry points, bound once: every Store method runs its jobs on them.
        self._w, self._r = conns.write, conns.read
        self._fx_after = ""  # where claim_effects' walk over runs stopped (round robin)
        self._audit = functools.partial(audited, self._q["insert_audit"])
        self._answers = Answers(self._q, self._w)
        self.retention = SQLiteRetention(self._q, self._r, self._w)
        self.deploys = SQLiteDeployments(self._q, self._r, self._w, self.work_available)
        self._others = OthersWatch(conns, self._r, self._q["any_due"], self.work_available)

    def __repr__(self) -> str:
        return f"SQLiteStore({self.url!r})"

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self, *, check_schema: bool = True) -> None:
        if self._conns.is_open:
            return
        if check_schema and not self.memory and (missing := missing_file(self.path)):
            # Opening would create an empty file: a read must leave nothing behind.
            raise SchemaError(f"there is no database at {self.url} (no file {missing}); run "
                              f"`tether migrate --db {self.url}` first, or point --db at your "
                              "database")
        self._conns.open(set_sql={
            self._q[name]: self._q[f"{name}_set"]
            for name in ("insert_journal", "advance_run", "insert_checkpoint", "finish_run",
                         *FRESH_WRITES)})
        if check_schema:
            current, target = await self.schema_version()
            if current < target:
                await self.close()
                raise SchemaError(behind_message(current, target, self.url))

    async def close(self) -> None:
        await self._others.stop()
        self._conns.close()

    def observe_commits(self, observer: CommitObserver | None) -> None:
        self._conns.observer = observer

    def pool_statistics(self) -> dict[str, int]:
        return {}  # two connections of its own, no pool

    # -- schema ----------------------------------------------------------------------------

    async def schema_version(self) -> tuple[int, int]:
        current = await self._r(schema_applied, snapshot=True)
        return int(current), latest("sqlite")

    async def migrate(self) -> list[int]:
        # The IMMEDIATE transaction serializes concurrent migrators across processes.
        return cast(list[int], await self._w(apply_migrations))

    async def now(self) -> float:
        q = self._q["now"]
        return float(await self._r(lambda c: c.execute(q).fetchone()[0]))

    # -- runs ------------------------------------------------------------------------------

    async def create_run(
        self, new: NewRun, lease: tuple[str, float] | None = None, audit: Audit | None = None
    ) -> tuple[RunRecord, bool]:
        q = self._q

        def job(conn: sqlite3.Connection) -> tuple[RunRecord, bool]:
            if new.idempotency_key is not None:
                row = conn.execute(q["get_run_by_key"], {"key": new.idempotency_key}).fetchone()
                if row is not None:
                    return same_run(_run(row), new, "idempotency key"), False
            row = conn.execute(q["insert_run"], new_run_params(new, lease)).fetchone()
            if row is not None:
                return _run(row), True
            row = conn.execute(q["get_run"], {"thread_id": new.thread_id}).fetchone()
            if row is None:  # lost to a concurrent key insert; report it as a conflict
                raise RunConflict(f"idempotency key {new.idempotency_key!r} is already used")
            return same_run(_run(row), new, "thread_id"), False

        # The common start, batched with its audit row if any (sqlite_create); one with an
        # idempotency key is a job of its own, as is the fresh one's fallback.
        made = self._audit(job, audit, lambda r: r[1])
        fresh = fresh_insert(q, new, lease, made, audit)
        run, created = await self._w(fresh if fresh is not None else made)
        if created and lease is None:
            self.work_available.set()
        return run, created

    async def get_run(self, thread_id: str) -> RunRecord | None:
        q = self._q["get_run"]
        row = await self._r(lambda c: c.execute(q, {"thread_id": thread_id}).fetchone())
        return None if row is None else _run(row)

    async def run_statuses(self, thread_ids: Sequence[str]) -> dict[str, str]:
        q = self._q["run_statuses"]
        ids = orjson.dumps(list(thread_ids)).decode()
        rows = await self._r(lambda c: c.execute(q, {"ids": ids}).fetchall())
        return {r[0]: r[1] for r in rows}

    async def list_runs(  # the arguments are RunQuery's (store/listing.py)
        self, *, status: str | None = None, agent: str | None = None, limit: int = 100,
        before: tuple[float, str] | None = None, version: str | None = None,
        parent: str | None = None, since: float | None = None, until: float | None = None,
        prefix: str | None = None, order: str = "newest",
    ) -> list[RunRecord]:
        name, params = RunQuery(
            status=status, agent=agent, version=version, parent=parent, since=since,
            until=until, prefix=prefix, order=order, before=before, limit=limit,
        ).plan(code_point_order=True)  # thread_id's collation is BINARY
        q = self._q[name]
        rows = await self._r(lambda c: c.execute(q, params).fetchall())
        return [_run(r) for r in rows]

    # -- leases ----------------------------------------------------------------------------

    async def claim_runs(
        self, worker: str, version: str, agents: Sequence[str], limit: int, lease_ttl: float
    ) -> list[RunRecord]:
        q = self._q["claim_runs"]
        names = orjson.dumps(list(agents)).decode()
        self._others.claimed(version, names)
        params = {"worker": worker, "version": version, "agents": names, "limit": limit,
                  "ttl": lease_ttl}
        rows = await self._w(lambda c: c.execute(q, params).fetchall())
        return [_run(r) for r in rows]

    async def renew_leases(self, worker: str, lease_ttl: float, only: Sequence[str] | None=None) -> set[str]:
        ids, q = None if only is None else orjson.dumps(list(only)).decode(), self._q["renew_leases"]
        rows = await self._w(lambda c: c.execute(q, dict(worker=worker, ttl=lease_ttl, only=ids)).fetchall())
        return {r[0] for r in rows}

    async def release_runs(self, leases: Sequence[Lease]) -> None:
        if not leases:
            return
        q = self._q["release_run"]
        params = [{"thread_id": le.thread_id, "epoch": le.epoch} for le in leases]
        await self._w(lambda c: c.executemany(q, params).close())
        self.work_available.set()

    async def release_worker(self, worker: str, audit: Audit | None = None) -> list[str]:
        q, params = self._q, {"worker": worker}

        def job(conn: sqlite3.Connection) -> tuple[list[str], bool]:
            runs = [r[0] for r in conn.execute(q["release_worker_runs"], params).fetchall()]
            return runs, bool(conn.execute(q["release_worker_effects"], params).fetchall())

        released, effects = await self._w(self._audit(job, audit, lambda r: bool(r[0] or r[1])))
        self.work_available.set()
        if effects:
            self.effects_available.set()
        return cast(list[str], released)

    async def retry_run(self, thread_id: str, node: str, audit: Audit | None = None
                        ) -> RunRecord | None:
        q = self._q["retry_run"]
        row = await self._w(self._audit(
            lambda c: c.execute(q, {"thread_id": thread_id, "node": node}).fetchone(), audit,
            lambda r: r is not None))
        if row is None:
            return None
        self.work_available.set()
        return _run(row)

    # -- steps -----------------------------------------------------------------------------

    def record_call(self, lease: Lease, step: int, idx: int, name: str, result: bytes,
                    args: str | None = None) -> Awaitable[None]:  # a future: one await less
        return self._w(Fenced(
            self._q["insert_journal"],
            (lease.thread_id, step, idx, name, result, lease.epoch, args),
            f"run {lease.thread_id!r}: lease lost before journaling call {idx}"))

    async def load_journal(self, thread_id: str, step: int) -> list[JournalRecord]:
        q = self._q["load_journal"]
        rows = await self._r(lambda c: c.execute(q, {"thread_id": thread_id, "step": step}).fetchall())
        return [JournalRecord(r[0], r[1], r[2], r[3]) for r in rows]

    async def journal_usage(self, thread_id: str, prefix: bytes) -> list[bytes]:
        q = self._q["journal_usage"]
        rows = await self._r(lambda c: c.execute(
            q, {"thread_id": thread_id, "prefix": prefix}).fetchall())
        return [bytes(r[0]) for r in rows]

    def commit_step(self, commit: StepCommit) -> Awaitable[RunRecord | None]:
        lease = commit.lease
        cp = (lease.thread_id, commit.step, commit.node, commit.next_node, commit.kind,
              commit.data, lease.worker, commit.attempt, commit.started_at, commit.finished_at)
        kind = step_kind(commit)
        if kind is ADVANCE:
            # The run moves on under the same lease. A plain future, batched with the other
            # such steps of this group commit.
            return self._w(Fenced(
                self._q["advance_run"],
                (commit.step, commit.next_node, lease.thread_id, lease.epoch),
                f"run {lease.thread_id!r}: lease lost; step {commit.step} not committed",
                self._q["insert_checkpoint"], cp))
        if kind is FINISH:
            # As above, the finished run's record built here.
            now = time.time()
            assert commit.run is not None
            return self._w(Fenced(
                self._q["finish_run"], (commit.step, "completed", lease.thread_id, lease.epoch, now),
                f"run {lease.thread_id!r}: lease lost; step {commit.step} not committed",
                self._q["insert_checkpoint"], cp, result=finished_run(commit.run, commit, now)))
        return self._commit_step(commit, cp, step_wakes(commit))

    async def _commit_step(self, commit: StepCommit, cp: tuple[Any, ...],
                           wakes: StepWakes) -> RunRecord | None:
        """Any other kind: one transaction (a job), checks and wake-ups as `wakes` says."""
        row: tuple[Any, ...] | None = await self._w(step_job(self._q, commit, cp, wakes))
        if row is None:
            raise LeaseLost(f"run {commit.lease.thread_id!r}: lease lost; step {commit.step} "
                            "not committed")
        if wakes.workers:
            self.work_available.set()
        if wakes.dispatchers:
            self.effects_available.set()
        return _run(row) if wakes.terminal else None

    async def send_message(self, thread_id: str, message: bytes, sender: str | None = None,
                           audit: Audit | None = None) -> int:
        q = self._q

        def job(conn: sqlite3.Connection) -> int:
            row = conn.execute(q["get_run"], {"thread_id": thread_id}).fetchone()
            if row is None:
                raise RunNotFound(f"no run with thread_id {thread_id!r}")
            if (run := _run(row)).status in TERMINAL:
                raise mail_refused(thread_id, run.status)
            cur = conn.execute(q["insert_message"],
                               {"thread_id": thread_id, "sender": sender, "message": message})
            conn.execute(q["wake_for_mail"], {"thread_id": thread_id})
            return int(cur.lastrowid or 0)

        mid: int = await self._w(self._audit(job, audit, lambda r: True))
        self.work_available.set()
        return mid

    async def load_inbox(self, thread_id: str, limit: int = INBOX_LIMIT) -> list[MessageRecord]:
        q = self._q["load_inbox"]
        rows = await self._r(lambda c: c.execute(q, {"thread_id": thread_id, "limit": limit}).fetchall())
        return [MessageRecord(*r) for r in rows]

    async def sent_mail(self, sender: str, limit: int = 100) -> list[SentRecord]:
        q, params = self._q["sent_mail"], {"sender": sender, "limit": limit}
        return [SentRecord(*r) for r in await self._r(lambda c: c.execute(q, params).fetchall())]

    async def with_mail(self, thread_ids: Sequence[str]) -> set[str]:
        q, ids = self._q["with_mail"], {"ids": orjson.dumps(list(thread_ids)).decode()}
        return {r[0] for r in await self._r(lambda c: c.execute(q, ids).fetchall())}

    async def load_claimed(self, runs: Sequence[RunRecord]) -> dict[str, ClaimedReads]:
        return await self._r(claimed_reads(self._q, runs)) if runs else {}

    async def inbox_depth(self, thread_id: str) -> int:
        q = self._q["inbox_depth"]
        return int(await self._r(lambda c: c.execute(q, {"thread_id": thread_id}).fetchone()[0]))

    async def group_members(self, group: str) -> list[str]:
        q = self._q["group_members"]
        rows = await self._r(lambda c: c.execute(q, {"group_name": group}).fetchall())
        return [r[0] for r in rows]

    async def fail_step(
        self,
        lease: Lease,
        *,
        failures: int,
        wake_at: float | None,
        error: bytes | None,
        final: bool,
        compensate: Sequence[str] = (),
    ) -> None:
        q, q_wake = self._q["fail_step"], self._q["wake_parent"]
        comp = self._compensations(lease.thread_id, compensate) if final else None
        params = {"thread_id": lease.thread_id, "epoch": lease.epoch, "failures": failures,
                  "wake_at": wake_at, "error": error, "final": final}

        def job(conn: sqlite3.Connection) -> bool:
            if conn.execute(q, params).rowcount != 1:
                return False
            if comp is not None:
                comp(conn)
            if final:
                conn.execute(q_wake, {"thread_id": lease.thread_id})
            return True

        if not await self._w(job):
            raise LeaseLost(f"run {lease.thread_id!r}: lease lost; failure not recorded")
        self.work_available.set()  # retried later, or a parent parked in join woke up
        if final:
            self.effects_available.set()

    def _compensations(self, thread_id: str, names: Sequence[str]) -> Callable[[sqlite3.Connection], None]:
        q = self._q["add_compensations"]
        params = {"thread_id": thread_id, "step": COMPENSATION_STEP,
                  "names": orjson.dumps(list(names)).decode()}

        def add(conn: sqlite3.Connection) -> None:
            conn.execute(q, params)

        return add

    async def park_run(self, lease: Lease, park: Park) -> None:
        q = self._q
        waiting = park.kind != "sleep"
        params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "status": "waiting" if waiting else "sleeping",
            "waiting_for": park.kind if waiting else None,
            "seconds": None if waiting else park.seconds,
        }

        def job(conn: sqlite3.Connection) -> bool:
            if conn.execute(q["park_run"], params).rowcount != 1:
                return False
            key = {"thread_id": lease.thread_id, "step": park.step, "idx": park.idx}
            for child in park.spawn:
                conn.execute(q["insert_run"], new_run_params(child)).fetchall()
            if park.kind == "join":
                conn.execute(q["requeue_if_joined"], {
                    "thread_id": lease.thread_id,
                    "children": orjson.dumps(list(park.children)).decode()})
            elif waiting:
                conn.execute(q["insert_interrupt"],
                             {**key, "id": park.interrupt_id, "payload": park.payload})
            else:
                conn.execute(q["journal_value"], {**key, "name": SLEEP_CALL,
                                                  "result": orjson.dumps(park.seconds)})
            return True

        if not await self._w(job):
            raise LeaseLost(f"run {lease.thread_id!r}: lease lost; not parked")
        self.work_available.set()

    async def resume_interrupt(
        self, thread_id: str, value: bytes, interrupt_id: str | None = None,
        audit: Audit | None = None,
    ) -> InterruptRecord | None:
        if audit is None:  # answered with the others of its group commit
            rec = await self._answers.answer(thread_id, value, interrupt_id)
        else:
            rec = await self._w(self._audit(
                lambda conn: answer_one(self._q, conn, thread_id, value, interrupt_id), audit,
                lambda r: r is not None))
        if rec is not None:
            self.work_available.set()
        return rec

    async def get_interrupt(self, interrupt_id: str) -> InterruptRecord | None:
        q = self._q["get_interrupt"]
        row = await self._r(lambda c: c.execute(q, {"id": interrupt_id}).fetchone())
        return None if row is None else InterruptRecord(*row)

    async def list_interrupts(
        self, *, thread_id: str | None = None, status: str | None = "pending", limit: int = 100
    ) -> list[InterruptRecord]:
        q = self._q["list_interrupts"]
        params = {"thread_id": thread_id, "status": status, "limit": limit}
        rows = await self._r(lambda c: c.execute(q, params).fetchall())
        return [InterruptRecord(*r) for r in rows]

    async def cancel_run(
        self, thread_id: str, compensate: Sequence[str] = (), audit: Audit | None = None
    ) -> RunRecord | None:
        q = self._q
        comp_names = orjson.dumps(list(compensate)).decode()

        def job(conn: sqlite3.Connection) -> RunRecord | None:
            cancelled = [r[0] for r in conn.execute(q["cancel_tree"],
                                                    {"thread_id": thread_id}).fetchall()]
            for tid in cancelled:
                conn.execute(q["cancel_interrupts"], {"thread_id": tid})
                conn.execute(q["add_compensations"], {
                    "thread_id": tid, "step": COMPENSATION_STEP, "names": comp_names})
            if cancelled:
                conn.execute(q["wake_parent"], {"thread_id": thread_id})
                if audit is not None:
                    conn.execute(q["insert_audit"], audit.params())
            row = conn.execute(q["get_run"], {"thread_id": thread_id}).fetchone()
            return None if row is None else _run(row)

        result: RunRecord | None = await self._w(job)
        self.work_available.set()
        self.effects_available.set()
        return result

    # -- outbox ----------------------------------------------------------------------------

    async def claim_effects(
        self, worker: str, names: Sequence[str], limit: int, lease_ttl: float
    ) -> list[EffectRecord]:
        q = self._q
        wanted = set(names)
        visit = 8 * limit + 400  # runs looked at, at most (one probe of outbox_live each)

        def job(conn: sqlite3.Connection) -> list[EffectRecord]:
            now = conn.execute(q["now"]).fetchone()[0]
            start = cursor = self._fx_after
            due: list[int] = []
            wrapped, visited = False, 0
            while visited < visit and len(due) < limit:
                row = conn.execute(q["effect_head_after"], {"after": cursor}).fetchone()
                if row is None and not wrapped:
                    wrapped = True
                    row = conn.execute(q["effect_head_first"]).fetchone()
                if row is None or (wrapped and row[1] > start):
                    break  # every run visited
                rowid, cursor, name, status, next_at, expires = row
                visited += 1
                if name in wanted and (
                        (status == "pending" and next_at <= now)
                        or (status == "running" and expires is not None and expires < now)):
                    due.append(rowid)
            self._fx_after = cursor
            if not due:
                return []
            params = {"rowids": orjson.dumps(due).decode(), "worker": worker, "ttl": lease_ttl}
            return [EffectRecord(*r) for r in conn.execute(q["claim_effect_rows"], params)]

        claimed: list[EffectRecord] = await self._w(job)
        return claimed

    async def renew_effect_leases(self, worker: str, lease_ttl: float) -> None:
        q = self._q["renew_effect_leases"]
        await self._w(lambda c: c.execute(q, {"worker": worker, "ttl": lease_ttl}).close())

    async def complete_effect(self, effect: EffectRecord, result: bytes) -> bool:
        q = self._q["complete_effect"]
        params = {"thread_id": effect.thread_id, "key": effect.key, "epoch": effect.epoch,
                  "result": result}
        done: bool = await self._w(lambda c: c.execute(q, params).rowcount == 1)
        return done

    async def complete_effects(self, items: Sequence[tuple[EffectRecord, bytes]]) -> list[bool]:
        q = self._q["complete_effect"]
        params = [{"thread_id": e.thread_id, "key": e.key, "epoch": e.epoch, "result": result}
                  for e, result in items]
        if not params:
            return []

        def job(conn: sqlite3.Connection) -> list[bool]:  # one transaction, each row fenced
            return [conn.execute(q, p).rowcount == 1 for p in params]

        done: list[bool] = await self._w(job)
        return done

    async def fail_effect(self, effect: EffectRecord, error: str, delay: float | None) -> bool:
        q = self._q["fail_effect"]
        params = {"thread_id": effect.thread_id, "key": effect.key, "epoch": effect.epoch,
                  "error": error, "delay": delay}
        ok: bool = await self._w(lambda c: c.execute(q, params).rowcount == 1)
        if ok and delay is not None:
            self.effects_available.set()
        return ok

    async def get_effect(self, thread_id: str, key: str) -> EffectRecord | None:
        q = self._q["get_effect"]
        row = await self._r(lambda c: c.execute(q, {"thread_id": thread_id, "key": key}).fetchone())
        return None if row is None else EffectRecord(*row)

    async def list_effects(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[EffectRecord]:
        q = self._q["list_effects"]
        params = {"thread_id": thread_id, "status": status, "limit": limit}
        rows = await self._r(lambda c: c.execute(q, params).fetchall())
        return [EffectRecord(*r) for r in rows]

    async def retry_effect(self, key: str, thread_id: str | None = None,
                           audit: Audit | None = None) -> list[EffectRecord]:
        q = self._q["retry_effect"]
        rows = await self._w(self._audit(
            lambda c: c.execute(q, {"key": key, "thread_id": thread_id}).fetchall(), audit, bool))
        if rows:
            self.effects_available.set()
        return [EffectRecord(*r) for r in rows]

    async def load_checkpoints(self, thread_id: str, upto: int | None = None) -> list[CheckpointRecord]:
        q = self._q["load_checkpoints"]
        params = {"thread_id": thread_id, "upto": upto if upto is not None else ALL_STEPS}
        rows = await self._r(lambda c: c.execute(q, params).fetchall())
        return [_checkpoint(r) for r in rows]

    async def checkpoints(self, thread_id: str) -> list[CheckpointRecord]:
        q = self._q["checkpoints_range"]
        params = {"thread_id": thread_id, "from_step": 0, "upto": ALL_STEPS}
        rows = await self._r(lambda c: c.execute(q, params).fetchall())
        return [_checkpoint(r) for r in rows]

    async def measure(self, window: float) -> LoadStats:
        async def query(name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
            q = self._q[name]
            return [tuple(r) for r in await self._r(lambda c: c.execute(q, params).fetchall())]

        return await measure_load(query, await self.now(), window)

    async def list_audit(self, *, thread_id: str | None = None, action: str | None = None,
                         limit: int = 100, before: int | None = None) -> list[AuditRecord]:
        q = self._q["list_audit"]
        params = {"thread_id": thread_id, "action": action, "limit": limit, "before": before}
        return [AuditRecord(*r) for r in await self._r(lambda c: c.execute(q, params).fetchall())]

    async def status_counts(self, cap: int | None = None) -> StatusCounts:
        q = self._q["status_counts" if cap is None else "status_counts_capped"]
        return StatusCounts.from_rows(await self._r(lambda c: c.execute(q, {"cap": cap}).fetchall()))
