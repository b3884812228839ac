-- Named queries for the Postgres store (psycopg placeholders; no percent sign anywhere else).
-- NOW is the database clock in Unix seconds: extract(epoch FROM clock_timestamp())::float8;
-- a statement writing many rows reads it once (CTE t), so they share one time, as on SQLite.
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
-- Inserts a queued run and announces it, or (lease_owner given: a worker of the starting
-- process takes it at once) a running one under that owner's lease at epoch 1, as if claimed,
-- unannounced. Or (inserting nothing) returns the run it collides with, preferring the
-- idempotency key's run; the first column says which. No row back means the colliding row
-- was committed after this statement's snapshot: read it again.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
ins AS (
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                      idempotency_key, parent_thread_id, forked_from, forked_step,
                      lease_owner, lease_expires_at, epoch, attempt, created_at, updated_at)
    SELECT %(thread_id)s, %(agent)s, %(version)s,
           CASE WHEN %(lease_owner)s::text IS NULL THEN 'queued' ELSE 'running' END,
           %(node)s, %(input)s, %(input_hash)s,
           %(idempotency_key)s, %(parent_thread_id)s, %(forked_from)s, %(forked_step)s::bigint,
           %(lease_owner)s::text, t.now + %(lease_ttl)s::float8,
           CASE WHEN %(lease_owner)s::text IS NULL THEN 0 ELSE 1 END,
           CASE WHEN %(lease_owner)s::text IS NULL THEN 0 ELSE 1 END,
           t.now, t.now
    FROM t
    ON CONFLICT DO NOTHING
    RETURNING thread_id, agent, version, status, node, step, attempt, failures, input,
              input_hash, idempotency_key, lease_owner, lease_expires_at, epoch, wake_at,
              waiting_for, error, parent_thread_id, forked_from, forked_step, created_at,
              updated_at
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM ins
                      WHERE ins.lease_owner IS NULL)
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

-- name: create_runs
-- Many create_runs of runs leased to a local worker (no idempotency key) in one statement,
-- inside a group commit: each inserted as create_run inserts it, returning the row
-- create_run returns for it; a run whose thread_id exists returns nothing (create_run then
-- reads the run it collides with). The rows come as one JSON array of create_run's
-- parameters (input as its UTF-8 text). Leased runs are not announced.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now)
INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash, idempotency_key,
                  parent_thread_id, forked_from, forked_step, lease_owner, lease_expires_at,
                  epoch, attempt, created_at, updated_at)
SELECT r.thread_id, r.agent, r.version, 'running', r.node, convert_to(r.input, 'UTF8'),
       r.input_hash, NULL, r.parent_thread_id, r.forked_from, r.forked_step, r.lease_owner,
       t.now + r.lease_ttl, 1, 1, t.now, t.now
FROM json_to_recordset(%(rows)s::json)
    AS r(thread_id text, agent text, version text, node text, input text, input_hash text,
         parent_thread_id text, forked_from text, forked_step bigint, lease_owner text,
         lease_ttl float8),
     t
ON CONFLICT DO NOTHING
RETURNING true, thread_id, agent, version, status, node, step, attempt, failures, input,
          input_hash, idempotency_key, lease_owner, lease_expires_at, epoch, wake_at,
          waiting_for, error, parent_thread_id, forked_from, forked_step, created_at,
          updated_at, 0;

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
-- claimers take disjoint rows and never wait on each other or on a committing step. Runs
-- due now come first, in due order (a range of runs_due: a queued run is due since it was
-- created), then runs whose lease expired, oldest expiry first (a range of runs_expiry), up
-- to the limit in all: neither part reads a run that is not claimable (the time bound is
-- a subquery, so it bounds each index range rather than filter every row read), and the
-- update reaches the rows they locked by TID, whatever the statistics say (a join of the
-- ids with runs was planned, once analyzed, as a scan of every run).
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
    SELECT r.ctid AS rid FROM runs r
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
    SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL,
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

-- fragment: step_update
-- The step commits of one run (commit_step, commit_step_notify, commit_step_wake,
-- commit_step_tx) share these two: the run moved past the step, fenced by the epoch (u), and
-- the step's checkpoint, only if u matched (each adds its own RETURNING).
    UPDATE runs
    SET step = %(step)s, node = %(next_node)s, status = %(status)s,
        attempt = CASE WHEN %(status)s = 'running' THEN 1 ELSE 0 END, failures = 0,
        wake_at = %(wake_at)s, waiting_for = %(waiting_for)s,
        lease_owner = CASE WHEN %(status)s = 'running' THEN lease_owner END,
        lease_expires_at = CASE WHEN %(status)s = 'running' THEN lease_expires_at END,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status = 'running'

