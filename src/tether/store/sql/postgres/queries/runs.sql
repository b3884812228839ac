-- Named queries for the Postgres store (psycopg placeholders; no percent sign anywhere else).
-- NOW is the database clock in Unix seconds: extract(epoch FROM clock_timestamp())::float8;
-- a statement writing many rows reads it once (CTE t), so they share one time, as on SQLite.
-- Every write that makes a run claimable calls pg_notify('tether_work', version) in its own
-- statement, so the wake-up is delivered exactly when (and only if) the write commits.
-- Run rows are returned with the columns of RunRecord, in its order (fragment run_columns).
-- This file: runs (create, read, list), their leases (claim, renew, release) and cancels.

-- fragment: new_run_columns
-- The columns create_run and create_runs insert, in their SELECTs' order.
thread_id, agent, version, status, node, input, input_hash, idempotency_key,
                      parent_thread_id, forked_from, forked_step, lease_owner, lease_expires_at,
                      epoch, attempt, created_at, updated_at, trace_context

-- fragment: create_run_insert
-- create_run's first CTEs (the clock, the insert), each query adding its own after them.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
ins AS (
    INSERT INTO runs ({{new_run_columns}})
    SELECT %(thread_id)s, %(agent)s, %(version)s,
           CASE WHEN %(lease_owner)s::text IS NULL THEN 'queued' ELSE 'running' END,
           %(node)s, %(input)s, %(input_hash)s,
           %(idempotency_key)s, %(parent_thread_id)s, %(forked_from)s, %(forked_step)s::bigint,
           %(lease_owner)s::text, t.now + %(lease_ttl)s::float8,
           CASE WHEN %(lease_owner)s::text IS NULL THEN 0 ELSE 1 END,
           CASE WHEN %(lease_owner)s::text IS NULL THEN 0 ELSE 1 END,
           t.now, t.now, %(trace_context)s::text
    FROM t
    ON CONFLICT DO NOTHING
    RETURNING {{run_columns}}
),

-- fragment: create_run_result
-- create_run's announcement and its rows (after create_run_insert).
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM ins
                      WHERE ins.lease_owner IS NULL)
SELECT true, ins.*, (SELECT count(*) FROM woke) FROM ins
UNION ALL
(SELECT false, {{run_columns}}, 0
 FROM runs
 WHERE NOT EXISTS (SELECT 1 FROM ins)
   AND (thread_id = %(thread_id)s OR idempotency_key = %(idempotency_key)s)
 ORDER BY idempotency_key = %(idempotency_key)s DESC NULLS LAST
 LIMIT 1);

-- name: create_run
-- Inserts a queued run and announces it, or (lease_owner given: a worker of the starting
-- process takes it at once) a running one under that owner's lease at epoch 1, as if claimed,
-- unannounced. Or (inserting nothing) returns the run it collides with, preferring the
-- idempotency key's run; the first column says which. No row back means the colliding row
-- was committed after this statement's snapshot: read it again.
{{create_run_insert}}
{{create_run_result}}

-- name: create_run_audited
-- create_run with its audit row (insert_audit's columns, prefixed audit_), written only when
-- the run was created, in the same statement: so an audited start (every POST /runs) is
-- group-committed with other writes, as a start without audit is.
{{create_run_insert}}
aud AS (INSERT INTO audit (at, actor, action, thread_id, target, details)
        SELECT t.now, %(audit_actor)s, %(audit_action)s, %(audit_thread_id)s,
               %(audit_target)s, %(audit_details)s
        FROM t WHERE EXISTS (SELECT 1 FROM ins)),
{{create_run_result}}

-- fragment: create_runs_insert
-- create_runs' first CTEs: the clock, the rows (one JSON array of create_run's parameters,
-- input as its UTF-8 text, in the order written), the insert.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
r AS (  -- (inlined into ins where it is read once)
    SELECT * FROM ROWS FROM (json_to_recordset(%(rows)s::json)
        AS (thread_id text, agent text, version text, node text, input text,
            input_hash text, parent_thread_id text, forked_from text, forked_step bigint,
            lease_owner text, lease_ttl float8, trace_context text, audit_actor text,
            audit_action text, audit_thread_id text, audit_target text, audit_details text))
        WITH ORDINALITY AS r(thread_id, agent, version, node, input, input_hash,
                             parent_thread_id, forked_from, forked_step, lease_owner,
                             lease_ttl, trace_context, audit_actor, audit_action,
                             audit_thread_id, audit_target, audit_details, n)
),
ins AS (
    INSERT INTO runs ({{new_run_columns}})
    SELECT r.thread_id, r.agent, r.version,
           CASE WHEN r.lease_owner IS NULL THEN 'queued' ELSE 'running' END,
           r.node, convert_to(r.input, 'UTF8'), r.input_hash, NULL, r.parent_thread_id,
           r.forked_from, r.forked_step, r.lease_owner, t.now + r.lease_ttl,
           CASE WHEN r.lease_owner IS NULL THEN 0 ELSE 1 END,
           CASE WHEN r.lease_owner IS NULL THEN 0 ELSE 1 END, t.now, t.now, r.trace_context
    FROM r, t
    ON CONFLICT DO NOTHING
    RETURNING {{run_columns}}
),

