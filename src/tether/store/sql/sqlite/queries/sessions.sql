-- SQLite: dashboard sessions (migration 0013), by the SHA-256 of their id; times are the
-- database clock.

-- name: prune_sessions
-- Sessions past their expiry (revoked or not) go: run at each sign-in, by ui_sessions_expires.
DELETE FROM ui_sessions WHERE expires_at < (julianday('now') - 2440587.5) * 86400.0;

-- name: insert_session
-- A sign-in: live for :ttl seconds from now. A (vanishingly unlikely) id already taken keeps
-- its row, and the new session is then refused at its first use instead of joining it.
INSERT INTO ui_sessions (id_hash, created_at, expires_at, last_seen, revoked_at)
SELECT :id_hash, t.now, t.now + :ttl, t.now, NULL
FROM (SELECT (julianday('now') - 2440587.5) * 86400.0 AS now) AS t
WHERE true
ON CONFLICT (id_hash) DO NOTHING;

-- name: live_session
-- The session's last_seen and the clock, if it is neither revoked nor expired; no row else.
SELECT last_seen, (julianday('now') - 2440587.5) * 86400.0
FROM ui_sessions
WHERE id_hash = :id_hash AND revoked_at IS NULL
  AND expires_at > (julianday('now') - 2440587.5) * 86400.0;

-- name: touch_session
-- A request of a live session, a while after the last one recorded.
UPDATE ui_sessions SET last_seen = (julianday('now') - 2440587.5) * 86400.0
WHERE id_hash = :id_hash AND revoked_at IS NULL;

-- name: revoke_session
-- A sign-out: the session is refused from now on (the row stays until it expires).
UPDATE ui_sessions SET revoked_at = (julianday('now') - 2440587.5) * 86400.0
WHERE id_hash = :id_hash AND revoked_at IS NULL;
