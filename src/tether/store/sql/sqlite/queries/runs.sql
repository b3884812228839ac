-- SQLite: runs (create, read, list), their leases (claim, renew, release) and cancels.

-- name: insert_run
-- A new run is queued, or (lease_owner given: a worker of the starting process takes it at
-- once) running under that owner's lease at epoch 1, as if claimed. The caller's transaction
-- makes insert-or-return atomic.
INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash, idempotency_key,
                  parent_thread_id, forked_from, forked_step, lease_owner, lease_expires_at,
                  epoch, attempt, created_at, updated_at, trace_context, idle_at)
VALUES (:thread_id, :agent, :version,
        CASE WHEN :lease_owner IS NULL THEN 'queued' ELSE 'running' END,
        :node, :input, :input_hash, :idempotency_key,
        :parent_thread_id, :forked_from, :forked_step, :lease_owner,
        CASE WHEN :lease_owner IS NULL THEN NULL
             ELSE (julianday('now') - 2440587.5) * 86400.0 + :lease_ttl END,
        CASE WHEN :lease_owner IS NULL THEN 0 ELSE 1 END,
        CASE WHEN :lease_owner IS NULL THEN 0 ELSE 1 END,
        (julianday('now') - 2440587.5) * 86400.0, (julianday('now') - 2440587.5) * 86400.0,
        :trace_context,  -- idle_at (0017): updated_at while queued
        CASE WHEN :lease_owner IS NULL THEN (julianday('now') - 2440587.5) * 86400.0 END)
ON CONFLICT DO NOTHING
RETURNING {{run_columns}};

-- name: insert_fresh_run
-- insert_run's common case, batched: a run without idempotency key created leased to a
-- worker of the starting process. Positional parameters (thread_id, agent, version, node,
-- input, input_hash, parent_thread_id, forked_from, forked_step, lease_owner,
-- lease_expires_at, now, trace_context); no row inserted = the thread_id exists (insert_run
-- then decides).
INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                  parent_thread_id, forked_from, forked_step, lease_owner, lease_expires_at,
                  epoch, attempt, created_at, updated_at, trace_context)
VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 1, 1, ?12, ?12, ?13)
ON CONFLICT DO NOTHING;

-- name: insert_fresh_run_set
-- insert_fresh_run for a whole group commit: ?1 is a JSON array of its parameter lists,
-- the input blob as a string.
INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                  parent_thread_id, forked_from, forked_step, lease_owner, lease_expires_at,
                  epoch, attempt, created_at, updated_at, trace_context)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, 'running', r.value ->> 3,
       CAST(r.value ->> 4 AS BLOB), r.value ->> 5, r.value ->> 6, r.value ->> 7, r.value ->> 8,
       r.value ->> 9, r.value ->> 10, 1, 1, r.value ->> 11, r.value ->> 11, r.value ->> 12
FROM json_each(?1) AS r
WHERE true
ON CONFLICT DO NOTHING;

-- name: insert_queued_run
-- insert_run's other common case, batched: a run without idempotency key queued for any
-- worker (no lease). Positional parameters (thread_id, agent, version, node, input,
-- input_hash, parent_thread_id, forked_from, forked_step, now, trace_context); no row
-- inserted = the thread_id exists (insert_run then decides).
INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                  parent_thread_id, forked_from, forked_step, epoch, attempt, created_at,
                  updated_at, trace_context, idle_at)
VALUES (?1, ?2, ?3, 'queued', ?4, ?5, ?6, ?7, ?8, ?9, 0, 0, ?10, ?10, ?11, ?10)
ON CONFLICT DO NOTHING;
-- name: insert_queued_run_set
-- insert_queued_run for a whole group commit: ?1 is a JSON array of its parameter lists,
-- the input blob as a string.
INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                  parent_thread_id, forked_from, forked_step, epoch, attempt, created_at,
                  updated_at, trace_context, idle_at)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, 'queued', r.value ->> 3,
       CAST(r.value ->> 4 AS BLOB), r.value ->> 5, r.value ->> 6, r.value ->> 7, r.value ->> 8,
       0, 0, r.value ->> 9, r.value ->> 9, r.value ->> 10, r.value ->> 9
FROM json_each(?1) AS r
WHERE true
ON CONFLICT DO NOTHING;
-- name: get_run
SELECT {{run_columns}} FROM runs WHERE thread_id = :thread_id;

-- name: run_statuses
SELECT thread_id, status FROM runs WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: get_run_by_key
SELECT {{run_columns}} FROM runs WHERE idempotency_key = :key;

-- fragment: due_now
-- The runs of one version due now (`t` holds the time), of the agents named: a range of
-- runs_due (a queued run is due since it was created).
    WHERE version = :version
      AND status IN ('queued', 'sleeping')
      AND coalesce(wake_at, created_at) <= (SELECT now FROM t)
      AND agent IN (SELECT value FROM json_each(:agents))

