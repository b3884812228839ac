"""TetherSaver: a LangGraph checkpointer on tether's database and migrations.

    async with TetherSaver.from_conn_string("sqlite:///tether.db") as saver:
        await saver.setup()                       # tether's migrations (0005: LangGraph's tables)
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "t1"}})

    with TetherSaver.from_conn_string("postgresql://...") as saver:   # sync graphs
        saver.setup()
        graph.invoke(inputs, config)

The logic is written once, as coroutines. Async methods run them on the event loop the saver
was opened on (called on another loop, they hand their coroutine to that one). Sync methods
(from any thread but the saver's loop) drive the same coroutines in the calling thread
(_rows.drive): the rows then do blocking I/O on connections kept for such calls, so a sync
graph's put costs no hand-over between threads. `with` opens the saver on a private loop in a
daemon thread (setup() runs there), so sync graphs need no loop of their own.

Storage (migration 0005): one row per checkpoint, holding its small scalar channel values
(None, bools, numbers, short strings) and not the others; one row per version of each other
channel (a value unchanged since the last checkpoint is not written again; a list that only
grew is written as the items it gained, see _blobs.py); pending writes deduplicated by
(task_id, idx) so a task's writes are stored once, special writes (ERROR, INTERRUPT, ...)
replacing the task's earlier ones (SQLite: a row per write; Postgres, migration 0009: a row
per task, its writes packed). Checkpoint and blob values go through `self.serde`; metadata is
JSON, filterable on any key.

Loading is strict (_strict.py): a row is data anyone with write access to the database can
change, and LangGraph's default serializer imports and calls whatever a row names. The saver
rebuilds only LangGraph's own types and the application's `allowed_types`; a row naming
anything else is an error naming the type, and nothing is imported. `serde=` replaces that
serializer with the application's own, which then decides alone what it loads.
"""

from __future__ import annotations

import asyncio
import copy
import random
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Collection,
    Coroutine,
    Generator,
    Iterator,
    Sequence,
)
from types import TracebackType
from typing import Any, TypeVar

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..errors import ConfigError, InvalidState, SerializationError, StoreError
from ..extras import requires_extra
from ._blobs import BlobCache, BlobRows, assemble, garbage, pack, unpack
from ._rows import INLINE, CheckpointRow, Rows, drive
from ._strict import strict_serde

__all__ = ["TetherSaver"]

T = TypeVar("T")
# The class's `list` method hides the builtin inside it.
_Tuples = list[CheckpointTuple]
_Keys = list[tuple[str, str]]
_STRATEGIES = ("keep_latest", "delete")


def _rows_for(url: str, pool_size: int) -> Rows:
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"malformed DB URL {url!r}: expected sqlite:///path.db, "
                          "sqlite:///:memory: or postgresql://user@host:port/db")
    scheme = url.split("://", 1)[0].lower()
    if scheme == "sqlite":
        from ._sqlite import SQLiteRows

        return SQLiteRows(url)
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        with requires_extra("postgres", "TetherSaver on Postgres"):
            from ._postgres import PostgresRows

        return PostgresRows(url, pool_size=pool_size)
    raise ConfigError(f"unsupported DB URL scheme {scheme!r}: use sqlite:/// or postgresql://")


_INLINE_STR = 128


def _inline(value: Any) -> bool:
    """Stored in the checkpoint's own row, not as a blob: a value smaller than a blob row."""
    kind = type(value)
    return (value is None or kind is bool or kind is float
            or (kind is int and -(1 << 63) <= value < 1 << 64)
            or (kind is str and len(value) <= _INLINE_STR))


def _vkey(version: str | int | float) -> str:
    """A channel version as blob key text (versions are compared as values elsewhere)."""
    return version if isinstance(version, str) else repr(version)


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                             "checkpoint_id": checkpoint_id}}


def _where(config: RunnableConfig) -> tuple[str, str]:
    conf = config.get("configurable") or {}
    if conf.get("thread_id") is None:
        raise ValueError("the config has no configurable.thread_id")
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns") or "")


class _Done:
    """What setup() returns once it has run synchronously: awaiting it does nothing."""

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