-- fragment: create_runs_result
-- create_runs' announcement (one per version queued) and its rows (after create_runs_insert).
woke AS MATERIALIZED (SELECT pg_notify('tether_work', v.version)
                      FROM (SELECT DISTINCT version FROM ins WHERE lease_owner IS NULL) v)
SELECT true, ins.*, (SELECT count(*) FROM woke) FROM ins;

-- name: create_runs
-- Many create_runs without idempotency key in one statement, inside a group commit: each
-- inserted as create_run inserts it (queued and announced, or leased to a local worker),
-- returning the row create_run returns for it; a run whose thread_id exists returns nothing
-- (create_run then reads the run it collides with).
{{create_runs_insert}}
{{create_runs_result}}

-- name: create_runs_audited
-- create_runs of audited starts (every POST /runs, and `runtime.start(actor=...)`): each run
-- created gets its audit row (create_run_audited's parameters), in the order written; a run
-- that existed gets none. Without it, every start over HTTP was a statement of its own in
-- its group commit (executemany).
{{create_runs_insert}}
aud AS (INSERT INTO audit (at, actor, action, thread_id, target, details)
        SELECT t.now, r.audit_actor, r.audit_action, r.audit_thread_id, r.audit_target,
               r.audit_details
        FROM r JOIN ins ON ins.thread_id = r.thread_id, t
        ORDER BY r.n),
{{create_runs_result}}

-- name: get_run
SELECT {{run_columns}}
FROM runs WHERE thread_id = %(thread_id)s;

-- name: get_run_by_key
SELECT {{run_columns}}
FROM runs WHERE idempotency_key = %(key)s;

-- name: claim_runs
-- Leases claimable runs of one version: each claim bumps the fencing epoch, so any earlier
-- holder's writes (which check the epoch) are refused from here on. SKIP LOCKED: competing
-- claimers take disjoint rows and never wait on each other or on a committing step. Runs
-- due now come first, in due order (a range of runs_due: a queued run is due since it was
-- created), then runs whose lease expired, oldest expiry first (a range of runs_expiry), up
-- to the limit in all: neither part reads a run that is not claimable (the time bound is
-- a subquery, so it bounds each index range rather than filter every row read), and the
-- update reaches the rows they locked by TID, whatever the statistics say (a join of the
-- ids with runs was planned, once analyzed, as a scan of every run). The last column names
-- the worker whose expired lease a claim took over (NULL for a run that was due).
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
due AS MATERIALIZED (
    SELECT r.ctid AS rid FROM runs r
    WHERE r.version = %(version)s
      AND r.status IN ('queued', 'sleeping')
      AND coalesce(r.wake_at, r.created_at) <= (SELECT now FROM t)
      AND r.agent = ANY(%(agents)s::text[])
    ORDER BY coalesce(r.wake_at, r.created_at)
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
),
expired AS MATERIALIZED (
    SELECT r.ctid AS rid, r.thread_id, r.lease_owner FROM runs r
    WHERE r.version = %(version)s
      AND r.status = 'running'
      AND r.lease_expires_at < (SELECT now FROM t)
      AND r.agent = ANY(%(agents)s::text[])
    ORDER BY r.lease_expires_at
    LIMIT greatest(%(limit)s - (SELECT count(*) FROM due), 0)
    FOR UPDATE OF r SKIP LOCKED
)
UPDATE runs
SET status = 'running', lease_owner = %(worker)s,
    lease_expires_at = (SELECT now FROM t) + %(ttl)s::float8,
    epoch = epoch + 1, attempt = attempt + 1, wake_at = NULL,
    updated_at = (SELECT now FROM t)
WHERE ctid = ANY (ARRAY(SELECT rid FROM due UNION ALL SELECT rid FROM expired))
RETURNING {{run_columns}},
    (SELECT e.lease_owner FROM expired e WHERE e.thread_id = runs.thread_id) AS taken_from;

-- name: renew_leases
-- One statement renews every lease a worker holds. Rows are locked in thread_id order, the
-- order a group commit locks them in, so the two can never deadlock.
WITH held AS (
    SELECT thread_id FROM runs
    WHERE lease_owner = %(worker)s AND status = 'running'
      AND (%(only)s::text[] IS NULL OR thread_id = ANY(%(only)s::text[]))
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
    SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id IN (SELECT thread_id FROM l)
    RETURNING version
)
SELECT pg_notify('tether_work', v.version) FROM (SELECT DISTINCT version FROM u) v;

-- name: lock_tree
-- Locks a run, all its descendants and its parent, in thread_id order, before cancel_tree
-- decides anything: a step committing meanwhile (which may spawn children) finishes first.
WITH RECURSIVE tree(id) AS (
    SELECT %(thread_id)s::text
    UNION
    SELECT r.thread_id FROM runs r JOIN tree ON r.parent_thread_id = tree.id
)
SELECT thread_id FROM runs
WHERE thread_id IN (SELECT id FROM tree)
   OR thread_id = (SELECT parent_thread_id FROM runs WHERE thread_id = %(thread_id)s)
ORDER BY thread_id
FOR NO KEY UPDATE;

-- name: cancel_tree
-- Cancels a run and all its descendants at once (epoch bumps fence out their holders),
-- queues compensations for their effects named in names, and wakes the run's parent if it
-- is parked in join. Returns the cancelled thread_ids.
WITH RECURSIVE t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
tree(id) AS (
    SELECT %(thread_id)s::text
    UNION
    SELECT r.thread_id FROM runs r JOIN tree ON r.parent_thread_id = tree.id
),
u AS (
    UPDATE runs
    SET status = 'cancelled', epoch = epoch + 1, lease_owner = NULL, lease_expires_at = NULL,
        wake_at = NULL, updated_at = (SELECT now FROM t)
    WHERE thread_id IN (SELECT id FROM tree) AND status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING thread_id
),
ci AS (  -- a cancelled run's questions are withdrawn from the inbox
    UPDATE interrupts SET status = 'cancelled', resolved_at = (SELECT now FROM t)
    WHERE thread_id IN (SELECT thread_id FROM u) AND status = 'pending'
),
{{compensations}},
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = (SELECT parent_thread_id FROM runs WHERE thread_id = %(thread_id)s)
      AND status || '' = 'waiting' AND waiting_for = 'join' AND EXISTS (SELECT 1 FROM u)
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM wp),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '') WHERE EXISTS (SELECT 1 FROM comp))
SELECT u.thread_id, (SELECT count(*) FROM woke), (SELECT count(*) FROM fx) FROM u;