-- fragment: step_checkpoint
    INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, attempt,
                             started_at, finished_at)
    SELECT u.thread_id, %(step)s, %(node)s, %(next_node)s, %(kind)s, %(data)s, %(worker)s,
           %(attempt)s, %(started_at)s, %(finished_at)s
    FROM u

-- name: commit_step
-- The hot path, one statement: moves the run past the step (or finishes a run that has no
-- parent to wake) and appends its checkpoint, fenced by the epoch. One row back, (thread_id,
-- updated_at), = committed; none = lease lost, nothing written.
WITH u AS (
    {{step_update}}
    RETURNING thread_id, updated_at
),
c AS (
    {{step_checkpoint}}
)
SELECT thread_id, updated_at FROM u;

-- name: lock_batch
-- First statement of a group-commit transaction: locks the run rows of every write in the
-- batch, in thread_id order (the caller sorts the ids; the order every multi-row lock takes,
-- so none can deadlock with another). The batch's later statements then read those rows as
-- they are now. One primary-key lookup per id, whatever the planner's statistics say: a scan
-- of every running run would grow with their number, not with the batch. The ids come as one
-- JSON array (one parameter to encode, not an array element by element).
SELECT 1
FROM json_array_elements_text(%(ids)s::json) WITH ORDINALITY AS i(id, n),
     LATERAL (SELECT 1 FROM runs WHERE thread_id = i.id AND status = 'running'
              FOR NO KEY UPDATE) AS l
ORDER BY i.n;

-- name: commit_steps
-- Many commit_steps (distinct runs) in one statement, inside a group commit after
-- lock_batch: each row fenced on its own epoch exactly as commit_step; only the runs that
-- match move (or finish) and get their checkpoint. Returns commit_step's row, (thread_id,
-- updated_at), for each run committed. The rows come as
-- one JSON array of commit_step's parameters (data as its UTF-8 text): one parameter to
-- encode, not an array per column.
WITH x AS (
    SELECT r.thread_id, r.epoch, r.step, r.node, r.next_node, r.kind,
           convert_to(r.data, 'UTF8') AS data, r.worker, r.attempt, r.started_at,
           r.finished_at, r.status, r.wake_at, r.waiting_for
    FROM json_to_recordset(%(rows)s::json)
        AS r(thread_id text, epoch bigint, step bigint, node text, next_node text, kind text,
             data text, worker text, attempt int, started_at float8, finished_at float8,
             status text, wake_at float8, waiting_for text)
),
f AS MATERIALIZED (
    -- Each row's run found by primary key, one lookup per row (OFFSET 0 keeps it so), and
    -- fenced there; the update then reaches those rows by TID. A join of x with runs would be
    -- planned, without statistics, as a scan of every running run.
    SELECT x.*, l.rid
    FROM x, LATERAL (SELECT ctid AS rid FROM runs
                     WHERE thread_id = x.thread_id AND epoch = x.epoch AND status = 'running'
                     OFFSET 0) AS l
),
u AS (
    UPDATE runs
    SET step = f.step, node = f.next_node, status = f.status,
        attempt = CASE WHEN f.status = 'running' THEN 1 ELSE 0 END, failures = 0,
        wake_at = f.wake_at, waiting_for = f.waiting_for,
        lease_owner = CASE WHEN f.status = 'running' THEN runs.lease_owner END,
        lease_expires_at = CASE WHEN f.status = 'running' THEN runs.lease_expires_at END,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    FROM f
    WHERE runs.ctid = ANY (ARRAY(SELECT rid FROM f)) AND runs.ctid = f.rid
      AND runs.epoch = f.epoch AND runs.status = 'running'
    RETURNING runs.thread_id, runs.updated_at
),
c AS (
    INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, attempt,
                             started_at, finished_at)
    SELECT x.thread_id, x.step, x.node, x.next_node, x.kind, x.data, x.worker, x.attempt,
           x.started_at, x.finished_at
    FROM x JOIN u ON u.thread_id = x.thread_id
)
SELECT thread_id, updated_at FROM u;