-- name: claim_runs
-- Leases claimable runs of one version: each claim bumps the fencing epoch, so any earlier
-- holder's writes (which check the epoch) are refused from here on. Runs due now come first,
-- in due order, then runs whose lease expired, oldest expiry first (a range of runs_expiry),
-- up to the limit in all: neither part reads a run that is not claimable (the time bound is a
-- subquery, so it bounds each index range rather than filter every row read). The last
-- column names the worker whose expired lease a claim took over (NULL for a run that was due).
WITH t(now) AS MATERIALIZED (SELECT (julianday('now') - 2440587.5) * 86400.0),
due AS MATERIALIZED (
    SELECT thread_id FROM runs
{{due_now}}
    ORDER BY coalesce(wake_at, created_at)
    LIMIT :limit),
expired AS MATERIALIZED (
    SELECT thread_id, lease_owner FROM runs
    WHERE version = :version
      AND status = 'running'
      AND lease_expires_at < (SELECT now FROM t)
      AND agent IN (SELECT value FROM json_each(:agents))
    ORDER BY lease_expires_at
    LIMIT max(:limit - (SELECT count(*) FROM due), 0))
UPDATE runs
SET status = 'running', lease_owner = :worker,
    lease_expires_at = (SELECT now FROM t) + :ttl,
    epoch = epoch + 1, attempt = attempt + 1, wake_at = NULL,
    updated_at = (SELECT now FROM t), {{resting('running', (SELECT now FROM t))}}
WHERE thread_id IN (SELECT thread_id FROM due UNION ALL SELECT thread_id FROM expired)
RETURNING {{run_columns}},
    (SELECT e.lease_owner FROM expired e WHERE e.thread_id = runs.thread_id) AS taken_from;

-- name: any_due
-- Whether claim_runs would find a run due now, read only: what a worker's store checks when
-- another connection has committed (sqlite_watch.py), before it wakes the worker to claim.
WITH t(now) AS MATERIALIZED (SELECT (julianday('now') - 2440587.5) * 86400.0)
SELECT EXISTS (SELECT 1 FROM runs
{{due_now}});

-- name: renew_leases
-- One statement renews every lease a worker holds.
UPDATE runs SET lease_expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl
WHERE lease_owner = :worker AND status = 'running'
  AND (:only IS NULL OR thread_id IN (SELECT value FROM json_each(:only)))
RETURNING thread_id;

-- name: release_run
-- Gives a run back for any worker to claim at once; only the current epoch may. The attempt
-- count stays: the step was begun, and the next claim counts the next attempt.
UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0,
                {{resting('queued', (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id = :thread_id AND epoch = :epoch AND status = 'running';

-- name: runs_exist
SELECT thread_id FROM runs WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: cancel_tree
-- Cancels a run and all its descendants at once, fencing out their holders.
WITH RECURSIVE tree(id) AS (
    SELECT :thread_id
    UNION ALL
    SELECT r.thread_id FROM runs r JOIN tree ON r.parent_thread_id = tree.id
)
UPDATE runs
SET status = 'cancelled', epoch = epoch + 1, lease_owner = NULL, lease_expires_at = NULL,
    wake_at = NULL, updated_at = (julianday('now') - 2440587.5) * 86400.0,
    {{resting('cancelled', (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id IN (SELECT id FROM tree) AND status NOT IN ('completed', 'failed', 'cancelled')
RETURNING thread_id;

-- name: retry_run
-- An operator runs a failed run again from its failed step: queued at :node, the error and
-- the failure count (the retry policy's budget) cleared; the attempt count stays, so the next
-- claim records a new attempt. Only a failed run moves.
UPDATE runs SET status = 'queued', node = :node, error = NULL, failures = 0, wake_at = NULL,
                lease_owner = NULL, lease_expires_at = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0,
                {{resting('queued', (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id = :thread_id AND status = 'failed'
RETURNING {{run_columns}};

-- name: release_worker_runs
-- An operator gives back every run a (dead or stale) worker leases, without waiting out the
-- TTL; the epoch bump fences the worker out should it still be alive.
UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, epoch = epoch + 1,
                updated_at = (julianday('now') - 2440587.5) * 86400.0,
                {{resting('queued', (julianday('now') - 2440587.5) * 86400.0)}}
WHERE lease_owner = :worker AND status = 'running'
RETURNING thread_id;

-- name: release_worker_effects
-- The same for the effects the worker leases: pending again at once, its epoch fenced out.
UPDATE outbox SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL, epoch = epoch + 1,
                  next_attempt_at = (julianday('now') - 2440587.5) * 86400.0
WHERE lease_owner = :worker AND status = 'running'
RETURNING thread_id;
