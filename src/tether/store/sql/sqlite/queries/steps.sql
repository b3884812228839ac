-- SQLite: journaled calls, step commits (the hot path's fenced writes, one statement per
-- row or one per group commit: the *_set forms), failures, parks and the checkpoint log.

-- name: insert_journal
-- Journals a call result only while the caller's epoch is current. Positional parameters
-- (thread_id, step, idx, name, result, epoch, args): batched in one executemany.
INSERT INTO journal (thread_id, step, idx, name, result, args)
SELECT ?1, ?2, ?3, ?4, ?5, ?7
WHERE EXISTS (SELECT 1 FROM runs WHERE thread_id = ?1 AND epoch = ?6 AND status = 'running');

-- name: load_journal
SELECT idx, name, result, args FROM journal WHERE thread_id = :thread_id AND step = :step ORDER BY idx;

-- name: load_journals
-- load_journal for many runs in one statement (Store.load_claimed): ?1 is a JSON array of
-- [thread_id, step]; each pair is one range of the primary key, in the order given.
SELECT j.value ->> 0, r.idx, r.name, r.result, r.args
FROM json_each(?1) AS j CROSS JOIN journal AS r
WHERE r.thread_id = j.value ->> 0 AND r.step = j.value ->> 1
ORDER BY j.key, r.idx;

-- name: journal_usage
-- The run's journaled results that carry their call's token usage (serde.with_usage: they
-- begin with :prefix); one row per call, so a sum over them counts each call once.
SELECT result FROM journal
WHERE thread_id = :thread_id AND substr(result, 1, length(:prefix)) = :prefix;

