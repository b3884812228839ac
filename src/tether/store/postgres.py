"""Postgres store: any number of workers on any number of machines share one database.

The store is three modules, one class each: pg_io.py (PgIO) holds the settings, the
connections, error translation, coalesced reads, transactions and the LISTEN/NOTIFY listener;
pg_commit.py (PgCommitter) the group-commit writer; this module PostgresStore, the Store
protocol's methods on top of them.

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
from collections import deque
from collections.abc import Sequence
from typing import Final

import orjson
import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from ..errors import (
    DuplicateEffectKey,
    EffectError,
    LeaseLost,
    RunConflict,
    RunNotFound,
    SchemaError,
    StoreError,
    StoreUnavailable,
)
from .base import (
    COMPENSATION_STEP,
    INTERRUPT_CALL,
    RUN_COLUMNS,
    SLEEP_CALL,
    TERMINAL,
    CheckpointRecord,
    EffectRecord,
    InterruptRecord,
    JournalRecord,
    Lease,
    MessageRecord,
    NewRun,
    Park,
    RunRecord,
    StepCommit,
    finished_run,
    new_run_params,
    same_run,
)
from .migrate import behind_message, latest, migrations
from .pg_commit import PgCommitter
from .pg_io import (
    _BEGIN,
    CHANNEL,
    EFFECTS_CHANNEL,
    Conn,
    Params,
    _TxBody,
    redact_url,
)

__all__ = ["CHANNEL", "EFFECTS_CHANNEL", "PostgresStore", "redact_url"]

_MIGRATE_LOCK: Final = 0x7465746865720001  # b"tether\0\1": one key for every tether database
_NO_LIMIT: Final = 2**62
_NEW_RUN_FIELDS: Final = tuple(NewRun.__dataclass_fields__)  # a child run's parameters
_CLAIM_ROUNDS: Final = 4  # claim_effects statements per call at most (each visits 2*limit+100 runs)
_DONE_BATCH: Final = 1000  # done marks per complete_effects statement


def _run(row: TupleRow) -> RunRecord:
    return RunRecord(*row)


_RUN_WIDTH = len(RUN_COLUMNS)


def _checkpoint(row: TupleRow) -> CheckpointRecord:
    return CheckpointRecord(*row)


class PostgresStore(PgCommitter):
    dialect = "postgres"

    def __repr__(self) -> str:
        return f"PostgresStore({self.safe_url!r})"

    # -- lifecycle (close() is PgIO's, in pg_io.py) ---------------------------------------

    async def open(self, *, check_schema: bool = True) -> None:
        if self._pool is not None:
            return
        # A direct connection first: it fails fast, with the server's reason (refused, no such
        # database, bad password); a pool would only report a timeout.
        try:
            async with asyncio.timeout(self.connect_timeout + 1.0):
                self._listen_conn = await self._connect_listener()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            reason = (f"no answer within {self.connect_timeout:g} s"
                      if isinstance(exc, TimeoutError) else self._message(exc))
            raise StoreUnavailable(
                f"cannot connect to Postgres at {self.safe_url}: {reason}"
            ) from exc
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self._conninfo,
            kwargs={"autocommit": True},
            min_size=self.min_size,
            max_size=self.max_size,
            timeout=self.pool_timeout,
            name="tether",
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=self.connect_timeout + 1.0)
        except (psycopg.Error, OSError) as exc:
            await pool.close()
            await self._listen_conn.close()
            self._listen_conn = None
            raise StoreUnavailable(
                f"cannot open a connection pool to Postgres at {self.safe_url}: "
                f"{self._message(exc)}"
            ) from exc
        self._pool = pool
        if check_schema:
            try:
                current, target = await self.schema_version()
            except BaseException:
                await self.close()
                raise
            if current < target:
                await self.close()
                raise SchemaError(behind_message(current, target, self.safe_url))
        self._accepting = True
        self._wake.clear()
        for i, writer in enumerate(self._writers):
            writer.lost = False
            self._committers.append(asyncio.create_task(
                self._commit_loop(writer), name=f"tether-pg-committer-{i}"))
        self._listener = asyncio.create_task(self._listen_loop(), name="tether-pg-listener")

    # -- schema ----------------------------------------------------------------------------

    async def schema_version(self) -> tuple[int, int]:
        pool, q = self._need_pool(), self._q
        try:
            async with pool.connection() as conn:
                row = await (await conn.execute(q["schema_table"])).fetchone()
                current = 0
                if row is not None and row[0]:
                    row = await (await conn.execute(q["schema_applied"])).fetchone()
                    current = int(row[0]) if row is not None else 0
        except psycopg.Error as exc:
            raise self._error(exc) from exc
        return current, latest("postgres")

    async def migrate(self) -> list[int]:
        pool, q = self._need_pool(), self._q
        done: list[int] = []
        try:
            async with pool.connection() as conn, conn.transaction():
                # Taken before anything else: a second migrator waits here, then sees our work.
                await conn.execute(q["migrate_lock"], {"key": _MIGRATE_LOCK})
                await conn.execute(q["create_schema_version"])
                row = await (await conn.execute(q["schema_applied"])).fetchone()
                current = int(row[0]) if row is not None else 0
                for mig in migrations("postgres"):
                    if mig.version <= current:
                        continue
                    await conn.execute(mig.sql.encode())  # no params: sent as one script
                    await conn.execute(
                        q["record_migration"], {"version": mig.version, "name": mig.name}
                    )
                    done.append(mig.version)
        except psycopg.Error as exc:
            err = self._error(exc)
            raise type(err)(f"migrating {self.safe_url} failed: {err}") from exc
        return done

    async def now(self) -> float:
        row = await self._read_one(self._q["now"])
        assert row is not None
        return float(row[0])

    # -- runs ------------------------------------------------------------------------------

    async def create_run(
        self, new: NewRun, lease: tuple[str, float] | None = None
    ) -> tuple[RunRecord, bool]:
        # Through the writer: concurrent starts are group-committed like steps.
        row = await self._write(self._q["create_run"], new_run_params(new, lease), new.thread_id)
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
            found = await self._read_one(self._q["get_run_by_key"], {"key": new.idempotency_key})
            if found is not None:
                return same_run(_run(found), new, "idempotency key"), False
        found = await self._read_one(self._q["get_run"], {"thread_id": new.thread_id})
        if found is None:
            raise RunConflict(f"thread_id {new.thread_id!r} or idempotency key "
                              f"{new.idempotency_key!r} is being used by a concurrent start")
        return same_run(_run(found), new, "thread_id"), False

    async def get_run(self, thread_id: str) -> RunRecord | None:
        row = await self._hot_read_one(self._q["get_run"], {"thread_id": thread_id})
        return None if row is None else _run(row)

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        params = {
            "status": status,
            "agent": agent,
            "limit": limit,
            "before_ts": before[0] if before else None,
            "before_id": before[1] if before else None,
        }
        return [_run(r) for r in await self._read(self._q["list_runs"], params)]

    # -- leases ----------------------------------------------------------------------------

    async def claim_runs(
        self, worker: str, version: str, agents: Sequence[str], limit: int, lease_ttl: float
    ) -> list[RunRecord]:
        params = {
            "worker": worker,
            "version": version,
            "agents": list(agents),
            "limit": limit,
            "ttl": float(lease_ttl),
        }
        return [_run(r) for r in await self._fetchall(self._q["claim_runs"], params)]

    async def renew_leases(self, worker: str, lease_ttl: float) -> set[str]:
        params = {"worker": worker, "ttl": float(lease_ttl)}
        rows = await self._fetchall(self._q["renew_leases"], params, idempotent=True)
        return {r[0] for r in rows}

    async def release_runs(self, leases: Sequence[Lease]) -> None:
        if not leases:
            return
        params = {
            "thread_ids": [le.thread_id for le in leases],
            "epochs": [le.epoch for le in leases],
        }
        await self._fetchall(self._q["release_runs"], params, idempotent=True)
        self.work_available.set()

    # -- steps (through the committer) -----------------------------------------------------

    async def record_call(
        self, lease: Lease, step: int, idx: int, name: str, result: bytes
    ) -> None:
        params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "step": step,
            "idx": idx,
            "name": name,
            "result": result,
        }
        if not await self._write(self._q["insert_journal"], params, lease.thread_id):
            raise LeaseLost(f"run {lease.thread_id!r}: lease lost before journaling call {idx}")

    async def load_journal(self, thread_id: str, step: int) -> list[JournalRecord]:
        rows = await self._hot_read(
            self._q["load_journal"], {"thread_id": thread_id, "step": step})
        return [JournalRecord(r[0], r[1], r[2]) for r in rows]

    async def commit_step(self, commit: StepCommit) -> RunRecord | None:
        lease, terminal = commit.lease, commit.status in TERMINAL
        finished: RunRecord | None = None
        if (commit.effects or commit.messages or commit.consumed or commit.groups
                or commit.waiting_for == "mail"):
            body, commits = self._commit_tx(commit, terminal)
            await self._transaction(body, body_commits=commits)
        else:
            params = _step_params(commit)
            run = commit.run
            ends: RunRecord | None = None  # a run without a parent, finished by this step
            if commit.children:
                _add_children(params, commit.children)
                query = self._q["commit_step_notify"]
            elif commit.status == "completed" and run is not None and run.parent_thread_id is None:
                # Nobody to wake: a plain commit_step, its record built from the claimed one.
                query, ends = self._q["commit_step"], run
            elif commit.status == "queued" or terminal:
                query = self._q["commit_step_wake"]
            else:
                query = self._q["commit_step"]  # the hot path: one statement, group-committed
            row = await self._write(query, params, lease.thread_id)
            if not row:
                raise LeaseLost(
                    f"run {lease.thread_id!r}: lease lost; step {commit.step} not committed"
                )
            if ends is not None:
                finished = finished_run(ends, commit, row[1])
            elif terminal and query is self._q["commit_step_wake"]:
                finished = _run(row[:_RUN_WIDTH])
        if commit.children or commit.messages or commit.status == "queued" or terminal:
            self.work_available.set()
        if commit.effects:
            self.effects_available.set()
        return finished

    def _commit_tx(self, commit: StepCommit, terminal: bool) -> tuple[_TxBody[None], bool]:
        """A step carrying mail, effects, groups, or waking another run: one transaction that
        locks every run row it touches first (lock_runs), then writes (commit_step_tx), then
        wakes (wake_after_commit), in three statements and as few round trips. Unless a
        transactional effect must run in it, the COMMIT goes in the same pipeline: one round
        trip, so the locks on the rows of the run's recipients are held for one round trip,
        not two. That is safe because a step that must not commit (lease lost, an effect key
        used before, an unknown recipient) writes nothing: commit_step_tx and
        wake_after_commit check it on the server; the results read afterwards say which
        error to raise. (body, whether it commits)."""
        q, tid = self._q, commit.lease.thread_id
        params = _step_params(commit)
        _add_children(params, commit.children)
        roles = dict(commit.groups)  # the last role given for a group wins
        params["g_names"], params["g_roles"] = list(roles), list(roles.values())
        params["consumed"] = list(commit.consumed)
        effects = commit.effects
        params["e_keys"] = [e.key for e in effects]
        params["e_idxs"] = [e.idx for e in effects]
        params["e_names"] = [e.name for e in effects]
        params["e_payloads"] = [e.payload for e in effects]
        params["e_statuses"] = ["pending" if e.apply is None else "done" for e in effects]
        params["e_compensables"] = [e.compensable for e in effects]
        applied = [e for e in effects if e.apply is not None]
        if len(set(params["e_keys"])) < len(effects):
            raise DuplicateEffectKey(f"run {tid!r}: an effect key is used twice in one step")
        direct = sorted({m.recipient for m in commit.messages if m.recipient is not None})
        params["direct"] = direct
        groups = sorted({m.group for m in commit.messages
                         if m.recipient is None and m.group is not None})

        async def body(conn: Conn) -> None:
            members: dict[str, list[str]] = {}
            if groups:
                async with conn.pipeline():
                    await conn.execute(_BEGIN)
                    cur = await conn.execute(q["group_recipients"],
                                             {"groups": groups, "thread_id": tid})
                for group, member in await cur.fetchall():
                    members.setdefault(group, []).append(member)
            sent = [(rcpt, m.message) for m in commit.messages
                    for rcpt in ([m.recipient] if m.recipient is not None
                                 else members.get(m.group or "", []))]
            params["m_recipients"] = [rcpt for rcpt, _ in sent]
            params["m_messages"] = [message for _, message in sent]
            recipients = sorted({rcpt for rcpt, _ in sent})
            wake = {"recipients": recipients, "thread_id": tid, "epoch": params["epoch"],
                    "step": params["step"], "parent": terminal,
                    "mail": commit.waiting_for == "mail",
                    "notify": bool(commit.children or sent or commit.status == "queued"),
                    "effects": len(applied) < len(effects)}
            async with conn.pipeline():
                if not groups:
                    await conn.execute(_BEGIN)
                c_lock = await conn.execute(q["lock_runs"], {
                    "ids": [tid, *recipients], "thread_id": tid, "parent": terminal})
                c_taken = (await conn.execute(q["effect_keys_taken"], {
                    "thread_id": tid, "keys": params["e_keys"]}) if effects else None)
                c_step = await conn.execute(q["commit_step_tx"], params)
                if not applied:
                    await conn.execute(q["wake_after_commit"], wake)
                    await conn.execute(b"COMMIT")
            if c_taken is not None and (taken := await c_taken.fetchall()):
                raise DuplicateEffectKey(
                    f"run {tid!r}: effect key {taken[0][0]!r} was already used "
                    "in this run; explicit effect keys must be unique within a run")
            locked = {r[0]: r for r in await c_lock.fetchall()}
            own = locked.get(tid)
            lost = LeaseLost(f"run {tid!r}: lease lost; step {commit.step} not committed")
            if own is None or own[1] != params["epoch"] or own[2] != "running":
                raise lost
            if missing := [r for r in direct if r not in locked]:
                raise RunNotFound(f"run {tid!r} sent a message to unknown thread_id "
                                  f"{missing[0]!r}")
            if c_step.rowcount < 1:  # no check above explains it
                raise lost
            for e in applied:
                assert e.apply is not None
                try:
                    await e.apply(conn, e.payload, e.key)
                except Exception as exc:
                    raise EffectError(f"transactional effect {e.name!r} failed: {exc!r}") from exc
            if applied:
                await conn.execute(q["wake_after_commit"], wake)

        return body, not applied

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
        params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "failures": failures,
            "wake_at": wake_at,
            "error": error,
            "final": final,
        }
        lost = f"run {lease.thread_id!r}: lease lost; failure not recorded"
        if not final:
            if not await self._fetchall(self._q["fail_step"], params):
                raise LeaseLost(lost)
            self.work_available.set()
            return
        q = self._q
        params.update(names=list(compensate), comp_step=COMPENSATION_STEP)

        async def body(conn: Conn) -> None:
            async with conn.pipeline():
                await conn.execute(_BEGIN)
                await conn.execute(q["lock_runs"], {  # the run and its parent, in order
                    "ids": [lease.thread_id], "thread_id": lease.thread_id, "parent": True})
                cur = await conn.execute(q["fail_step_final"], params)
            if not await cur.fetchall():
                raise LeaseLost(lost)

        await self._transaction(body)
        if compensate:
            self.effects_available.set()

    async def park_run(self, lease: Lease, park: Park) -> None:
        waiting = park.kind != "sleep"
        params: Params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "status": "waiting" if waiting else "sleeping",
            "waiting_for": park.kind if waiting else None,
            "seconds": None if waiting else park.seconds,
            "kind": park.kind,
            "step": park.step,
            "idx": park.idx,
            "interrupt_id": park.interrupt_id,
            "payload": park.payload,
            "sleep_name": SLEEP_CALL,
            "timer": None if waiting else orjson.dumps(park.seconds),
        }
        _add_children(params, park.spawn)
        lost = f"run {lease.thread_id!r}: lease lost; not parked"
        if park.kind != "join":
            # One fenced statement: group-committed with the other writes in flight.
            if await self._write(self._q["park_run"], params, lease.thread_id) is None:
                raise LeaseLost(lost)
        else:
            q, joined = self._q, {"thread_id": lease.thread_id, "children": list(park.children)}

            async def body(conn: Conn) -> None:
                async with conn.pipeline():
                    await conn.execute(_BEGIN)
                    cur = await conn.execute(q["park_run"], params)
                    # A later statement: children finished by now are seen (see the query).
                    await conn.execute(q["requeue_if_joined"], joined)
                if not await cur.fetchall():
                    raise LeaseLost(lost)

            await self._transaction(body)
        self.work_available.set()

    async def cancel_run(
        self, thread_id: str, compensate: Sequence[str] = ()
    ) -> RunRecord | None:
        q = self._q
        params = {"thread_id": thread_id, "names": list(compensate),
                  "comp_step": COMPENSATION_STEP}

        async def body(conn: Conn) -> RunRecord | None:
            async with conn.pipeline():
                await conn.execute(_BEGIN)
                await conn.execute(q["lock_tree"], {"thread_id": thread_id})
                await conn.execute(q["cancel_tree"], params)
                cur = await conn.execute(q["get_run"], {"thread_id": thread_id})
            row = await cur.fetchone()
            return None if row is None else _run(row)

        run = await self._transaction(body)
        self.work_available.set()
        if compensate:
            self.effects_available.set()
        return run

    # -- mail ------------------------------------------------------------------------------

    async def send_message(
        self, thread_id: str, message: bytes, sender: str | None = None
    ) -> int:
        q = self._q

        async def body(conn: Conn) -> int:
            async with conn.pipeline():
                await conn.execute(_BEGIN)
                await conn.execute(q["lock_runs"], {
                    "ids": [thread_id], "thread_id": thread_id, "parent": False})
                cur = await conn.execute(q["send_message"], {
                    "thread_id": thread_id, "sender": sender, "message": message})
            row = await cur.fetchone()
            if row is None:
                raise RunNotFound(f"no run with thread_id {thread_id!r}")
            return int(row[0])

        mid = await self._transaction(body)
        self.work_available.set()
        return mid

    async def load_inbox(self, thread_id: str, limit: int = 1000) -> list[MessageRecord]:
        rows = await self._hot_read(
            self._q["load_inbox"], {"thread_id": thread_id, "limit": limit})
        return [MessageRecord(*r) for r in rows]

    async def inbox_depth(self, thread_id: str) -> int:
        row = await self._hot_read_one(self._q["inbox_depth"], {"thread_id": thread_id})
        return int(row[0]) if row is not None else 0

    async def group_members(self, group: str) -> list[str]:
        rows = await self._read(self._q["group_members"], {"group_name": group})
        return [r[0] for r in rows]

    # -- interrupts ------------------------------------------------------------------------

    async def resume_interrupt(
        self, thread_id: str, value: bytes, interrupt_id: str | None = None
    ) -> InterruptRecord | None:
        params = {"thread_id": thread_id, "value": value, "id": interrupt_id,
                  "name": INTERRUPT_CALL}
        # One statement, group-committed: concurrent resumes of many runs share a commit;
        # two answers to one interrupt in one batch see each other (the second finds none).
        row = await self._write(self._q["resume_interrupt"], params, thread_id)
        if row is None:
            return None
        self.work_available.set()
        return InterruptRecord(*row[:9])

    async def get_interrupt(self, interrupt_id: str) -> InterruptRecord | None:
        row = await self._hot_read_one(self._q["get_interrupt"], {"id": interrupt_id})
        return None if row is None else InterruptRecord(*row)

    async def list_interrupts(
        self, *, thread_id: str | None = None, status: str | None = "pending", limit: int = 100
    ) -> list[InterruptRecord]:
        params = {"thread_id": thread_id, "status": status, "limit": limit}
        return [InterruptRecord(*r) for r in await self._read(self._q["list_interrupts"], params)]

    # -- outbox ----------------------------------------------------------------------------

    # Effect dispatch: claim_effects walks runs round robin from the last one it visited; done
    # marks (complete_effect) made while a batch of them is written go together in the next.
    _fx_after: str = ""
    _fx_done: deque[tuple[EffectRecord, bytes, asyncio.Future[bool]]] | None = None
    _fx_flusher: asyncio.Task[None] | None = None

    async def claim_effects(
        self, worker: str, names: Sequence[str], limit: int, lease_ttl: float
    ) -> list[EffectRecord]:
        params: Params = {"worker": worker, "names": list(names), "ttl": float(lease_ttl)}
        claimed: list[EffectRecord] = []
        for _ in range(_CLAIM_ROUNDS):
            want = limit - len(claimed)
            params.update(limit=want, visit=2 * want + 100, after=self._fx_after)
            found = visited = 0
            for r in await self._fetchall(self._q["claim_effects"], params):
                if r[0] is None:  # the last row: where the walk stopped
                    self._fx_after, visited, found = r[15], r[16], r[17]
                else:
                    claimed.append(EffectRecord(*r[:15]))
            # Stop when every run was visited, or enough due heads were found.
            if visited < params["visit"] or found >= want or len(claimed) >= limit:
                break
        return claimed

    async def complete_effect(self, effect: EffectRecord, result: bytes) -> bool:
        # Coalesced: the marks of one event-loop iteration, or made while a batch is being
        # written, go in one statement (complete_effects).
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._fx_done is None:
            self._fx_done = deque()
        self._fx_done.append((effect, result, fut))
        if self._fx_flusher is None or self._fx_flusher.done():
            self._fx_flusher = asyncio.create_task(self._flush_done_marks(),
                                                   name="tether-pg-effects-done")
        return await fut

    async def _flush_done_marks(self) -> None:
        """Write the queued done marks, up to _DONE_BATCH per statement, until none are left;
        each caller gets its own row's answer, or the error of its batch."""
        queue = self._fx_done
        assert queue is not None
        batch: list[tuple[EffectRecord, bytes, asyncio.Future[bool]]] = []
        try:
            while queue:
                batch = [queue.popleft() for _ in range(min(len(queue), _DONE_BATCH))]
                try:
                    done = await self.complete_effects([(e, r) for e, r, _ in batch])
                except Exception as exc:
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, _, fut), ok in zip(batch, done, strict=True):
                    if not fut.done():
                        fut.set_result(ok)
            batch = []
        finally:  # cancelled: nobody is left waiting for an answer
            for _, _, fut in [*batch, *queue]:
                if not fut.done():
                    fut.set_exception(StoreError("the store stopped before the done mark"))
            queue.clear()

    async def complete_effects(self, items: Sequence[tuple[EffectRecord, bytes]]) -> list[bool]:
        if not items:
            return []
        params = {"thread_ids": [e.thread_id for e, _ in items],
                  "keys": [e.key for e, _ in items],
                  "epochs": [e.epoch for e, _ in items],
                  "results": [result for _, result in items]}
        rows = await self._fetchall(self._q["complete_effects"], params)
        out = [False] * len(items)
        for (i,) in rows:
            out[i - 1] = True
        return out

    async def renew_effect_leases(self, worker: str, lease_ttl: float) -> None:
        params = {"worker": worker, "ttl": float(lease_ttl)}
        await self._fetchall(self._q["renew_effect_leases"], params, idempotent=True)

    async def run_statuses(self, thread_ids: Sequence[str]) -> dict[str, str]:
        rows = await self._read(self._q["run_statuses"], {"ids": list(thread_ids)})
        return {r[0]: r[1] for r in rows}

    async def fail_effect(self, effect: EffectRecord, error: str, delay: float | None) -> bool:
        params = {"thread_id": effect.thread_id, "key": effect.key, "epoch": effect.epoch,
                  "error": error, "delay": delay}
        ok = bool(await self._fetchall(self._q["fail_effect"], params))
        if ok and delay is not None:
            self.effects_available.set()
        return ok

    async def get_effect(self, thread_id: str, key: str) -> EffectRecord | None:
        row = await self._hot_read_one(
            self._q["get_effect"], {"thread_id": thread_id, "key": key})
        return None if row is None else EffectRecord(*row)

    async def list_effects(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[EffectRecord]:
        params = {"thread_id": thread_id, "status": status, "limit": limit}
        return [EffectRecord(*r) for r in await self._read(self._q["list_effects"], params)]

    async def retry_effect(self, key: str, thread_id: str | None = None) -> list[EffectRecord]:
        rows = await self._fetchall(self._q["retry_effect"], {"key": key, "thread_id": thread_id})
        if rows:
            self.effects_available.set()
        return [EffectRecord(*r[:15]) for r in rows]

    # -- checkpoints -----------------------------------------------------------------------

    async def load_checkpoints(
        self, thread_id: str, upto: int | None = None
    ) -> list[CheckpointRecord]:
        params = {"thread_id": thread_id, "upto": _NO_LIMIT if upto is None else upto}
        return [_checkpoint(r) for r in await self._hot_read(self._q["load_checkpoints"], params)]

    async def checkpoints(self, thread_id: str) -> list[CheckpointRecord]:
        rows = await self._read(self._q["checkpoints"], {"thread_id": thread_id})
        return [_checkpoint(r) for r in rows]


def _step_params(commit: StepCommit) -> Params:
    lease = commit.lease
    return {
        "thread_id": lease.thread_id,
        "epoch": lease.epoch,
        "step": commit.step,
        "node": commit.node,
        "next_node": commit.next_node,
        "kind": commit.kind,
        "data": commit.data,
        "worker": lease.worker,
        "attempt": commit.attempt,
        "started_at": commit.started_at,
        "finished_at": commit.finished_at,
        "status": commit.status,
        "wake_at": commit.wake_at,
        "waiting_for": commit.waiting_for,
    }


def _add_children(params: Params, children: Sequence[NewRun]) -> None:
    """The children as one array per field: commit_step_notify unnests them."""
    for name in _NEW_RUN_FIELDS:
        params["c_" + name] = [getattr(child, name) for child in children]

