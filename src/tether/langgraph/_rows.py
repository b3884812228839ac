"""The row-level operations TetherSaver needs from a database, one class per dialect
(_sqlite.py, _postgres.py). Policy (what to write, what a row means, which blobs are garbage)
is the saver's; a dialect only says it in its SQL."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ._blobs import Blob

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
