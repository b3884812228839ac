-- Postgres: the hot path of a step: journaled calls, the step commits (one statement each,
-- or many in a group commit), failed attempts and the checkpoint log.

-- name: insert_journal
-- Journals a call result only while the caller's epoch is current and the run is at the
-- step before the call's (as a step commit is fenced: after a failover to an asynchronous
-- standby that lost the worker's last commit, the run is a step behind its worker, and a
-- call of the worker's step journaled there would collide with the call of the step run
-- again). FOR SHARE holds off a concurrent claim (an epoch bump) until this commits; one
-- row back = journaled.
WITH r AS (
    SELECT thread_id FROM runs
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status || '' = 'running'
      AND step = %(step)s - 1
    FOR SHARE
)
INSERT INTO journal (thread_id, step, idx, name, result, args)
SELECT r.thread_id, %(step)s, %(idx)s, %(name)s, %(result)s, %(args)s FROM r
RETURNING 1;

-- name: load_journal
SELECT idx, name, result, args FROM journal
WHERE thread_id = %(thread_id)s AND step = %(step)s
ORDER BY idx;

-- name: load_journal_many
-- load_journal of many runs, each at its own step (Store.load_claimed): one primary-key
-- lookup per run (see load_checkpoints_many), in (thread_id, idx) order. The runs come as one
-- JSON array of {thread_id, step}.
SELECT j.thread_id, j.idx, j.name, j.result, j.args
FROM json_to_recordset(%(runs)s::json) AS x(thread_id text, step bigint),
     LATERAL (SELECT thread_id, idx, name, result, args FROM journal
              WHERE thread_id = x.thread_id AND step = x.step
              OFFSET 0) AS j
ORDER BY j.thread_id, j.idx;

-- name: journal_usage
-- The run's journaled results that carry their call's token usage (serde.with_usage: they
-- begin with %(prefix)s); one row per call, so a sum over them counts each call once.
SELECT result FROM journal
WHERE thread_id = %(thread_id)s AND substring(result FROM 1 FOR length(%(prefix)s)) = %(prefix)s;

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
-- JSON array (one parameter to encode, not an array element by element). The status test is
-- written `status || ''` so that no partial index on status (runs_open, runs_expiry) can serve
-- it: with statistics taken while few runs were running, the planner walked runs_open for
-- every id instead (O(running runs) per id; W2 at 5.9x ideal).
SELECT 1
FROM json_array_elements_text(%(ids)s::json) WITH ORDINALITY AS i(id, n),
     LATERAL (SELECT 1 FROM runs WHERE thread_id = i.id AND status || '' = 'running'
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
           r.finished_at, r.status, r.wake_at, r.waiting_for, r.ttl
    FROM json_to_recordset(%(rows)s::json)
        AS r(thread_id text, epoch bigint, step bigint, node text, next_node text, kind text,
             data text, worker text, attempt int, started_at float8, finished_at float8,
             status text, wake_at float8, waiting_for text, ttl float8)
),
f AS MATERIALIZED (
    -- Each row's run found by primary key, one lookup per row (OFFSET 0 keeps it so), and
    -- fenced there; the update then reaches those rows by TID. A join of x with runs would be
    -- planned, without statistics, as a scan of every running run.
    SELECT x.*, l.rid
    FROM x, LATERAL (SELECT ctid AS rid FROM runs
                     WHERE thread_id = x.thread_id AND epoch = x.epoch AND status || '' = 'running'
                       AND step = x.step - 1  -- (see fragment step_update)
                     OFFSET 0) AS l
),
u AS (
    UPDATE runs
    SET step = f.step, node = f.next_node, status = f.status,
        attempt = CASE WHEN f.status = 'running' THEN 1 ELSE 0 END, failures = 0,
        wake_at = f.wake_at, waiting_for = f.waiting_for,
        lease_owner = CASE WHEN f.status = 'running' THEN runs.lease_owner END,
        lease_expires_at = CASE WHEN f.status = 'running' THEN  -- see fragment step_update
            CASE WHEN runs.lease_expires_at < extract(epoch FROM clock_timestamp())::float8
                                              + f.ttl / 2
                 THEN extract(epoch FROM clock_timestamp())::float8 + f.ttl
                 ELSE runs.lease_expires_at END END,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    FROM f
    WHERE runs.ctid = ANY (ARRAY(SELECT rid FROM f)) AND runs.ctid = f.rid
      AND runs.epoch = f.epoch AND runs.status || '' = 'running' AND runs.step = f.step - 1
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
-- off any claim of these runs until the batch commits): each fenced on its own epoch and
-- step, as insert_journal.
-- Returns the (thread_id, step, idx) journaled. The rows come as one JSON array of
-- insert_journal's parameters (result as its UTF-8 text).
WITH x AS (
    SELECT r.thread_id, r.epoch, r.step, r.idx, r.name, convert_to(r.result, 'UTF8') AS result,
           r.args
    FROM json_to_recordset(%(rows)s::json)
        AS r(thread_id text, epoch bigint, step bigint, idx int, name text, result text,
             args text)
)
INSERT INTO journal (thread_id, step, idx, name, result, args)
SELECT x.thread_id, x.step, x.idx, x.name, x.result, x.args
FROM x, LATERAL (SELECT 1 FROM runs r  -- one primary-key lookup per row (OFFSET 0 keeps it so)
                 WHERE r.thread_id = x.thread_id AND r.epoch = x.epoch
                   AND r.status || '' = 'running' AND r.step = x.step - 1
                 OFFSET 0) AS fenced
RETURNING thread_id, step, idx;

-- name: commit_step_notify
-- commit_step that also spawns children (queued, ignored if they already exist), releases
-- the run as queued, or finishes it; all in one statement, and the children only if the
-- fenced update matched. A finished run wakes its parent if it is parked in join (see
-- fragment wake_joined_parent). Announces whatever became claimable. One row back =
-- committed.
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
    {{spawn_children}}
    RETURNING version
),
{{wake_joined_parent}},
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
    RETURNING {{run_columns}}
),
c AS (
    {{step_checkpoint}}
    RETURNING thread_id
),
{{wake_joined_parent}},
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
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status || '' = 'running'
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM u WHERE NOT %(final)s)
SELECT (SELECT count(*) FROM woke) FROM u;

-- name: load_checkpoints
-- The latest snapshot at or before upto and every later step up to upto, from one snapshot
-- of the table (a concurrent commit cannot split the two reads).
SELECT {{checkpoint_columns}}
FROM checkpoints
WHERE thread_id = %(thread_id)s AND step <= %(upto)s
  AND step >= coalesce((SELECT max(step) FROM checkpoints
                        WHERE thread_id = %(thread_id)s AND kind = 's' AND step <= %(upto)s),
                       0)
ORDER BY step;

-- name: load_checkpoints_many
-- load_checkpoints (no upto) of many runs (Store.load_claimed): each run's rows by primary
-- key, one lookup per run (LATERAL ... OFFSET 0: no scan of the table, whatever the
-- statistics), in (thread_id, step) order. The ids come as one JSON array.
SELECT c.*
FROM json_array_elements_text(%(ids)s::json) AS x(id),
     LATERAL (SELECT {{checkpoint_columns}}
              FROM checkpoints
              WHERE thread_id = x.id
                AND step >= coalesce((SELECT max(step) FROM checkpoints
                                      WHERE thread_id = x.id AND kind = 's'), 0)
              OFFSET 0) AS c
ORDER BY c.thread_id, c.step;

-- name: checkpoints
SELECT {{checkpoint_columns}}
FROM checkpoints WHERE thread_id = %(thread_id)s
ORDER BY step;
