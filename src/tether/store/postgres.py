"""Postgres store: any number of workers on any number of machines share one database.

PostgresStore owns five parts, each with a small interface: the connections (pg_conn.py:
settings, pool, error translation, reads, transactions), the group committers of the
one-statement writes (pg_commit.py), of the steps that carry mail (pg_full.py) and of
runtime.send (pg_send.py), and the LISTEN/NOTIFY listener (pg_listen.py); this
module holds the Store protocol's methods on top of them, and pg_steps.py how a step's
writes are said in SQL.

Multi-statement writes (steps that send mail or record effects, parks into join, cancels,
final failures) run in a transaction on a pooled connection that first locks every run row
it will touch (lock_runs, lock_tree), and only then reads them for a decision: in READ
COMMITTED a conditional UPDATE skips a row whose change it cannot see yet, so without the
lock a park and the wake-up meant for it could miss each other. Every multi-row lock is taken
in thread_id order, so none can deadlock with another; a deadlock with anything else rolls
the transaction back whole and it is retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Final

from psycopg.rows import TupleRow

from ..errors import LeaseLost, RunConflict, SchemaError, StoreUnavailable
from .base import (
    COMPENSATION_STEP,
    INBOX_LIMIT,
    INTERRUPT_CALL,
    RUN_COLUMNS,
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
from .listing import RunQuery, index_ordered
from .measure import LoadStats
from .measure import measure as measure_load
from .migrate import behind_message
from .pg_claimed import load_claimed
from .pg_commit import DoneMarks, GroupCommitter
from .pg_conn import BEGIN, Conn, Params, PgConnections
from .pg_deploy import PgDeployments
from .pg_full import FullCommitter
from .pg_listen import CHANNEL, EFFECTS_CHANNEL, Listener
from .pg_retention import PgRetention
from .pg_send import Sends
from .pg_settle import settle_call, settle_create, settle_done_marks, settle_park, settle_resume, settle_step
from .pg_steps import add_children, park_params, step_params
from .plan import FINISH, FULL, RELEASE, SPAWN, step_kind, step_wakes, wakes_workers
from .rows import finished_run, new_run_params, same_run
from .sessions import PgSessionsPart

__all__ = ["CHANNEL", "EFFECTS_CHANNEL", "PostgresStore"]

_NO_LIMIT: Final = 2**62
_CLAIM_ROUNDS: Final = 4  # claim_effects statements per call at most (each visits 2*limit+100 runs)
_DONE_BATCH: Final = 1000  # done marks per complete_effects statement


def _run(row: TupleRow) -> RunRecord:
    return RunRecord(*row)


_RUN_WIDTH = len(RUN_COLUMNS)


def _checkpoint(row: TupleRow) -> CheckpointRecord:
    return CheckpointRecord(*row)


class PostgresStore(PgSessionsPart):
    dialect = "postgres"

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 2,
        max_size: int = 10,
        connect_timeout: float = 5.0,
        pool_timeout: float = 15.0,
        synchronous_commit: str = "on",
        debounce: float = 0.01,
    ):
        self._conns = conns = PgConnections(
            url, min_size=min_size, max_size=max_size, connect_timeout=connect_timeout,
            pool_timeout=pool_timeout, synchronous_commit=synchronous_commit)
        self.url, self.safe_url = url, conns.safe_url
        self.min_size, self.max_size = conns.min_size, conns.max_size
        self.connect_timeout, self.pool_timeout = conns.connect_timeout, conns.pool_timeout
        self.synchronous_commit = synchronous_commit
        self.work_available = asyncio.Event()
        self.effects_available = asyncio.Event()
        self._q = conns.q
        self._committer, self._full = GroupCommitter(conns), FullCommitter(conns)
        self._sends = Sends(conns, self.work_available)
        self._listener = Listener(conns, self.work_available, self.effects_available, debounce)
        self._done_marks = DoneMarks(self.complete_effects, _DONE_BATCH)
        self._fx_after = ""  # where claim_effects' walk over runs stopped (round robin)
        self._code_point_order: bool | None = None  # the database's text order (listing)
        self.retention, self.deploys = PgRetention(conns, self._q), PgDeployments(conns, self._q)

    def __repr__(self) -> str:
        return f"PostgresStore({self.safe_url!r})"

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self, *, check_schema: bool = True) -> None:
        if self._conns.is_open:
            return
        # The listener's connection first: it fails fast, with the server's reason (refused,
        # no such database, bad password); a pool would only report a timeout.
        await self._listener.open()
        try:
            await self._conns.open()
        except BaseException:
            await self._listener.close()
            raise
        if check_schema:
            try:
                current, target = await self.schema_version()
            except BaseException:
                await self.close()
                raise
            if current < target:
                await self.close()
                raise SchemaError(behind_message(current, target, self.safe_url))
        self._committer.start()
        self._listener.start()

    async def close(self) -> None:
        await self._listener.close()
        await self._full.close()
        await self._sends.close()
        await self._committer.close()  # gives the writers' connections back to the pool
        await self._conns.close()

    def observe_commits(self, observer: CommitObserver | None) -> None:
        self._committer.observer = observer

    def pool_statistics(self) -> dict[str, int]:
        return self._conns.pool_statistics()

    # -- schema (on the connections part) ---------------------------------------------------

    async def schema_version(self) -> tuple[int, int]:
        return await self._conns.schema_version()

    async def migrate(self) -> list[int]:
        return await self._conns.migrate()

    async def now(self) -> float:
        row = await self._conns.read_one(self._q["now"])
        assert row is not None
        return float(row[0])

    # -- runs ------------------------------------------------------------------------------

    async def create_run(
        self, new: NewRun, lease: tuple[str, float] | None = None, audit: Audit | None = None
    ) -> tuple[RunRecord, bool]:
        # Through the writer: concurrent starts are group-committed like steps, an audited
        # one with its audit row in the same statement (written only if it created the run).
        params = new_run_params(new, lease)
        query = self._q["create_run"]
        if audit is not None:
            query = self._q["create_run_audited"]
            params.update(audit.prefixed())
        row = await settle_create(self._conns, lambda: self._committer.write(
            query, params, new.thread_id), new)
        if row is not None:
            run, created = _run(row[1:1 + _RUN_WIDTH]), bool(row[0])
            if created:
                if lease is None:
                    self.work_available.set()
                return run, True
            by = "idempotency key" if (
                new.idempotency_key is not None and run.idempotency_key == new.idempotency_key
            ) else "thread_id"
            return same_run(run, new, by), False
        # The row we collided with was committed after our statement's snapshot was taken.
        if new.idempotency_key is not None:
            found = await self._conns.read_one(self._q["get_run_by_key"], {"key": new.idempotency_key})
            if found is not None:
                return same_run(_run(found), new, "idempotency key"), False
        found = await self._conns.read_one(self._q["get_run"], {"thread_id": new.thread_id})
        if found is None:
            raise RunConflict(f"thread_id {new.thread_id!r} or idempotency key "
                              f"{new.idempotency_key!r} is being used by a concurrent start")
        return same_run(_run(found), new, "thread_id"), False

    async def get_run(self, thread_id: str) -> RunRecord | None:
        row = await self._conns.hot_read_one(self._q["get_run"], {"thread_id": thread_id})
        return None if row is None else _run(row)

    async def list_runs(  # the arguments are RunQuery's (store/listing.py)
        self, *, status: str | None = None, agent: str | None = None, limit: int = 100,
        before: tuple[float, str] | None = None, version: str | None = None,
        parent: str | None = None, since: float | None = None, until: float | None = None,
        prefix: str | None = None, order: str = "newest",
    ) -> list[RunRecord]:
        if self._code_point_order is None:
            row = await self._conns.read_one(self._q["code_point_order"])
            self._code_point_order = bool(row and row[0])
        name, params = RunQuery(
            status=status, agent=agent, version=version, parent=parent, since=since,
            until=until, prefix=prefix, order=order, before=before, limit=limit,
        ).plan(code_point_order=self._code_point_order)
        read = self._conns.read_by_index if index_ordered(name) else self._conns.read
        return [_run(r) for r in await read(self._q[name], params)]

    # -- leases ----------------------------------------------------------------------------

    async def claim_runs(
        self, worker: str, version: str, agents: Sequence[str], limit: int, lease_ttl: float
    ) -> list[RunRecord]:
        params = {"worker": worker, "version": version, "agents": list(agents), "limit": limit,
                  "ttl": float(lease_ttl)}
        return [_run(r) for r in await self._conns.fetchall(self._q["claim_runs"], params)]

    async def renew_leases(self, worker: str, lease_ttl: float,
                           only: Sequence[str] | None = None) -> set[str]:
        params = {"worker": worker, "ttl": float(lease_ttl),
                  "only": None if only is None else list(only)}
        rows = await self._conns.fetchall(self._q["renew_leases"], params, idempotent=True)
        return {r[0] for r in rows}

    async def release_runs(self, leases: Sequence[Lease]) -> None:
        if not leases:
            return
        params = {"thread_ids": [le.thread_id for le in leases],
                  "epochs": [le.epoch for le in leases]}
        await self._conns.fetchall(self._q["release_runs"], params, idempotent=True)
        self.work_available.set()

    async def release_worker(self, worker: str, audit: Audit | None = None) -> list[str]:
        q, params = self._q, {"worker": worker}

        async def body(conn: Conn) -> tuple[list[str], bool]:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                runs = await conn.execute(q["release_worker_runs"], params)
                effects = await conn.execute(q["release_worker_effects"], params)
            released = [r[0] for r in await runs.fetchall()], bool(await effects.fetchall())
            if audit is not None and (released[0] or released[1]):
                await conn.execute(q["insert_audit"], audit.params())
            return released

        released, effects = await self._conns.transaction(body)
        self.work_available.set()
        if effects:
            self.effects_available.set()
        return released

    async def retry_run(self, thread_id: str, node: str, audit: Audit | None = None
                        ) -> RunRecord | None:
        rows = await self._conns.audited(self._q["retry_run"], {"thread_id": thread_id, "node": node},
                                   audit, bool)
        if not rows:
            return None
        self.work_available.set()
        return _run(rows[0][:len(RUN_COLUMNS)])

    # -- steps (through the committer) -----------------------------------------------------

    async def record_call(
        self, lease: Lease, step: int, idx: int, name: str, result: bytes,
        args: str | None = None,
    ) -> None:
        params = {"thread_id": lease.thread_id, "epoch": lease.epoch, "step": step, "idx": idx,
                  "name": name, "result": result, "args": args}
        try:
            row = await self._committer.write(self._q["insert_journal"], params, lease.thread_id)
        except StoreUnavailable as lost:  # its reply lost: read back (pg_settle.py)
            row = await settle_call(self._conns, lambda: self._committer.write(
                self._q["insert_journal"], params, lease.thread_id), lease.thread_id, step, idx, lost)
        if not row:
            raise LeaseLost(f"run {lease.thread_id!r}: lease lost before journaling call {idx}")

    async def load_journal(self, thread_id: str, step: int) -> list[JournalRecord]:
        rows = await self._conns.hot_read(
            self._q["load_journal"], {"thread_id": thread_id, "step": step})
        return [JournalRecord(r[0], r[1], r[2], r[3]) for r in rows]

    async def journal_usage(self, thread_id: str, prefix: bytes) -> list[bytes]:
        rows = await self._conns.read(
            self._q["journal_usage"], {"thread_id": thread_id, "prefix": prefix})
        return [bytes(r[0]) for r in rows]

    async def commit_step(self, commit: StepCommit) -> RunRecord | None:
        kind = step_kind(commit)
        if kind is FULL:
            wakes = step_wakes(commit)
            await settle_step(self._conns, lambda: self._full.commit(commit, wakes), commit)
            if wakes.workers:
                self.work_available.set()
            if wakes.dispatchers:
                self.effects_available.set()
            return None
        # One statement, group-committed: commit_step (ADVANCE, the hot path; FINISH; MOVE)
        # or a form of it that also spawns (SPAWN) or wakes (RELEASE).
        params = step_params(commit)
        if kind is SPAWN:
            add_children(params, commit.children)
            query = self._q["commit_step_notify"]
        elif kind is RELEASE:
            query = self._q["commit_step_wake"]
        else:
            query = self._q["commit_step"]
        lease = commit.lease
        write = self._committer.write
        try:  # (the hot path: the write itself, no wrapper)
            row = await write(query, params, lease.thread_id)
        except StoreUnavailable as lost:  # its reply lost: read back (pg_settle.py)
            row = await settle_step(self._conns, lambda: write(query, params, lease.thread_id),
                                    commit, release=kind is RELEASE, lost=lost)
        if not row:
            raise LeaseLost(
                f"run {lease.thread_id!r}: lease lost; step {commit.step} not committed"
            )
        finished: RunRecord | None = None
        if kind is FINISH:
            assert commit.run is not None
            finished = finished_run(commit.run, commit, row[1])  # (thread_id, updated_at)
        elif kind is RELEASE and commit.status in TERMINAL:
            finished = _run(row[:_RUN_WIDTH])
        if wakes_workers(kind):
            self.work_available.set()
        return finished

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
        params = {"thread_id": lease.thread_id, "epoch": lease.epoch, "failures": failures,
                  "wake_at": wake_at, "error": error, "final": final}
        lost = f"run {lease.thread_id!r}: lease lost; failure not recorded"
        if not final:
            if not await self._conns.fetchall(self._q["fail_step"], params):
                raise LeaseLost(lost)
            self.work_available.set()
            return
        q = self._q
        params.update(names=list(compensate), comp_step=COMPENSATION_STEP)

        async def body(conn: Conn) -> None:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                await conn.execute(q["lock_runs"], {  # the run and its parent, in order
                    "ids": [lease.thread_id], "thread_id": lease.thread_id, "parent": True})
                cur = await conn.execute(q["fail_step_final"], params)
            if not await cur.fetchall():
                raise LeaseLost(lost)

        await self._conns.transaction(body)
        if compensate:
            self.effects_available.set()

    async def park_run(self, lease: Lease, park: Park) -> None:
        params = park_params(lease, park)
        lost = f"run {lease.thread_id!r}: lease lost; not parked"
        if park.kind != "join":
            # One fenced statement: group-committed with the other writes in flight.
            if await settle_park(self._conns, lambda: self._committer.write(
                    self._q["park_run"], params, lease.thread_id), lease) is None:
                raise LeaseLost(lost)
        else:
            q, joined = self._q, {"thread_id": lease.thread_id, "children": list(park.children)}

            async def body(conn: Conn) -> None:
                async with conn.pipeline():
                    await conn.execute(BEGIN)
                    cur = await conn.execute(q["park_run"], params)
                    # A later statement: children finished by now are seen (see the query).
                    await conn.execute(q["requeue_if_joined"], joined)
                if not await cur.fetchall():
                    raise LeaseLost(lost)

            await self._conns.transaction(body)
        self.work_available.set()

    async def cancel_run(
        self, thread_id: str, compensate: Sequence[str] = (), audit: Audit | None = None
    ) -> RunRecord | None:
        q = self._q
        params = {"thread_id": thread_id, "names": list(compensate),
                  "comp_step": COMPENSATION_STEP}

        async def body(conn: Conn) -> RunRecord | None:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                await conn.execute(q["lock_tree"], {"thread_id": thread_id})
                cancelled = await conn.execute(q["cancel_tree"], params)
                cur = await conn.execute(q["get_run"], {"thread_id": thread_id})
            row = await cur.fetchone()
            if audit is not None and await cancelled.fetchall():
                await conn.execute(q["insert_audit"], audit.params())
            return None if row is None else _run(row)

        run = await self._conns.transaction(body)
        self.work_available.set()
        if compensate:
            self.effects_available.set()
        return run

    # -- mail ------------------------------------------------------------------------------

    async def send_message(
        self, thread_id: str, message: bytes, sender: str | None = None,
        audit: Audit | None = None,
    ) -> int:
        return await self._sends.send(thread_id, message, sender, audit)  # (pg_send.py)

    async def load_inbox(self, thread_id: str, limit: int = INBOX_LIMIT) -> list[MessageRecord]:
        rows = await self._conns.hot_read(
            self._q["load_inbox"], {"thread_id": thread_id, "limit": limit})
        return [MessageRecord(*r) for r in rows]

    async def sent_mail(self, sender: str, limit: int = 100) -> list[SentRecord]:
        rows = await self._conns.read(self._q["sent_mail"], {"sender": sender, "limit": limit})
        return [SentRecord(*r) for r in rows]

    async def with_mail(self, thread_ids: Sequence[str]) -> set[str]:
        return {r[0] for r in await self._conns.read(self._q["with_mail"], {"ids": list(thread_ids)})}

    async def load_claimed(self, runs: Sequence[RunRecord]) -> dict[str, ClaimedReads]:
        return await load_claimed(self._conns, runs)

    async def inbox_depth(self, thread_id: str) -> int:
        row = await self._conns.hot_read_one(self._q["inbox_depth"], {"thread_id": thread_id})
        return int(row[0]) if row is not None else 0

    async def group_members(self, group: str) -> list[str]:
        rows = await self._conns.read(self._q["group_members"], {"group_name": group})
        return [r[0] for r in rows]

    # -- interrupts ------------------------------------------------------------------------

    async def resume_interrupt(
        self, thread_id: str, value: bytes, interrupt_id: str | None = None,
        audit: Audit | None = None,
    ) -> InterruptRecord | None:
        params = {"thread_id": thread_id, "value": value, "id": interrupt_id,
                  "name": INTERRUPT_CALL}
        # One statement, group-committed (an audited one with its audit row): concurrent
        # resumes of many runs share a commit; two answers to one interrupt in one batch see
        # each other (the second finds none).
        query = self._q["resume_interrupt"]
        if audit is not None:
            query = self._q["resume_interrupt_audited"]
            params.update(audit.prefixed())
        row = await settle_resume(self._conns, lambda: self._committer.write(
            query, params, thread_id), thread_id, value, interrupt_id)
        if row is None:
            return None
        self.work_available.set()
        return InterruptRecord(*row[:9])

    async def get_interrupt(self, interrupt_id: str) -> InterruptRecord | None:
        row = await self._conns.hot_read_one(self._q["get_interrupt"], {"id": interrupt_id})
        return None if row is None else InterruptRecord(*row)

    async def list_interrupts(
        self, *, thread_id: str | None = None, status: str | None = "pending", limit: int = 100
    ) -> list[InterruptRecord]:
        params = {"thread_id": thread_id, "status": status, "limit": limit}
        return [InterruptRecord(*r) for r in await self._conns.read(self._q["list_interrupts"], params)]

    # -- outbox ----------------------------------------------------------------------------

    async def claim_effects(
        self, worker: str, names: Sequence[str], limit: int, lease_ttl: float
    ) -> list[EffectRecord]:
        params: Params = {"worker": worker, "names": list(names), "ttl": float(lease_ttl)}
        claimed: list[EffectRecord] = []
        for _ in range(_CLAIM_ROUNDS):
            want = limit - len(claimed)
            params.update(limit=want, visit=2 * want + 100, after=self._fx_after)
            found = visited = 0
            for r in await self._conns.fetchall(self._q["claim_effects"], params):
                if r[0] is None:  # the last row: where the walk stopped
                    self._fx_after, visited, found = r[15], r[16], r[17]
                else:
                    claimed.append(EffectRecord(*r[:15]))
            # Stop when every run was visited, or enough due heads were found.
            if visited < params["visit"] or found >= want or len(claimed) >= limit:
                break
        return claimed

    async def complete_effect(self, effect: EffectRecord, result: bytes) -> bool:
        # Coalesced: the marks of one event-loop iteration, or made while a batch of them is
        # written, go in one statement (complete_effects).
        return await self._done_marks.mark(effect, result)

    async def complete_effects(self, items: Sequence[tuple[EffectRecord, bytes]]) -> list[bool]:
        if not items:
            return []
        params = {"thread_ids": [e.thread_id for e, _ in items],
                  "keys": [e.key for e, _ in items],
                  "epochs": [e.epoch for e, _ in items],
                  "results": [result for _, result in items]}
        return await settle_done_marks(self._conns, params)  # a reply lost: read back

    async def renew_effect_leases(self, worker: str, lease_ttl: float) -> None:
        params = {"worker": worker, "ttl": float(lease_ttl)}
        await self._conns.fetchall(self._q["renew_effect_leases"], params, idempotent=True)

    async def run_statuses(self, thread_ids: Sequence[str]) -> dict[str, str]:
        rows = await self._conns.read(self._q["run_statuses"], {"ids": list(thread_ids)})
        return {r[0]: r[1] for r in rows}

    async def fail_effect(self, effect: EffectRecord, error: str, delay: float | None) -> bool:
        params = {"thread_id": effect.thread_id, "key": effect.key, "epoch": effect.epoch,
                  "error": error, "delay": delay}
        ok = bool(await self._conns.fetchall(self._q["fail_effect"], params))
        if ok and delay is not None:
            self.effects_available.set()
        return ok

    async def get_effect(self, thread_id: str, key: str) -> EffectRecord | None:
        row = await self._conns.hot_read_one(
            self._q["get_effect"], {"thread_id": thread_id, "key": key})
        return None if row is None else EffectRecord(*row)

    async def list_effects(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[EffectRecord]:
        params = {"thread_id": thread_id, "status": status, "limit": limit}
        return [EffectRecord(*r) for r in await self._conns.read(self._q["list_effects"], params)]

    async def retry_effect(self, key: str, thread_id: str | None = None,
                           audit: Audit | None = None) -> list[EffectRecord]:
        rows = await self._conns.audited(self._q["retry_effect"], {"key": key, "thread_id": thread_id},
                                   audit, bool)
        if rows:
            self.effects_available.set()
        return [EffectRecord(*r[:15]) for r in rows]

    # -- checkpoints -----------------------------------------------------------------------

    async def load_checkpoints(
        self, thread_id: str, upto: int | None = None
    ) -> list[CheckpointRecord]:
        params = {"thread_id": thread_id, "upto": _NO_LIMIT if upto is None else upto}
        return [_checkpoint(r) for r in await self._conns.hot_read(self._q["load_checkpoints"], params)]

    async def checkpoints(self, thread_id: str) -> list[CheckpointRecord]:
        rows = await self._conns.read(self._q["checkpoints"], {"thread_id": thread_id})
        return [_checkpoint(r) for r in rows]

    async def measure(self, window: float) -> LoadStats:
        async def query(name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in await self._conns.read(self._q[name], dict(params))]

        return await measure_load(query, await self.now(), window)

    async def status_counts(self, cap: int | None = None) -> StatusCounts:  # capped: versions first
        versions = [r[0] for r in await self._conns.read(self._q["open_versions"])] if cap else []
        rows = await (self._conns.read_by_index if cap else self._conns.read)(  # capped: pages
            self._q["status_counts_capped" if cap else "status_counts"], {"cap": cap, "versions": versions})
        return StatusCounts.from_rows([tuple(r) for r in rows])

    async def list_audit(self, *, thread_id: str | None = None, action: str | None = None,
                         limit: int = 100, before: int | None = None) -> list[AuditRecord]:
        params = {"thread_id": thread_id, "action": action, "limit": limit, "before": before}
        return [AuditRecord(*r) for r in await self._conns.read(self._q["list_audit"], params)]
