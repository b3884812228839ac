-- Named queries for the Postgres store (psycopg placeholders; no percent sign anywhere else).
-- NOW is the database clock in Unix seconds: extract(epoch FROM clock_timestamp())::float8.
-- Every write that makes a run claimable calls pg_notify('tether_work', version) in its own
-- statement, so the wake-up is delivered exactly when (and only if) the write commits.
-- Run rows are returned with the columns of RunRecord, in its order.

-- name: now
SELECT extract(epoch FROM clock_timestamp())::float8;

-- name: schema_table
SELECT to_regclass('schema_version') IS NOT NULL;

-- name: schema_applied
SELECT coalesce(max(version), 0) FROM schema_version;

-- name: create_schema_version
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL
);

-- name: migrate_lock
-- Held until the migrating transaction ends: concurrent migrators apply migrations one at a time.
SELECT pg_advisory_xact_lock(%(key)s);

-- name: record_migration
INSERT INTO schema_version (version, name, applied_at)
VALUES (%(version)s, %(name)s, extract(epoch FROM clock_timestamp())::float8);

-- name: create_run
-- Inserts a queued run and announces it, or (inserting nothing) returns the run it collides
-- with, preferring the idempotency key's run; the first column says which. No row back means
-- the colliding row was committed after this statement's snapshot: read it again.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
ins AS (
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                      idempotency_key, parent_thread_id, forked_from, forked_step,
                      created_at, updated_at)
    SELECT %(thread_id)s, %(agent)s, %(version)s, 'queued', %(node)s, %(input)s, %(input_hash)s,
           %(idempotency_key)s, %(parent_thread_id)s, %(forked_from)s, %(forked_step)s::bigint,
           t.now, t.now
    FROM t
    ON CONFLICT DO NOTHING
    RETURNING thread_id, agent, version, status, node, step, attempt, failures, input,
              input_hash, idempotency_key, lease_owner, lease_expires_at, epoch, wake_at,
              waiting_for, error, parent_thread_id, forked_from, forked_step, created_at,
              updated_at
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM ins)
SELECT true, ins.*, (SELECT count(*) FROM woke) FROM ins
UNION ALL
(SELECT false, thread_id, agent, version, status, node, step, attempt, failures, input,
        input_hash, idempotency_key, lease_owner, lease_expires_at, epoch, wake_at,
        waiting_for, error, parent_thread_id, forked_from, forked_step, created_at,
        updated_at, 0
 FROM runs
 WHERE NOT EXISTS (SELECT 1 FROM ins)
   AND (thread_id = %(thread_id)s OR idempotency_key = %(idempotency_key)s)
 ORDER BY idempotency_key = %(idempotency_key)s DESC NULLS LAST
 LIMIT 1);

-- name: get_run
SELECT thread_id, agent, version, status, node, step, attempt, failures, input, input_hash,
       idempotency_key, lease_owner, lease_expires_at, epoch, wake_at, waiting_for, error,
       parent_thread_id, forked_from, forked_step, created_at, updated_at
FROM runs WHERE thread_id = %(thread_id)s;

-- name: get_run_by_key
SELECT thread_id, agent, version, status, node, step, attempt, failures, input, input_hash,
       idempotency_key, lease_owner, lease_expires_at, epoch, wake_at, waiting_for, error,
       parent_thread_id, forked_from, forked_step, created_at, updated_at
FROM runs WHERE idempotency_key = %(key)s;

-- name: list_runs
-- Newest first, keyset-paginated on (created_at, thread_id).
SELECT thread_id, agent, version, status, node, step, attempt, failures, input, input_hash,
       idempotency_key, lease_owner, lease_expires_at, epoch, wake_at, waiting_for, error,
       parent_thread_id, forked_from, forked_step, created_at, updated_at
FROM runs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s::text)
  AND (%(before_ts)s::float8 IS NULL
       OR (created_at, thread_id) < (%(before_ts)s::float8, %(before_id)s::text))