-- name: insert_journals
-- Many record_calls in one statement, inside a group commit after lock_batch (which holds
-- off any claim of these runs until the batch commits): each fenced on its own epoch.
-- Returns the (thread_id, step, idx) journaled. The rows come as one JSON array of
-- insert_journal's parameters (result as its UTF-8 text).
WITH x AS (
    SELECT r.thread_id, r.epoch, r.step, r.idx, r.name, convert_to(r.result, 'UTF8') AS result
    FROM json_to_recordset(%(rows)s::json)
        AS r(thread_id text, epoch bigint, step bigint, idx int, name text, result text)
)
INSERT INTO journal (thread_id, step, idx, name, result)
SELECT x.thread_id, x.step, x.idx, x.name, x.result
FROM x, LATERAL (SELECT 1 FROM runs r  -- one primary-key lookup per row (OFFSET 0 keeps it so)
                 WHERE r.thread_id = x.thread_id AND r.epoch = x.epoch
                   AND r.status = 'running' OFFSET 0) AS fenced
RETURNING thread_id, step, idx;

-- name: commit_step_notify
-- commit_step that also spawns children (queued, ignored if they already exist), releases
-- the run as queued, or finishes it; all in one statement, and the children only if the
-- fenced update matched. A finished run wakes its parent if it is parked in join: lk locks
-- the parent row first, which returns its latest version (waiting for a park in progress to
-- commit), and wp updates through it, so a park and this wake-up cannot miss each other (the
-- parent's requeue_if_joined runs after its park took the row). Announces whatever became
-- claimable. One row back = committed.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
u AS (
    {{step_update}}
    RETURNING thread_id, version, status, parent_thread_id
),
c AS (
    {{step_checkpoint}}
    RETURNING thread_id
),
k AS (
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                      idempotency_key, parent_thread_id, forked_from, forked_step,
                      created_at, updated_at)
    SELECT x.thread_id, x.agent, x.version, 'queued', x.node, x.input, x.input_hash,
           x.idempotency_key, x.parent_thread_id, x.forked_from, x.forked_step,
           t.now, t.now
    FROM u, t, unnest(%(c_thread_id)s::text[], %(c_agent)s::text[], %(c_version)s::text[],
                   %(c_node)s::text[], %(c_input)s::bytea[], %(c_input_hash)s::text[],
                   %(c_idempotency_key)s::text[], %(c_parent_thread_id)s::text[],
                   %(c_forked_from)s::text[], %(c_forked_step)s::bigint[])
         AS x(thread_id, agent, version, node, input, input_hash, idempotency_key,
              parent_thread_id, forked_from, forked_step)
    ON CONFLICT DO NOTHING
    RETURNING version
),
lk AS (
    SELECT r.thread_id, r.status, r.waiting_for FROM runs r
    WHERE r.thread_id = (SELECT parent_thread_id FROM u
                         WHERE status IN ('completed', 'failed', 'cancelled'))
    FOR NO KEY UPDATE
),
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL, updated_at = t.now
    FROM lk, t
    WHERE runs.thread_id = lk.thread_id AND lk.status = 'waiting' AND lk.waiting_for = 'join'
    RETURNING runs.version
),
woke AS MATERIALIZED (
    SELECT pg_notify('tether_work', v.version)
    FROM (SELECT version FROM k UNION SELECT version FROM u WHERE status = 'queued'
          UNION SELECT version FROM wp) v
)
SELECT (SELECT count(*) FROM woke) FROM c;

-- name: commit_step_wake
-- commit_step that releases the run as queued (announced) or finishes it, waking its parent
-- if that is parked in join (see commit_step_notify); no children. One row back = committed:
-- the run as it is now, then the number of notifications sent.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
u AS (
    {{step_update}}
    RETURNING *
),
c AS (
    {{step_checkpoint}}
    RETURNING thread_id
),
lk AS (
    SELECT r.thread_id, r.status, r.waiting_for FROM runs r
    WHERE r.thread_id = (SELECT parent_thread_id FROM u
                         WHERE status IN ('completed', 'failed', 'cancelled'))
    FOR NO KEY UPDATE
),
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL, updated_at = t.now
    FROM lk, t
    WHERE runs.thread_id = lk.thread_id AND lk.status = 'waiting' AND lk.waiting_for = 'join'
    RETURNING runs.version
),
woke AS MATERIALIZED (
    SELECT pg_notify('tether_work', v.version)
    FROM (SELECT version FROM u WHERE status = 'queued' UNION SELECT version FROM wp) v
)
SELECT u.*, (SELECT count(*) FROM woke) FROM u JOIN c ON c.thread_id = u.thread_id;

