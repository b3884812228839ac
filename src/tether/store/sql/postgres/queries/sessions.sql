-- Postgres: dashboard sessions (migration 0013), by the SHA-256 of their id; times are the
-- database clock.

-- name: open_session
-- A sign-in, one statement: sessions past their expiry (revoked or not) go, by
-- ui_sessions_expires, and the new one lives for :ttl seconds from now. A (vanishingly
-- unlikely) id already taken keeps its row, and the new session is then refused at its first
-- use instead of joining it. Returns how many expired rows went.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
gone AS (
    DELETE FROM ui_sessions WHERE expires_at < (SELECT now FROM t) RETURNING 1
),
made AS (
    INSERT INTO ui_sessions (id_hash, created_at, expires_at, last_seen, revoked_at)
    SELECT %(id_hash)s, t.now, t.now + %(ttl)s::float8, t.now, NULL FROM t
    ON CONFLICT (id_hash) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM made);

-- name: live_session
-- The session's last_seen and the clock, if it is neither revoked nor expired; no row else.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now)
SELECT s.last_seen, t.now
FROM ui_sessions AS s, t
WHERE s.id_hash = %(id_hash)s AND s.revoked_at IS NULL AND s.expires_at > t.now;

-- name: touch_session
-- A request of a live session, a while after the last one recorded.
UPDATE ui_sessions SET last_seen = extract(epoch FROM clock_timestamp())::float8
WHERE id_hash = %(id_hash)s AND revoked_at IS NULL
RETURNING 1;

-- name: revoke_session
-- A sign-out: the session is refused from now on (the row stays until it expires).
UPDATE ui_sessions SET revoked_at = extract(epoch FROM clock_timestamp())::float8
WHERE id_hash = %(id_hash)s AND revoked_at IS NULL
RETURNING 1;