ORDER BY created_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: claim_runs
-- Leases claimable runs of one version: each claim bumps the fencing epoch, so any earlier
-- holder's writes (which check the epoch) are refused from here on. SKIP LOCKED: competing
-- claimers take disjoint rows and never wait on each other or on a committing step.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
c AS (
    SELECT r.thread_id FROM runs r, t
    WHERE r.version = %(version)s
      AND r.agent = ANY(%(agents)s::text[])
      AND r.status IN ('queued', 'sleeping', 'running')
      AND ((r.status IN ('queued', 'sleeping') AND (r.wake_at IS NULL OR r.wake_at <= t.now))
           OR (r.status = 'running' AND r.lease_expires_at < t.now))
    ORDER BY coalesce(r.wake_at, r.created_at)
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE runs
SET status = 'running', lease_owner = %(worker)s,
    lease_expires_at = (SELECT now FROM t) + %(ttl)s::float8,
    epoch = epoch + 1, attempt = attempt + 1, wake_at = NULL,
    updated_at = (SELECT now FROM t)
WHERE thread_id IN (SELECT thread_id FROM c)
RETURNING thread_id, agent, version, status, node, step, attempt, failures, input, input_hash,
          idempotency_key, lease_owner, lease_expires_at, epoch, wake_at, waiting_for, error,
          parent_thread_id, forked_from, forked_step, created_at, updated_at;

-- name: renew_leases
-- One statement renews every lease a worker holds. Rows are locked in thread_id order, the
-- order a group commit locks them in, so the two can never deadlock.
WITH held AS (
    SELECT thread_id FROM runs
    WHERE lease_owner = %(worker)s AND status = 'running'
    ORDER BY thread_id
    FOR NO KEY UPDATE
)
UPDATE runs
SET lease_expires_at = extract(epoch FROM clock_timestamp())::float8 + %(ttl)s::float8
WHERE thread_id IN (SELECT thread_id FROM held)
RETURNING thread_id;

-- name: release_runs
-- Gives runs back for any worker to claim at once; only each lease's current epoch may.
-- Locks in thread_id order (see renew_leases) and announces the released runs.
WITH g AS (
    SELECT * FROM unnest(%(thread_ids)s::text[], %(epochs)s::bigint[]) AS g(thread_id, epoch)
),
l AS (
    SELECT r.thread_id FROM runs r JOIN g ON r.thread_id = g.thread_id AND r.epoch = g.epoch
    WHERE r.status = 'running'
    ORDER BY r.thread_id
    FOR NO KEY UPDATE OF r
),
u AS (
    UPDATE runs
    SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, attempt = 0,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id IN (SELECT thread_id FROM l)
    RETURNING version
)
SELECT pg_notify('tether_work', v.version) FROM (SELECT DISTINCT version FROM u) v;

-- name: insert_journal
-- Journals a call result only while the caller's epoch is current. FOR SHARE holds off a
-- concurrent claim (an epoch bump) until this commits; one row back = journaled.
WITH r AS (
    SELECT thread_id FROM runs
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status = 'running'
    FOR SHARE
)
INSERT INTO journal (thread_id, step, idx, name, result)
SELECT r.thread_id, %(step)s, %(idx)s, %(name)s, %(result)s FROM r
RETURNING 1;

-- name: load_journal
SELECT idx, name, result FROM journal
WHERE thread_id = %(thread_id)s AND step = %(step)s
ORDER BY idx;

-- name: commit_step
-- The hot path, one statement: moves the run past the step and appends its checkpoint,
-- fenced by the epoch. One row back = committed; none = lease lost, nothing written.
WITH u AS (
    UPDATE runs
    SET step = %(step)s, node = %(next_node)s, status = %(status)s,
        attempt = CASE WHEN %(status)s = 'running' THEN 1 ELSE 0 END, failures = 0,
        wake_at = %(wake_at)s, waiting_for = %(waiting_for)s,
        lease_owner = CASE WHEN %(status)s = 'running' THEN lease_owner END,
        lease_expires_at = CASE WHEN %(status)s = 'running' THEN lease_expires_at END,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status = 'running'
    RETURNING thread_id
)
INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, attempt,
                         started_at, finished_at)
SELECT u.thread_id, %(step)s, %(node)s, %(next_node)s, %(kind)s, %(data)s, %(worker)s,
       %(attempt)s, %(started_at)s, %(finished_at)s
FROM u
RETURNING 1;