-- name: fail_step
-- Records a failed attempt, fenced: final -> failed with the error; else queued until
-- wake_at, and announced. One row back = recorded; none = lease lost. (The store sends final
-- failures through fail_step_final, which also compensates and wakes a parent.)
WITH u AS (
    UPDATE runs
    SET status = CASE WHEN %(final)s THEN 'failed' ELSE 'queued' END,
        node = CASE WHEN %(final)s THEN NULL ELSE node END,
        failures = %(failures)s, wake_at = %(wake_at)s::float8, error = %(error)s::bytea,
        lease_owner = NULL, lease_expires_at = NULL,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status = 'running'
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM u WHERE NOT %(final)s)
SELECT (SELECT count(*) FROM woke) FROM u;

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

-- name: lock_runs
-- Locks every run row a multi-statement write will touch (the run itself, the runs it sends
-- mail to, its parent when it finishes), in thread_id order like every other multi-row lock,
-- before any of them is read for a decision: a concurrent park or send either commits first
-- (and the later statements of this transaction see it) or waits for us. Returns the ones
-- that exist.
SELECT thread_id FROM runs
WHERE thread_id = ANY(%(ids)s::text[])
   OR thread_id = (SELECT parent_thread_id FROM runs
                   WHERE thread_id = %(thread_id)s AND %(parent)s::boolean)
ORDER BY thread_id
FOR NO KEY UPDATE;

-- name: effect_keys_taken
-- Which of a step's effect keys the run already used (explicit keys must be unique per run).
SELECT key FROM outbox WHERE thread_id = %(thread_id)s AND key = ANY(%(keys)s::text[]);

-- name: commit_step_tx
-- commit_step with everything a step may carry, for a transaction that locked the rows
-- first (lock_runs): the fenced update and checkpoint, then, only if the fence held,
-- children, group memberships, consumed mail, sent mail and effects (transactional ones
-- already done). One row back = committed.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
u AS (
    {{step_update}}
    RETURNING thread_id
),
c AS (
    {{step_checkpoint}}
    RETURNING thread_id
),
k AS (
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                      idempotency_key, parent_thread_id, forked_from, forked_step,
                      created_at, updated_at)
    SELECT x.thread_id, x.agent, x.version, 'queued', x.node, x.input, x.input_hash,
           x.idempotency_key, x.parent_thread_id, x.forked_from, x.forked_step,
           t.now, t.now
    FROM u, t, unnest(%(c_thread_id)s::text[], %(c_agent)s::text[], %(c_version)s::text[],
                   %(c_node)s::text[], %(c_input)s::bytea[], %(c_input_hash)s::text[],
                   %(c_idempotency_key)s::text[], %(c_parent_thread_id)s::text[],
                   %(c_forked_from)s::text[], %(c_forked_step)s::bigint[])
         AS x(thread_id, agent, version, node, input, input_hash, idempotency_key,
              parent_thread_id, forked_from, forked_step)
    ON CONFLICT DO NOTHING
),
g AS (
    INSERT INTO group_members (group_name, thread_id, role, joined_at)
    SELECT x.group_name, u.thread_id, x.role, t.now
    FROM u, t, unnest(%(g_names)s::text[], %(g_roles)s::text[]) AS x(group_name, role)
    ON CONFLICT (group_name, thread_id) DO UPDATE SET role = excluded.role
),
cm AS (
    UPDATE mailbox SET consumed_step = %(step)s
    WHERE thread_id = %(thread_id)s AND consumed_step IS NULL
      AND id = ANY(%(consumed)s::bigint[]) AND EXISTS (SELECT 1 FROM u)
),
sm AS (
    INSERT INTO mailbox (thread_id, sender, message, created_at)
    SELECT x.recipient, u.thread_id, x.message, t.now
    FROM u, t, unnest(%(m_recipients)s::text[], %(m_messages)s::bytea[]) WITH ORDINALITY
         AS x(recipient, message, n)
    ORDER BY x.n
),
e AS (
    INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at,
                        compensates, created_at, compensable, attempts, done_at)
    SELECT u.thread_id, x.key, %(step)s, x.idx, x.name, x.payload, x.status, t.now, NULL,
           t.now, x.compensable, CASE WHEN x.status = 'done' THEN 1 ELSE 0 END,
           CASE WHEN x.status = 'done' THEN t.now END
    FROM u, t, unnest(%(e_keys)s::text[], %(e_idxs)s::bigint[], %(e_names)s::text[],
                   %(e_payloads)s::bytea[], %(e_statuses)s::text[], %(e_compensables)s::bool[])
         AS x(key, idx, name, payload, status, compensable)
    ON CONFLICT DO NOTHING  -- a used key: effect_keys_taken reports it, the caller rolls back
)
SELECT 1 FROM c;

