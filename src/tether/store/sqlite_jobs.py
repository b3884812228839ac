"""Small parts of the SQLite connections: what a write job may hand back to the event loop,
the shared wake-up event, the commit observers' list."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from .base import CommitObserver


def finished(result: Any) -> Any:
    """A write job's result, safe to hand to the event loop: a cursor (a job that returned
    `conn.execute(...)`) is closed here, on the commit thread under the write lock, and
    becomes None. Freed later on the loop's thread, it would reset a cached statement the
    commit thread may be running for the next batch ("bad parameter or other API misuse")."""
    if type(result) is sqlite3.Cursor:
        result.close()
        return None
    return result


class SharedWake(asyncio.Event):
    """A SQLite store's work_available: set() sets it and the events of the other stores
    sharing its connections (so a run one store queues for another's worker wakes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.peers: list[asyncio.Event] = [self]

    def set(self) -> None:
        for event in self.peers:
            asyncio.Event.set(event)


def swap_observer(observers: list[CommitObserver], old: CommitObserver | None,
          new: CommitObserver | None) -> None:
    """Put `new` in `old`'s place in `observers` (either may be None)."""
    if old is not None:
        observers[:] = [o for o in observers if o is not old]
    if new is not None:
        observers.append(new)