-- name: commit_run
-- Moves the run past a committed step, fenced by the epoch; returns the run as it is now
-- (no row = lease lost).
UPDATE runs
SET step = :step, node = :next_node, status = :status,
    attempt = CASE WHEN :status = 'running' THEN 1 ELSE 0 END, failures = 0,
    wake_at = :wake_at, waiting_for = :waiting_for,
    lease_owner = CASE WHEN :status = 'running' THEN lease_owner END,
    lease_expires_at = CASE WHEN :status = 'running' THEN lease_expires_at END,
    updated_at = (julianday('now') - 2440587.5) * 86400.0,
    {{resting(:status, (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id = :thread_id AND epoch = :epoch AND status = 'running'
RETURNING {{run_columns}};

-- name: commit_run_on
-- commit_run's form for a run that stays running (the lease kept): status is left out of the
-- SET, so no index that involves status (runs_open, runs_due, runs_idle...) is revisited for
-- a status that does not change.
UPDATE runs
SET step = :step, node = :next_node, attempt = 1, failures = 0,
    wake_at = :wake_at, waiting_for = :waiting_for,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND epoch = :epoch AND status = 'running'
RETURNING {{run_columns}};

-- name: advance_run
-- The common case of commit_run: the run stays running on the same lease and moves to its
-- next step. Touches no indexed column, so no index entry is rewritten. Positional parameters
-- (step, next_node, thread_id, epoch): batched in one executemany.
UPDATE runs
SET step = ?1, node = ?2, attempt = 1, failures = 0,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = ?3 AND epoch = ?4 AND status = 'running';

-- name: finish_run
-- commit_run's finishing case, batched: the run completes and gives up its lease.
-- Positional parameters (step, status, thread_id, epoch, now).
UPDATE runs
SET step = ?1, node = NULL, status = ?2, attempt = 0, failures = 0, wake_at = NULL,
    waiting_for = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = ?5,
    {{resting(?2, ?5)}}
WHERE thread_id = ?3 AND epoch = ?4 AND status = 'running';

-- name: finish_run_set
-- finish_run for a whole group commit: ?1 is a JSON array of its parameter lists.
UPDATE runs
SET step = f.value ->> 0, node = NULL, status = f.value ->> 1, attempt = 0, failures = 0,
    wake_at = NULL, waiting_for = NULL, lease_owner = NULL, lease_expires_at = NULL,
    updated_at = f.value ->> 4, {{resting(f.value ->> 1, f.value ->> 4)}}
FROM json_each(?1) AS f
WHERE runs.thread_id = f.value ->> 2 AND runs.epoch = f.value ->> 3
  AND runs.status = 'running';

-- name: insert_checkpoint
-- Positional parameters, in column order: batched in one executemany.
INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, attempt,
                         started_at, finished_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: insert_journal_set
-- insert_journal for a whole group commit in one statement (the writer thread runs one
-- statement per kind, not one per row): ?1 is a JSON array of insert_journal's parameter
-- lists, the result blob as a string.
INSERT INTO journal (thread_id, step, idx, name, result, args)
SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, CAST(j.value ->> 4 AS BLOB),
       j.value ->> 6
FROM json_each(?1) AS j
WHERE EXISTS (SELECT 1 FROM runs
              WHERE thread_id = j.value ->> 0 AND epoch = j.value ->> 5 AND status = 'running');

-- name: advance_run_set
-- advance_run for a whole group commit: ?1 is a JSON array of its parameter lists.
UPDATE runs
SET step = b.value ->> 0, node = b.value ->> 1, attempt = 1, failures = 0,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
FROM json_each(?1) AS b
WHERE runs.thread_id = b.value ->> 2 AND runs.epoch = b.value ->> 3 AND runs.status = 'running';

-- name: insert_checkpoint_set
-- insert_checkpoint for a whole group commit: ?1 is a JSON array of its parameter lists,
-- the data blob as a string.
INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, attempt,
                         started_at, finished_at)
SELECT c.value ->> 0, c.value ->> 1, c.value ->> 2, c.value ->> 3, c.value ->> 4,
       CAST(c.value ->> 5 AS BLOB), c.value ->> 6, c.value ->> 7, c.value ->> 8, c.value ->> 9
FROM json_each(?1) AS c;

-- name: fail_step
-- Records a failed attempt, fenced: final -> failed with the error; else queued until wake_at.
UPDATE runs
SET status = CASE WHEN :final THEN 'failed' ELSE 'queued' END,
    node = CASE WHEN :final THEN NULL ELSE node END,
    failures = :failures, wake_at = :wake_at, error = :error,
    lease_owner = NULL, lease_expires_at = NULL,
    updated_at = (julianday('now') - 2440587.5) * 86400.0,
    {{resting(CASE WHEN :final THEN 'failed' ELSE 'queued' END, (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id = :thread_id AND epoch = :epoch AND status = 'running';

-- name: load_checkpoints
-- The log from the last snapshot at or before :upto, in one statement (one read snapshot).
SELECT {{checkpoint_columns}} FROM checkpoints
WHERE thread_id = :thread_id AND step <= :upto
  AND step >= coalesce((SELECT max(step) FROM checkpoints
                        WHERE thread_id = :thread_id AND kind = 's' AND step <= :upto), 0)
ORDER BY step;

-- name: checkpoints_range
SELECT {{checkpoint_columns}} FROM checkpoints
WHERE thread_id = :thread_id AND step >= :from_step AND step <= :upto
ORDER BY step;

-- name: park_run
-- Parks a running run (interrupt -> waiting, sleep -> sleeping until NOW + seconds), fenced by
-- the epoch. The lease is released: a parked run holds no worker.
UPDATE runs
SET status = :status, waiting_for = :waiting_for,
    wake_at = CASE WHEN :seconds IS NULL THEN NULL
                   ELSE (julianday('now') - 2440587.5) * 86400.0 + :seconds END,
    lease_owner = NULL, lease_expires_at = NULL, attempt = 0, failures = 0,
    updated_at = (julianday('now') - 2440587.5) * 86400.0,
    {{resting(:status, (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id = :thread_id AND epoch = :epoch AND status = 'running';

-- name: journal_value
INSERT INTO journal (thread_id, step, idx, name, result)
VALUES (:thread_id, :step, :idx, :name, :result);

-- name: journal_values
-- journal_value for many rows: ?1 is a JSON array of [thread_id, step, idx, name, result],
-- the result as its UTF-8 text.
INSERT INTO journal (thread_id, step, idx, name, result)
SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, CAST(j.value ->> 4 AS BLOB)
FROM json_each(?1) AS j;

-- name: wake_parent
-- A child reached a terminal state: its parent, if parked in join, re-checks its children.
UPDATE runs SET status = 'queued', waiting_for = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0,
                {{resting('queued', (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id = (SELECT parent_thread_id FROM runs WHERE thread_id = :thread_id)
  AND status = 'waiting' AND waiting_for = 'join';

-- name: requeue_if_joined
-- A parent parking in join whose children all finished meanwhile stays claimable.
UPDATE runs SET status = 'queued', waiting_for = NULL, {{resting('queued', updated_at)}}
WHERE thread_id = :thread_id AND status = 'waiting' AND waiting_for = 'join'
  AND NOT EXISTS (SELECT 1 FROM runs c
                  WHERE c.thread_id IN (SELECT value FROM json_each(:children))
                    AND c.status NOT IN ('completed', 'failed', 'cancelled'));