-- name: commit_guard
-- The last statement of a step transaction that sends its COMMIT in the same pipeline (see
-- _commit_tx): fails it, so the COMMIT does not run and the caller rolls back, unless the step
-- committed under the caller's epoch, every effect key was new to the run, and every direct
-- recipient exists. (Division by zero: plain SQL, no function.) The caller then reads the
-- earlier statements' results to raise LeaseLost, DuplicateEffectKey or RunNotFound.
SELECT 1 / (CASE WHEN
        EXISTS (SELECT 1 FROM runs
                WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND step = %(step)s)
        AND (SELECT count(*) FROM outbox
             WHERE thread_id = %(thread_id)s AND key = ANY(%(e_keys)s::text[])
               AND step = %(step)s) = cardinality(%(e_keys)s::text[])
        AND (SELECT count(*) FROM runs WHERE thread_id = ANY(%(direct)s::text[]))
            = cardinality(%(direct)s::text[])
    THEN 1 ELSE 0 END);

-- name: wake_after_commit
-- The wake-ups of a step's transaction, read after lock_runs (a fresh snapshot): recipients
-- idle for mail become queued; so does the run itself if it parks for mail while mail waits;
-- a finished run's parent parked in join re-checks its children. Announces them (and, when
-- asked, the run's own new work) on tether_work.
WITH wm AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = ANY(%(recipients)s::text[]) AND status = 'waiting' AND waiting_for = 'mail'
    RETURNING version
),
rq AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL
    WHERE %(mail)s::boolean AND thread_id = %(thread_id)s AND status = 'waiting'
      AND waiting_for = 'mail'
      AND NOT (thread_id = ANY(%(recipients)s::text[]))
      AND EXISTS (SELECT 1 FROM mailbox WHERE thread_id = %(thread_id)s AND consumed_step IS NULL)
    RETURNING version
),
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE %(parent)s::boolean
      AND thread_id = (SELECT parent_thread_id FROM runs WHERE thread_id = %(thread_id)s)
      AND status = 'waiting' AND waiting_for = 'join'
    RETURNING version
),
woke AS MATERIALIZED (
    SELECT pg_notify('tether_work', v.version)
    FROM (SELECT version FROM wm UNION SELECT version FROM rq UNION SELECT version FROM wp
          UNION SELECT version FROM runs WHERE thread_id = %(thread_id)s AND %(notify)s::boolean) v
),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '') WHERE %(effects)s::boolean)
SELECT (SELECT count(*) FROM woke), (SELECT count(*) FROM fx);

-- name: fail_step_final
-- A final failure inside a transaction that locked the run and its parent (lock_runs): the
-- run fails with the error, compensations are queued for its effects named in names, and a
-- parent parked in join is woken (after the lock, so a concurrent park cannot miss it).
-- One row back = recorded.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
u AS (
    UPDATE runs
    SET status = 'failed', node = NULL, failures = %(failures)s, wake_at = %(wake_at)s::float8,
        error = %(error)s::bytea, lease_owner = NULL, lease_expires_at = NULL,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status = 'running'
    RETURNING thread_id, parent_thread_id
),
comp AS (
    INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at,
                        compensates, created_at)
    SELECT o.thread_id, o.key || ':compensate', %(comp_step)s, -(o.step * 100000 + o.idx),
           o.name, o.payload, 'pending', t.now, o.key, t.now
    FROM t, outbox o JOIN u ON o.thread_id = u.thread_id
    WHERE o.compensates IS NULL AND o.status IN ('pending', 'running', 'done')
      AND (o.compensable OR o.name = ANY(%(names)s::text[]))
    ON CONFLICT DO NOTHING
    RETURNING 1
),
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = (SELECT parent_thread_id FROM u)
      AND status = 'waiting' AND waiting_for = 'join'
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM wp),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '') WHERE EXISTS (SELECT 1 FROM comp))
SELECT (SELECT count(*) FROM woke), (SELECT count(*) FROM fx) FROM u;

