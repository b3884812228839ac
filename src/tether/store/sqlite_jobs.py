"""What a job run on a SQLite commit thread may hand back to the event loop."""

from __future__ import annotations

import sqlite3
from typing import Any


def finished(result: Any) -> Any:
    """A write job's result, safe to hand to the event loop: a cursor (a job that returned
    `conn.execute(...)`) is closed here, on the commit thread under the write lock, and
    becomes None. Freed later on the loop's thread, it would reset a cached statement the
    commit thread may be running for the next batch ("bad parameter or other API misuse")."""
    if type(result) is sqlite3.Cursor:
        result.close()
        return None
    return result
