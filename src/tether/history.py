"""A run's state read back from its checkpoint log: the one place that loads and replays."""

from __future__ import annotations

from .state import State, replay
from .store.base import RunRecord, Store


async def load_state(store: Store, run: RunRecord, upto: int | None = None) -> tuple[State, int]:
    """The run's state after step `upto` (default: its last committed step), and how many
    checkpoints were read after the latest snapshot (the worker's next snapshot is due when
    that reaches snapshot_every). A run at step 0 is its input: nothing is read."""
    rows = await store.load_checkpoints(run.thread_id, upto) if run.step > 0 else []
    since_snapshot = len(rows) - (1 if rows and rows[0].kind == "s" else 0)
    return replay(run.input, ((cp.kind, cp.data) for cp in rows)), since_snapshot
