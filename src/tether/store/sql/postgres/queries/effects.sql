-- Postgres: the outbox (effects, their claims, done marks, retries).

-- name: claim_effects
-- Leases due effects whose handler this worker has, at most one per run: the run's head, its
-- first effect in request order (step, idx) still pending or running, when that one is due;
-- so a run's effects go strictly in order, and one that waits to be retried holds back the
-- rest. Runs are visited in thread_id order after `after`, then from the first run up to
-- `after` again (round robin: the caller passes back the last run visited), one descent of
-- outbox_live each (no plan depends on statistics), until `visit` runs are visited or `limit`
-- due heads are found. SKIP LOCKED: competing dispatchers take disjoint effects (a head
-- changed since the scan's snapshot is skipped this time). Returns the claimed effects and a
-- last row whose first column is NULL: (the last run visited, runs visited, due heads found).
WITH RECURSIVE t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
h(thread_id, ctid, due, wrapped, n, found) AS (
    SELECT %(after)s::text, NULL::tid, false, false, 0, 0
    UNION ALL
    SELECT x.thread_id, x.ctid, x.due, x.wrapped, h.n + 1, h.found + x.due::int
    FROM h, t, LATERAL (
        SELECT y.thread_id, y.ctid, y.wrapped,
               coalesce(y.name = ANY(%(names)s::text[])
                        AND ((y.status = 'pending' AND y.next_attempt_at <= t.now)
                             OR (y.status = 'running' AND y.lease_expires_at < t.now)),
                        false) AS due
        FROM ((SELECT o.thread_id, o.ctid, o.name, o.status, o.next_attempt_at,
                      o.lease_expires_at, h.wrapped
               FROM outbox o
               WHERE o.status IN ('pending', 'running') AND o.thread_id > h.thread_id
               ORDER BY o.thread_id, o.step, o.idx LIMIT 1)
              UNION ALL
              (SELECT o.thread_id, o.ctid, o.name, o.status, o.next_attempt_at,
                      o.lease_expires_at, true
               FROM outbox o
               WHERE o.status IN ('pending', 'running') AND NOT h.wrapped
               ORDER BY o.thread_id, o.step, o.idx LIMIT 1)
              LIMIT 1) y
    ) x
    WHERE h.n < %(visit)s AND h.found < %(limit)s
      AND NOT (x.wrapped AND x.thread_id > %(after)s::text)
),
c AS (
    SELECT o.ctid FROM outbox o, t
    WHERE o.ctid = ANY(ARRAY(SELECT h.ctid FROM h WHERE h.due))
      AND o.name = ANY(%(names)s::text[])
      AND ((o.status = 'pending' AND o.next_attempt_at <= t.now)
           OR (o.status = 'running' AND o.lease_expires_at < t.now))
    FOR UPDATE OF o SKIP LOCKED
),
u AS (
    UPDATE outbox
    SET status = 'running', lease_owner = %(worker)s,
        lease_expires_at = (SELECT now FROM t) + %(ttl)s::float8,
        epoch = epoch + 1, attempts = attempts + 1
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM c))
    RETURNING {{effect_columns}}
)
SELECT u.*, NULL::text, NULL::int, NULL::int FROM u
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       v.thread_id, v.n, v.found
FROM (SELECT thread_id, n, found FROM h ORDER BY n DESC LIMIT 1) v;

-- name: complete_effects
-- Records a batch of effects done with their results, each fenced by its own effect epoch:
-- only the holder of a row's current epoch marks it (a lease taken over, or an effect no
-- longer running, is left as it is). One fenced update per effect by its primary key (see
-- tether_complete_effects, migration 0003). Returns the 1-based positions marked.
SELECT * FROM tether_complete_effects(%(thread_ids)s::text[], %(keys)s::text[],
                                      %(epochs)s::bigint[], %(results)s::bytea[]);

-- name: fail_effect
-- A failed attempt: back to pending after delay seconds (announced), or dead when delay is
-- NULL; fenced like complete_effect. One row back = recorded.
WITH u AS (
    UPDATE outbox
    SET status = CASE WHEN %(delay)s::float8 IS NULL THEN 'dead' ELSE 'pending' END,
        next_attempt_at = extract(epoch FROM clock_timestamp())::float8
                          + coalesce(%(delay)s::float8, 0),
        error = %(error)s, lease_owner = NULL, lease_expires_at = NULL
    WHERE thread_id = %(thread_id)s AND key = %(key)s AND epoch = %(epoch)s
      AND status || '' = 'running'
    RETURNING status
),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '') FROM u WHERE status = 'pending')
SELECT (SELECT count(*) FROM fx) FROM u;

-- name: renew_effect_leases
-- One statement renews every effect lease a worker's dispatcher holds.
UPDATE outbox
SET lease_expires_at = extract(epoch FROM clock_timestamp())::float8 + %(ttl)s::float8
WHERE lease_owner = %(worker)s AND status = 'running'
RETURNING 1;

-- name: effect_marks
-- Where a batch of done marks stands (pg_settle.settle_done_marks): each effect's status and
-- epoch, by primary key, with its 1-based position in the batch.
SELECT b.i, o.status, o.epoch
FROM unnest(%(thread_ids)s::text[], %(keys)s::text[]) WITH ORDINALITY AS b(thread_id, key, i)
JOIN outbox o ON o.thread_id = b.thread_id AND o.key = b.key;

-- name: get_effect
SELECT {{effect_columns}}
FROM outbox WHERE thread_id = %(thread_id)s AND key = %(key)s;

-- name: list_effects
-- Effects by age, of a run, of a status, or both. The dead ones of every run (the
-- dashboard's list) are a range of outbox_dead (migration 0017), the pending or running ones
-- the live effects of outbox_live, sorted: never a read of every done effect. One branch
-- each, the last for everything else (each runs only when its one-time condition holds).
SELECT * FROM (
    (SELECT {{effect_columns}}
     FROM outbox
     WHERE %(status)s::text IS NOT DISTINCT FROM 'dead' AND %(thread_id)s::text IS NULL
       AND status = 'dead'
     ORDER BY created_at, thread_id, step, idx
     LIMIT %(limit)s)
    UNION ALL
    (SELECT {{effect_columns}}
     FROM outbox
     WHERE %(status)s::text IN ('pending', 'running') AND %(thread_id)s::text IS NULL
       AND status = %(status)s::text
       AND status IN ('pending', 'running')  -- (lets it read outbox_live)
     ORDER BY created_at, thread_id, step, idx
     LIMIT %(limit)s)
    UNION ALL
    (SELECT {{effect_columns}}
     FROM outbox
     WHERE NOT (coalesce(%(status)s::text IN ('dead', 'pending', 'running'), false)
                AND %(thread_id)s::text IS NULL)
       AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text)
       AND (%(status)s::text IS NULL OR status = %(status)s::text)
     ORDER BY created_at, thread_id, step, idx
     LIMIT %(limit)s)
) AS e
ORDER BY created_at, thread_id, step, idx
LIMIT %(limit)s;

-- name: retry_effect
-- An operator retries a dead (or failing) effect now, with a fresh attempt budget.
WITH u AS (
    UPDATE outbox
    SET status = 'pending', attempts = 0,
        next_attempt_at = extract(epoch FROM clock_timestamp())::float8,
        lease_owner = NULL, lease_expires_at = NULL
    WHERE key = %(key)s AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text)
      AND status IN ('dead', 'pending')
    RETURNING {{effect_columns}}
),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '') WHERE EXISTS (SELECT 1 FROM u))
SELECT u.*, (SELECT count(*) FROM fx) FROM u;