-- name: send_message
-- Delivers mail from outside a step (the recipient's row is locked by lock_runs first), and
-- wakes the recipient if it is idle for mail. No row back = no such run.
WITH m AS (
    INSERT INTO mailbox (thread_id, sender, message, created_at)
    SELECT thread_id, %(sender)s, %(message)s, extract(epoch FROM clock_timestamp())::float8
    FROM runs WHERE thread_id = %(thread_id)s
    RETURNING id
),
w AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND status = 'waiting' AND waiting_for = 'mail'
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM w)
SELECT m.id, (SELECT count(*) FROM woke) FROM m;

-- name: load_inbox
SELECT id, sender, message, created_at FROM mailbox
WHERE thread_id = %(thread_id)s AND consumed_step IS NULL
ORDER BY id
LIMIT %(limit)s;

-- name: inbox_depth
SELECT count(*) FROM mailbox WHERE thread_id = %(thread_id)s AND consumed_step IS NULL;

-- name: group_members
SELECT thread_id FROM group_members WHERE group_name = %(group_name)s ORDER BY thread_id;

-- name: group_recipients
-- Who a step's group messages go to: every member but the sender.
SELECT group_name, thread_id FROM group_members
WHERE group_name = ANY(%(groups)s::text[]) AND thread_id <> %(thread_id)s
ORDER BY group_name, thread_id;

-- name: park_run
-- Parks a running run (interrupt or join -> waiting, sleep -> sleeping until NOW + seconds),
-- fenced by the epoch; the lease is released: a parked run holds no worker. In the same
-- statement: the children it spawns, and the pending interrupt or the journaled timer.
-- One row back = parked.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
u AS (
    UPDATE runs
    SET status = %(status)s, waiting_for = %(waiting_for)s,
        wake_at = extract(epoch FROM clock_timestamp())::float8 + %(seconds)s::float8,
        lease_owner = NULL, lease_expires_at = NULL, attempt = 0, failures = 0,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status = 'running'
    RETURNING thread_id
),
k AS (
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                      idempotency_key, parent_thread_id, forked_from, forked_step,
                      created_at, updated_at)
    SELECT x.thread_id, x.agent, x.version, 'queued', x.node, x.input, x.input_hash,
           x.idempotency_key, x.parent_thread_id, x.forked_from, x.forked_step,
           t.now, t.now
    FROM u, t, unnest(%(c_thread_id)s::text[], %(c_agent)s::text[], %(c_version)s::text[],
                   %(c_node)s::text[], %(c_input)s::bytea[], %(c_input_hash)s::text[],
                   %(c_idempotency_key)s::text[], %(c_parent_thread_id)s::text[],
                   %(c_forked_from)s::text[], %(c_forked_step)s::bigint[])
         AS x(thread_id, agent, version, node, input, input_hash, idempotency_key,
              parent_thread_id, forked_from, forked_step)
    ON CONFLICT DO NOTHING
    RETURNING version
),
i AS (
    -- A re-execution that reaches the same interrupt again keeps the first id.
    INSERT INTO interrupts (thread_id, step, idx, id, payload, status, created_at)
    SELECT u.thread_id, %(step)s, %(idx)s, %(interrupt_id)s, %(payload)s::bytea, 'pending',
           extract(epoch FROM clock_timestamp())::float8
    FROM u WHERE %(kind)s = 'interrupt'
    ON CONFLICT (thread_id, step, idx) DO NOTHING
),
j AS (
    INSERT INTO journal (thread_id, step, idx, name, result)
    SELECT u.thread_id, %(step)s, %(idx)s, %(sleep_name)s, %(timer)s::bytea
    FROM u WHERE %(kind)s = 'sleep'
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM (SELECT DISTINCT version FROM k) v)
SELECT (SELECT count(*) FROM woke) FROM u;

