"""The row-level operations TetherSaver needs from a database, one class per dialect
(_sqlite.py, _postgres.py). Policy (what to write, what a row means, which blobs are garbage)
is the saver's; a dialect only says it in its SQL."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator, Sequence
from contextvars import ContextVar
from typing import Any, Generic, Protocol, TypeVar

from ..errors import StoreError
from ._blobs import Blob

T = TypeVar("T")
# Set while `drive` runs a coroutine in the calling thread: the rows' methods then do their I/O
# blocking, on connections of their own for such calls, and never suspend.
INLINE: ContextVar[bool] = ContextVar("tether_langgraph_inline", default=False)


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine of the saver's to its end in this thread, with no event loop and no
    hand-over to the saver's loop thread (what a sync graph's put costs otherwise): under
    INLINE every await of the rows' completes at once."""
    token = INLINE.set(True)
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        INLINE.reset(token)
    coro.close()
    raise StoreError("internal error: an inline TetherSaver call waited on an event loop")


class Ready(Generic[T]):
    """An awaitable that is done already (what an inline write returns)."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, T]:
        return self.value
        yield  # a generator: awaitable, never suspends

# (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
CheckpointRow = tuple[str, str, str, "str | None", str, bytes, str]
# (thread_id, checkpoint_ns, checkpoint_id, task_id, channel, type, blob)
WriteRow = tuple[str, str, str, str, str, str, "bytes | None"]
# (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
BlobRow = tuple[str, str, str, str, str, "bytes | None", "str | None"]
# Given a namespace's checkpoint bodies [(type, checkpoint)] and blob keys [(channel, version,
# base_version)], the (channel, version) blobs to delete.
Collect = Callable[[Sequence[tuple[str, bytes]], Sequence[tuple[str, str, "str | None"]]],
                   list[tuple[str, str]]]


class Rows(Protocol):
    dialect: str
    # True: every method may also run under INLINE, from any thread (sync callers).
    inline: bool

    async def open(self, *, private_loop: bool) -> None:
        """Connect, on the running loop. `private_loop`: the loop is the saver's own (sync
        graphs), so blocking it for a moment costs nobody else anything."""

    async def close(self) -> None: ...

    async def migrate(self) -> None:
        """Apply tether's migrations (LangGraph's tables are migration 0005)."""

    async def put(self, row: tuple[Any, ...], thread_id: str, ns: str,
                  blobs: Sequence[Blob]) -> bool:
        """Store a checkpoint row (the insert_checkpoint columns) and its new blobs in one
        transaction. False (nothing stored) when a delta's base version is gone: the caller
        puts again with full values."""

    async def put_writes(self, rows: Sequence[tuple[Any, ...]], replace: bool,
                         flush: bool) -> None:
        """Store writes (the insert_write columns, all of one task) in one transaction;
        `replace` overwrites rows with the same (task_id, idx), else those are kept. `flush`
        False: the commit does not wait for the disk (the database has them; the next flushed
        commit, a checkpoint's, makes them durable too)."""

    async def delete_thread(self, thread_id: str) -> None: ...

    async def delete_for_runs(self, run_ids: Sequence[str], collect: Collect) -> list[str]:
        """Delete the runs' checkpoints and their writes, then the blobs no remaining
        checkpoint of the namespaces touched needs, in one transaction; the threads touched."""

    async def prune(self, thread_ids: Sequence[str], keep_latest: bool,
                    collect: Collect) -> None:
        """keep_latest: every checkpoint but the newest per namespace, with their writes and
        the blobs left unneeded; else everything of the threads. One transaction."""

    async def copy_thread(self, source: str, target: str) -> None: ...

    async def get(self, thread_id: str, ns: str, checkpoint_id: str | None
                  ) -> CheckpointRow | None:
        """That checkpoint, or (checkpoint_id None) the namespace's newest."""

    async def find(self, thread_id: str | None, ns: str | None, checkpoint_id: str | None,
                   before: str | None, filter_json: str | None, limit: int | None
                   ) -> list[CheckpointRow]:
        """Newest first. thread_id None: every thread; ns None: every namespace."""

    async def writes_of(self, keys: Sequence[tuple[str, str, str]]) -> list[WriteRow]:
        """The writes of the checkpoints keyed (thread_id, ns, checkpoint_id), grouped by
        checkpoint, each group in writes_sort_key order."""

    async def blobs_of(self, keys: Sequence[tuple[str, str, str, str]]) -> list[BlobRow]:
        """The blobs keyed (thread_id, ns, channel, version) and their delta chains."""