class _LoopThread:
    """A private event loop in a daemon thread, for a saver used by sync graphs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever,
                                        name="tether-langgraph-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class TetherSaver(BaseCheckpointSaver[float]):
    """A LangGraph checkpointer on tether's store: `sqlite:///path.db`, `sqlite:///:memory:`
    or `postgresql://...` (`pool_size`: Postgres connections kept, 4 by default).

    A checkpoint is on disk when put returns (SQLite synchronous=FULL unless the URL says
    otherwise; Postgres synchronous_commit=on). Pending writes are committed without waiting
    for the disk unless `sync_writes=True`: the database has them when put_writes returns, so
    a crash of the process running the graph loses none; the next checkpoint's flush makes
    them durable; only a crash of the database's host in between (Postgres flushes within
    ~0.2 s anyway) can lose them, and LangGraph then runs those tasks again.

    Values are read back by tether's StrictSerializer: LangGraph's own types (messages, Send,
    Interrupt, Command, datetimes...) and the classes in `allowed_types` (the pydantic models,
    dataclasses, enums and named tuples the graph's state holds); a row naming any other type
    raises SerializationError naming it, and the type is not imported. `serde=` replaces it
    (e.g. an EncryptedSerializer wrapping a StrictSerializer)."""

    def __init__(self, url: str, *, serde: SerializerProtocol | None = None,
                 allowed_types: Collection[type] = (), pool_size: int = 4,
                 sync_writes: bool = False) -> None:
        super().__init__(serde=strict_serde(serde, allowed_types))
        self.url = url
        self.sync_writes = sync_writes
        self._rows = _rows_for(url, pool_size)
        self._blobs = BlobCache()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: _LoopThread | None = None

    def __repr__(self) -> str:
        return f"TetherSaver({self._rows.dialect})"

    @classmethod
    def from_conn_string(cls, url: str, *, serde: SerializerProtocol | None = None,
                         allowed_types: Collection[type] = (), pool_size: int = 4,
                         sync_writes: bool = False) -> _Opening:
        """`async with` (the saver works on the running loop) or `with` (on a private loop
        thread, for sync graphs): open on entry, closed on exit."""
        return _Opening(cls(url, serde=serde, allowed_types=allowed_types,
                            pool_size=pool_size, sync_writes=sync_writes))

    def with_serde(self, serde: SerializerProtocol) -> TetherSaver:
        """This saver with another serializer, on the same connections (LangGraph's
        with_allowlist makes such copies too): open and close this one, not the copy."""
        if serde is self.serde:
            return self
        clone = copy.copy(self)
        clone.serde = serde
        return clone

    # -- lifecycle -------------------------------------------------------------------------

    async def aopen(self) -> None:
        if self._loop is not None:
            raise InvalidState("the saver is open already")
        await self._rows.open(private_loop=False)
        self._loop = asyncio.get_running_loop()

    async def aclose(self) -> None:
        if self._loop is None:
            return
        await self._on_loop(self._rows.close())
        self._loop = None
        self._blobs.clear()

    def open(self) -> None:
        """Open on a private event loop thread (for sync graphs)."""
        if self._loop is not None:
            raise InvalidState("the saver is open already")
        thread = _LoopThread()
        try:
            asyncio.run_coroutine_threadsafe(self._rows.open(private_loop=True),
                                             thread.loop).result()
        except BaseException:
            thread.stop()
            raise
        self._thread, self._loop = thread, thread.loop

    def close(self) -> None:
        thread = self._thread
        if thread is None:
            if self._loop is not None:
                self._blocking(self.aclose())
            return
        try:
            asyncio.run_coroutine_threadsafe(self._rows.close(), thread.loop).result()
        finally:
            self._thread = self._loop = None
            self._blobs.clear()
            thread.stop()

    def setup(self) -> Awaitable[None]:
        """Apply tether's migrations (LangGraph's tables are 0005), as LangGraph's savers'
        setup() creates theirs. `await saver.setup()`; on a saver opened with `with`, plain
        `saver.setup()` has run by the time it returns."""
        if self._thread is not None and not self._on_own_loop():
            self._blocking(self._rows.migrate())
            return _Done()
        return self._on_loop(self._rows.migrate())

    # -- running on the saver's loop -------------------------------------------------------

    def _on_own_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None:
            coro.close()
            raise StoreError("the saver is not open: use `async with "
                             "TetherSaver.from_conn_string(url) as saver`")
        if asyncio.get_running_loop() is loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    def _blocking(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if loop is None:
            coro.close()
            raise StoreError("the saver is not open: use `with "
                             "TetherSaver.from_conn_string(url) as saver`")
        if self._on_own_loop():
            coro.close()
            raise InvalidState(
                "a synchronous TetherSaver method was called on the event loop the saver runs "
                "on, which it would block: use the async API (graph.ainvoke, aget_tuple, ...), "
                "or open the saver with `with TetherSaver.from_conn_string(url)` for sync graphs")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # -- the async API ---------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._on_loop(self._get_tuple(config))

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        for tup in await self._on_loop(self._list(config, filter, before, limit)):
            yield tup

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        return await self._on_loop(self._put(config, checkpoint, metadata, new_versions))

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._on_loop(self._put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._on_loop(self._delete_thread(str(thread_id)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._on_loop(self._delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._on_loop(self._copy_thread(str(source_thread_id), str(target_thread_id)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._on_loop(self._prune(thread_ids, strategy))

    # -- the sync API: the same coroutines, run in the caller's thread --------------------

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """A sync method's coroutine, driven in the calling thread (the rows do blocking I/O
        on connections of their own for that): no hand-over to the saver's loop thread and
        back, which costs a sync graph more than a Postgres commit takes."""
        if self._rows.inline and self._loop is not None and not self._on_own_loop():
            return drive(coro)
        return self._blocking(coro)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._sync(self._get_tuple(config))

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        return iter(self._sync(self._list(config, filter, before, limit)))

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        return self._sync(self._put(config, checkpoint, metadata, new_versions))

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        self._sync(self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._sync(self._delete_thread(str(thread_id)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._sync(self._delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync(self._copy_thread(str(source_thread_id), str(target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._sync(self._prune(thread_ids, strategy))

    def get_next_version(  # type: ignore[override]  # V is float, but copied threads hold str
            self, current: float | str | None, channel: None) -> float | str:
        """The next integer plus a random fraction: increasing, and two branches forked from
        one checkpoint never share a version (a blob key) for different values. A string
        version (a thread copied from LangGraph's own savers) gets a string in their form,
        zero-padded so that strings compare as the numbers do (LangGraph compares versions
        with `>`, and a float beside a string raises TypeError)."""
        if isinstance(current, str):
            whole = int(current.split(".", 1)[0])
            return f"{whole + 1:032}.{random.getrandbits(53):016}"
        return (0 if current is None else int(current)) + 1 + random.random()

    # -- the logic, once -------------------------------------------------------------------

    async def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns = _where(config)
        row = await self._rows.get(thread_id, ns, get_checkpoint_id(config))
        return None if row is None else (await self._tuples([row]))[0]

    async def _list(self, config: RunnableConfig | None, filter: dict[str, Any] | None,
                    before: RunnableConfig | None, limit: int | None) -> _Tuples:
        thread_id = ns = checkpoint_id = None
        if config is not None:
            conf = config.get("configurable") or {}
            if conf.get("thread_id") is not None:
                thread_id = str(conf["thread_id"])
                ns = None if conf.get("checkpoint_ns") is None else str(conf["checkpoint_ns"])
                checkpoint_id = get_checkpoint_id(config)
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        rows = await self._rows.find(
            thread_id, ns, checkpoint_id,
            None if before is None else get_checkpoint_id(before),
            None if not filter else self._json(filter, "filter"), limit)
        return await self._tuples(rows) if rows else []

    async def _tuples(self, rows: Sequence[CheckpointRow]) -> _Tuples:
        try:
            return await self._load_tuples(rows)
        except SerializationError as exc:
            threads = ", ".join(sorted({repr(row[0]) for row in rows}))
            raise SerializationError(f"{exc} (LangGraph thread {threads})") from None

    async def _load_tuples(self, rows: Sequence[CheckpointRow]) -> _Tuples:
        loads = self.serde.loads_typed

        def load(type_: str, data: bytes | None) -> Any:
            return loads(unpack(type_, data or b""))  # type: ignore[arg-type]

        bodies = [load(row[4], row[5]) for row in rows]
        inlined = [body.pop("channel_values", None) or {} for body in bodies]
        blob_keys = [(row[0], row[1], ch, _vkey(v))
                     for row, body, inline in zip(rows, bodies, inlined, strict=True)
                     for ch, v in body["channel_versions"].items() if ch not in inline]
        keys = [row[:3] for row in rows]
        if INLINE.get():
            writes_rows = await self._rows.writes_of(keys)
            blob_rows = await self._rows.blobs_of(blob_keys) if blob_keys else []
        else:
            writes_rows, blob_rows = await asyncio.gather(
                self._rows.writes_of(keys),
                self._rows.blobs_of(blob_keys) if blob_keys else _none())
        blobs: dict[tuple[str, str], BlobRows] = {}
        for t, n, ch, v, type_, blob, base in blob_rows:
            blobs.setdefault((t, n), {})[(ch, v)] = (type_, blob, base)
        writes: dict[tuple[str, str, str], list[tuple[str, str, Any]]] = {}
        for t, n, c, task_id, channel, type_, blob in writes_rows:
            writes.setdefault((t, n, c), []).append(
                (task_id, channel, load(type_, blob)))
        out = []
        for (thread_id, ns, cid, parent, _, _, metadata), body, inline in zip(
                rows, bodies, inlined, strict=True):
            space = blobs.get((thread_id, ns), {})
            values: dict[str, Any] = {}
            for ch, v in body["channel_versions"].items():
                if ch in inline:
                    values[ch] = inline[ch]
                    continue
                if (ch, _vkey(v)) not in space:
                    continue
                values[ch] = loads(assemble(space, ch, _vkey(v)))  # type: ignore[arg-type]
            body["id"] = cid
            body["channel_values"] = values
            out.append(CheckpointTuple(
                _config(thread_id, ns, cid), body, orjson.loads(metadata),
                None if parent is None else _config(thread_id, ns, parent),
                writes.get((thread_id, ns, cid), [])))
        return out

    def _json(self, value: Any, what: str) -> str:
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
                                ).decode()
        except TypeError as exc:
            raise SerializationError(f"checkpoint {what} is not JSON: {exc}") from exc

    async def _put(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        thread_id, ns = _where(config)
        parent = get_checkpoint_id(config)
        values = checkpoint["channel_values"]
        dumps = self.serde.dumps_typed
        # Small scalars ride in the checkpoint's row, every checkpoint; other values of the
        # versions new here get a blob row each. A version without a value (the channel is
        # empty) has no row: it loads as absent.
        inline = {ch: value for ch, value in values.items() if _inline(value)}
        blobs = [self._blobs.encode(thread_id, ns, ch, _vkey(v), *dumps(values[ch]))
                 for ch, v in new_versions.items() if ch in values and ch not in inline]
        body: dict[str, Any] = {k: v for k, v in checkpoint.items()
                                if k not in ("channel_values", "id")}
        if inline:
            body["channel_values"] = inline
        type_, data = pack(*dumps(body))
        meta = get_serializable_checkpoint_metadata(config, metadata)
        run_id = meta.get("run_id")
        row = (thread_id, ns, checkpoint["id"], parent, None if run_id is None else str(run_id),
               type_, data, self._json(meta, "metadata"))
        try:
            if not await self._rows.put(row, thread_id, ns, blobs):
                # A base this saver extended is gone (pruned, deleted): store whole values.
                self._blobs.forget(thread_id, ns)
                whole = [b.whole() for b in blobs]
                if not await self._rows.put(row, thread_id, ns, whole):
                    raise StoreError("a LangGraph checkpoint with whole values was refused")
        except BaseException:
            self._blobs.forget(thread_id, ns)
            raise
        return _config(thread_id, ns, checkpoint["id"])

    async def _put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str) -> None:
        thread_id, ns = _where(config)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            raise ValueError("put_writes needs a config with configurable.checkpoint_id")
        dumps = self.serde.dumps_typed
        rows = [(thread_id, ns, checkpoint_id, task_id, WRITES_IDX_MAP.get(ch, idx), ch,
                 *pack(*dumps(value)), task_path) for idx, (ch, value) in enumerate(writes)]
        if rows:
            await self._rows.put_writes(rows, all(ch in WRITES_IDX_MAP for ch, _ in writes),
                                        self.sync_writes)

    async def _delete_thread(self, thread_id: str) -> None:
        await self._rows.delete_thread(thread_id)
        self._blobs.forget(thread_id)

    def _collect(self, bodies: Sequence[tuple[str, bytes]],
                 keys: Sequence[tuple[str, str, str | None]]) -> _Keys:
        loads = self.serde.loads_typed
        live = {(ch, _vkey(v)) for type_, body in bodies
                for ch, v in loads(unpack(type_, body))["channel_versions"].items()}  # type: ignore[arg-type]
        return garbage(live, keys)

    async def _delete_for_runs(self, run_ids: Sequence[str]) -> None:
        ids = [str(r) for r in run_ids]
        if ids:
            for thread_id in await self._rows.delete_for_runs(ids, self._collect):
                self._blobs.forget(thread_id)

    async def _copy_thread(self, source: str, target: str) -> None:
        await self._rows.copy_thread(source, target)
        self._blobs.forget(target)

    async def _prune(self, thread_ids: Sequence[str], strategy: str) -> None:
        if strategy not in _STRATEGIES:
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or "
                             "'delete'")
        ids = [str(t) for t in thread_ids]
        if ids:
            await self._rows.prune(ids, strategy == "keep_latest", self._collect)
            for thread_id in ids:
                self._blobs.forget(thread_id)


async def _none() -> list[Any]:
    return []


class _Opening:
    """TetherSaver.from_conn_string's result: an async and a sync context manager."""

    def __init__(self, saver: TetherSaver) -> None:
        self.saver = saver

    async def __aenter__(self) -> TetherSaver:
        await self.saver.aopen()
        return self.saver

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.saver.aclose()

    def __enter__(self) -> TetherSaver:
        self.saver.open()
        return self.saver

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.saver.close()