-- name: requeue_if_joined
-- A parent parking in join whose children all finished meanwhile stays claimable. A later
-- statement than the park (a fresh snapshot): a child that finishes after it locks this row
-- and wakes it (wake_after_commit) instead.
WITH w AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL
    WHERE thread_id = %(thread_id)s AND status = 'waiting' AND waiting_for = 'join'
      AND NOT EXISTS (SELECT 1 FROM runs c
                      WHERE c.thread_id = ANY(%(children)s::text[])
                        AND c.status NOT IN ('completed', 'failed', 'cancelled'))
    RETURNING version
)
SELECT pg_notify('tether_work', version) FROM w;

-- name: resume_interrupt
-- Answers the run's pending interrupt exactly once (a concurrent second answer waits on the
-- row, then finds it resolved), journals the value for the re-executed node, and makes the
-- run claimable, announced; all or nothing.
WITH r AS (
    UPDATE interrupts
    SET value = %(value)s, status = 'resolved',
        resolved_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND status = 'pending'
      AND (%(id)s::text IS NULL OR id = %(id)s::text)
      AND EXISTS (SELECT 1 FROM runs WHERE thread_id = %(thread_id)s AND status = 'waiting')
    RETURNING thread_id, step, idx, id, payload, value, status, created_at, resolved_at
),
j AS (
    INSERT INTO journal (thread_id, step, idx, name, result)
    SELECT thread_id, step, idx, %(name)s, %(value)s FROM r
),
w AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL, wake_at = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND status = 'waiting' AND EXISTS (SELECT 1 FROM r)
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM w)
SELECT r.*, (SELECT count(*) FROM woke) FROM r;

-- name: get_interrupt
SELECT thread_id, step, idx, id, payload, value, status, created_at, resolved_at
FROM interrupts WHERE id = %(id)s;

-- name: list_interrupts
SELECT thread_id, step, idx, id, payload, value, status, created_at, resolved_at
FROM interrupts
WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
ORDER BY created_at, id
LIMIT %(limit)s;

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
c AS (
    UPDATE runs
    SET status = 'cancelled', epoch = epoch + 1, lease_owner = NULL, lease_expires_at = NULL,
        wake_at = NULL, updated_at = (SELECT now FROM t)
    WHERE thread_id IN (SELECT id FROM tree) AND status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING thread_id
),
ci AS (  -- a cancelled run's questions are withdrawn from the inbox
    UPDATE interrupts SET status = 'cancelled', resolved_at = (SELECT now FROM t)
    WHERE thread_id IN (SELECT thread_id FROM c) AND status = 'pending'
),
comp AS (
    INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at,
                        compensates, created_at)
    SELECT o.thread_id, o.key || ':compensate', %(comp_step)s, -(o.step * 100000 + o.idx),
           o.name, o.payload, 'pending', t.now, o.key, t.now
    FROM t, outbox o JOIN c ON o.thread_id = c.thread_id
    WHERE o.compensates IS NULL AND o.status IN ('pending', 'running', 'done')
      AND (o.compensable OR o.name = ANY(%(names)s::text[]))
    ON CONFLICT DO NOTHING
    RETURNING 1
),
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = (SELECT parent_thread_id FROM runs WHERE thread_id = %(thread_id)s)
      AND status = 'waiting' AND waiting_for = 'join' AND EXISTS (SELECT 1 FROM c)
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM wp),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '') WHERE EXISTS (SELECT 1 FROM comp))
SELECT c.thread_id, (SELECT count(*) FROM woke), (SELECT count(*) FROM fx) FROM c;

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
    RETURNING thread_id, key, step, idx, name, payload, status, attempts, epoch,
              next_attempt_at, result, error, compensates, created_at, done_at
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
      AND status = 'running'
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

-- name: run_statuses
SELECT thread_id, status FROM runs WHERE thread_id = ANY(%(ids)s::text[]);

-- name: get_effect
SELECT thread_id, key, step, idx, name, payload, status, attempts, epoch, next_attempt_at,
       result, error, compensates, created_at, done_at
FROM outbox WHERE thread_id = %(thread_id)s AND key = %(key)s;

-- name: list_effects
SELECT thread_id, key, step, idx, name, payload, status, attempts, epoch, next_attempt_at,
       result, error, compensates, created_at, done_at
FROM outbox
WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
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
    RETURNING thread_id, key, step, idx, name, payload, status, attempts, epoch,
              next_attempt_at, result, error, compensates, created_at, done_at
),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '') WHERE EXISTS (SELECT 1 FROM u))
SELECT u.*, (SELECT count(*) FROM fx) FROM u;