-- name: run_statuses
SELECT thread_id, status FROM runs WHERE thread_id = ANY(%(ids)s::text[]);

-- name: retry_run
-- An operator runs a failed run again from its failed step: queued at node, the error and
-- the failure count (the retry policy's budget) cleared; the attempt count stays, so the next
-- claim records a new attempt. Only a failed run moves; the workers of its version are woken.
WITH u AS (
    UPDATE runs SET status = 'queued', node = %(node)s, error = NULL, failures = 0, wake_at = NULL,
                    lease_owner = NULL, lease_expires_at = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND status = 'failed'
    RETURNING {{run_columns}}
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM u)
SELECT u.*, (SELECT count(*) FROM woke) FROM u;

-- name: release_worker_runs
-- An operator gives back every run a (dead or stale) worker leases, without waiting out the
-- TTL; the epoch bump fences the worker out should it still be alive. Locks in thread_id
-- order (see renew_leases).
WITH l AS (
    SELECT thread_id FROM runs
    WHERE lease_owner = %(worker)s AND status = 'running'
    ORDER BY thread_id
    FOR NO KEY UPDATE
),
u AS (
    UPDATE runs
    SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, epoch = epoch + 1,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id IN (SELECT thread_id FROM l)
    RETURNING thread_id, version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', v.version) FROM (SELECT DISTINCT version FROM u) v)
SELECT u.thread_id, (SELECT count(*) FROM woke) FROM u;

-- name: release_worker_effects
-- The same for the effects the worker leases: pending again at once, its epoch fenced out.
WITH u AS (
    UPDATE outbox
    SET status = 'pending', lease_owner = NULL, lease_expires_at = NULL, epoch = epoch + 1,
        next_attempt_at = extract(epoch FROM clock_timestamp())::float8
    WHERE lease_owner = %(worker)s AND status = 'running'
    RETURNING thread_id
),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '') WHERE EXISTS (SELECT 1 FROM u))
SELECT u.thread_id, (SELECT count(*) FROM fx) FROM u;
