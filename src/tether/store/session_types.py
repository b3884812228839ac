"""The dashboard's sign-ins as the store keeps them (migration 0013's ui_sessions): the
UiSessions protocol, a part of every store (`store.sessions`); store/sessions.py holds its
SQLite and Postgres parts. A session is named by the SHA-256 (hex) of its random id."""

from __future__ import annotations

from typing import Protocol


class UiSessions(Protocol):
    """The dashboard's sign-ins (tether.service.dashboard_auth holds the logic)."""

    async def open_session(self, id_hash: str, ttl: float) -> int:
        """Record a sign-in, live for `ttl` seconds from now, after deleting the sessions
        already expired (so the table holds at most a TTL's worth of sign-ins); one
        transaction. Returns how many expired rows were deleted."""

    async def session_alive(self, id_hash: str, touch_after: float = 60.0) -> bool:
        """Whether the session exists, is not revoked and has not expired: one indexed read
        per dashboard request; its last_seen is renewed when older than `touch_after`
        seconds (a write at most that often per session)."""

    async def revoke_session(self, id_hash: str) -> bool:
        """A sign-out: the session is refused from now on. False if it was not live."""