-- name: commit_step_notify
-- commit_step that also spawns children (queued, ignored if they already exist) and
-- announces them, and the run itself when it is released as queued; all in one statement,
-- children only if the fenced update matched. One row back = committed.
WITH u AS (
    UPDATE runs
    SET step = %(step)s, node = %(next_node)s, status = %(status)s,
        attempt = CASE WHEN %(status)s = 'running' THEN 1 ELSE 0 END, failures = 0,
        wake_at = %(wake_at)s, waiting_for = %(waiting_for)s,
        lease_owner = CASE WHEN %(status)s = 'running' THEN lease_owner END,
        lease_expires_at = CASE WHEN %(status)s = 'running' THEN lease_expires_at END,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status = 'running'
    RETURNING thread_id, version, status
),
c AS (
    INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, attempt,
                             started_at, finished_at)
    SELECT u.thread_id, %(step)s, %(node)s, %(next_node)s, %(kind)s, %(data)s, %(worker)s,
           %(attempt)s, %(started_at)s, %(finished_at)s
    FROM u
    RETURNING thread_id
),
k AS (
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                      idempotency_key, parent_thread_id, forked_from, forked_step,
                      created_at, updated_at)
    SELECT x.thread_id, x.agent, x.version, 'queued', x.node, x.input, x.input_hash,
           x.idempotency_key, x.parent_thread_id, x.forked_from, x.forked_step,
           extract(epoch FROM clock_timestamp())::float8,
           extract(epoch FROM clock_timestamp())::float8
    FROM u, unnest(%(c_thread_id)s::text[], %(c_agent)s::text[], %(c_version)s::text[],
                   %(c_node)s::text[], %(c_input)s::bytea[], %(c_input_hash)s::text[],
                   %(c_idempotency_key)s::text[], %(c_parent_thread_id)s::text[],
                   %(c_forked_from)s::text[], %(c_forked_step)s::bigint[])
         AS x(thread_id, agent, version, node, input, input_hash, idempotency_key,
              parent_thread_id, forked_from, forked_step)
    ON CONFLICT DO NOTHING
    RETURNING version
),
woke AS MATERIALIZED (
    SELECT pg_notify('tether_work', v.version)
    FROM (SELECT version FROM k UNION SELECT version FROM u WHERE status = 'queued') v
)
SELECT (SELECT count(*) FROM woke) FROM c;

-- name: fail_step
-- Records a failed attempt, fenced: final -> failed with the error; else queued until
-- wake_at, and announced. One row back = recorded; none = lease lost.
WITH u AS (
    UPDATE runs
    SET status = CASE WHEN %(final)s THEN 'failed' ELSE 'queued' END,
        node = CASE WHEN %(final)s THEN NULL ELSE node END,
        failures = %(failures)s, wake_at = %(wake_at)s::float8, error = %(error)s::bytea,
        lease_owner = NULL, lease_expires_at = NULL,
        attempt = CASE WHEN %(final)s THEN attempt ELSE 0 END,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status = 'running'
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM u WHERE NOT %(final)s)
SELECT (SELECT count(*) FROM woke) FROM u;

-- name: cancel_run
-- Cancels a live run at once; the epoch bump fences out a worker still running it.
UPDATE runs
SET status = 'cancelled', epoch = epoch + 1, lease_owner = NULL, lease_expires_at = NULL,
    wake_at = NULL, updated_at = extract(epoch FROM clock_timestamp())::float8
WHERE thread_id = %(thread_id)s AND status NOT IN ('completed', 'failed', 'cancelled')
RETURNING thread_id, agent, version, status, node, step, attempt, failures, input, input_hash,
          idempotency_key, lease_owner, lease_expires_at, epoch, wake_at, waiting_for, error,
          parent_thread_id, forked_from, forked_step, created_at, updated_at;

-- name: load_checkpoints
-- The latest snapshot at or before upto and every later step up to upto, from one snapshot
-- of the table (a concurrent commit cannot split the two reads).
SELECT thread_id, step, node, next_node, kind, data, worker, attempt, started_at, finished_at
FROM checkpoints
WHERE thread_id = %(thread_id)s AND step <= %(upto)s
  AND step >= coalesce((SELECT max(step) FROM checkpoints
                        WHERE thread_id = %(thread_id)s AND kind = 's' AND step <= %(upto)s),
                       0)
ORDER BY step;

-- name: checkpoints
SELECT thread_id, step, node, next_node, kind, data, worker, attempt, started_at, finished_at
FROM checkpoints WHERE thread_id = %(thread_id)s
ORDER BY step;
