-- Named queries for the SQLite store. NOW is the database clock in Unix seconds:
-- (julianday('now') - 2440587.5) * 86400.0, constant within one statement.

-- name: now
SELECT (julianday('now') - 2440587.5) * 86400.0;

-- name: insert_run
-- A new run is queued, or (lease_owner given: a worker of the starting process takes it at
-- once) running under that owner's lease at epoch 1, as if claimed. The caller's transaction
-- makes insert-or-return atomic.
INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash, idempotency_key,
                  parent_thread_id, forked_from, forked_step, lease_owner, lease_expires_at,
                  epoch, attempt, created_at, updated_at)
VALUES (:thread_id, :agent, :version,
        CASE WHEN :lease_owner IS NULL THEN 'queued' ELSE 'running' END,
        :node, :input, :input_hash, :idempotency_key,
        :parent_thread_id, :forked_from, :forked_step, :lease_owner,
        CASE WHEN :lease_owner IS NULL THEN NULL
             ELSE (julianday('now') - 2440587.5) * 86400.0 + :lease_ttl END,
        CASE WHEN :lease_owner IS NULL THEN 0 ELSE 1 END,
        CASE WHEN :lease_owner IS NULL THEN 0 ELSE 1 END,
        (julianday('now') - 2440587.5) * 86400.0, (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: insert_fresh_run
-- insert_run's common case, batched: a run without idempotency key created leased to a
-- worker of the starting process. Positional parameters (thread_id, agent, version, node,
-- input, input_hash, parent_thread_id, forked_from, forked_step, lease_owner,
-- lease_expires_at, now); no row inserted = the thread_id exists (insert_run then decides).
INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                  parent_thread_id, forked_from, forked_step, lease_owner, lease_expires_at,
                  epoch, attempt, created_at, updated_at)
VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 1, 1, ?12, ?12)
ON CONFLICT DO NOTHING;

-- name: insert_fresh_run_set
-- insert_fresh_run for a whole group commit: ?1 is a JSON array of its parameter lists,
-- the input blob as a string.
INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                  parent_thread_id, forked_from, forked_step, lease_owner, lease_expires_at,
                  epoch, attempt, created_at, updated_at)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, 'running', r.value ->> 3,
       CAST(r.value ->> 4 AS BLOB), r.value ->> 5, r.value ->> 6, r.value ->> 7, r.value ->> 8,
       r.value ->> 9, r.value ->> 10, 1, 1, r.value ->> 11, r.value ->> 11
FROM json_each(?1) AS r
WHERE true
ON CONFLICT DO NOTHING;

-- name: get_run
SELECT * FROM runs WHERE thread_id = :thread_id;

-- name: run_statuses
SELECT thread_id, status FROM runs WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: get_run_by_key
SELECT * FROM runs WHERE idempotency_key = :key;

-- name: list_runs
-- Newest first, keyset-paginated on (created_at, thread_id).
SELECT * FROM runs
WHERE (:status IS NULL OR status = :status)
  AND (:agent IS NULL OR agent = :agent)
  AND (:before_ts IS NULL OR (created_at, thread_id) < (:before_ts, :before_id))
ORDER BY created_at DESC, thread_id DESC
LIMIT :limit;

-- name: claim_runs
-- Leases claimable runs of one version: each claim bumps the fencing epoch, so any earlier
-- holder's writes (which check the epoch) are refused from here on. Runs due now come first,
-- in due order (a range of runs_due: a queued run is due since it was created), then runs
-- whose lease expired, oldest expiry first (a range of runs_expiry), up to the limit in all:
-- neither part reads a run that is not claimable (the time bound is a subquery, so it
-- bounds each index range rather than filter every row read).
WITH t(now) AS MATERIALIZED (SELECT (julianday('now') - 2440587.5) * 86400.0),
due AS MATERIALIZED (
    SELECT thread_id FROM runs
    WHERE version = :version
      AND status IN ('queued', 'sleeping')
      AND coalesce(wake_at, created_at) <= (SELECT now FROM t)
      AND agent IN (SELECT value FROM json_each(:agents))
    ORDER BY coalesce(wake_at, created_at)
    LIMIT :limit),
expired AS MATERIALIZED (
    SELECT thread_id FROM runs
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
    updated_at = (SELECT now FROM t)
WHERE thread_id IN (SELECT thread_id FROM due UNION ALL SELECT thread_id FROM expired)
RETURNING *;

-- name: renew_leases
-- One statement renews every lease a worker holds.
UPDATE runs SET lease_expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl
WHERE lease_owner = :worker AND status = 'running'
RETURNING thread_id;

-- name: release_run
-- Gives a run back for any worker to claim at once; only the current epoch may. The attempt
-- count stays: the step was begun, and the next claim counts the next attempt.
UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND epoch = :epoch AND status = 'running';

-- name: insert_journal
-- Journals a call result only while the caller's epoch is current. Positional parameters
-- (thread_id, step, idx, name, result, epoch): batched in one executemany.
INSERT INTO journal (thread_id, step, idx, name, result)
SELECT ?1, ?2, ?3, ?4, ?5
WHERE EXISTS (SELECT 1 FROM runs WHERE thread_id = ?1 AND epoch = ?6 AND status = 'running');

-- name: load_journal
SELECT idx, name, result FROM journal WHERE thread_id = :thread_id AND step = :step ORDER BY idx;

-- name: commit_run
-- Moves the run past a committed step, fenced by the epoch; returns the run as it is now
-- (no row = lease lost).
UPDATE runs
SET step = :step, node = :next_node, status = :status,
    attempt = CASE WHEN :status = 'running' THEN 1 ELSE 0 END, failures = 0,
    wake_at = :wake_at, waiting_for = :waiting_for,
    lease_owner = CASE WHEN :status = 'running' THEN lease_owner END,
    lease_expires_at = CASE WHEN :status = 'running' THEN lease_expires_at END,
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND epoch = :epoch AND status = 'running'
RETURNING *;

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
    waiting_for = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = ?5
WHERE thread_id = ?3 AND epoch = ?4 AND status = 'running';

-- name: finish_run_set
-- finish_run for a whole group commit: ?1 is a JSON array of its parameter lists.
UPDATE runs
SET step = f.value ->> 0, node = NULL, status = f.value ->> 1, attempt = 0, failures = 0,
    wake_at = NULL, waiting_for = NULL, lease_owner = NULL, lease_expires_at = NULL,
    updated_at = f.value ->> 4
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
INSERT INTO journal (thread_id, step, idx, name, result)
SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3, CAST(j.value ->> 4 AS BLOB)
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
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND epoch = :epoch AND status = 'running';

-- name: cancel_run
-- Cancels a live run at once; the epoch bump fences out a worker still running it.
UPDATE runs
SET status = 'cancelled', epoch = epoch + 1, lease_owner = NULL, lease_expires_at = NULL,
    wake_at = NULL, updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND status NOT IN ('completed', 'failed', 'cancelled');

-- name: load_checkpoints
-- The log from the last snapshot at or before :upto, in one statement (one read snapshot).
SELECT * FROM checkpoints
WHERE thread_id = :thread_id AND step <= :upto
  AND step >= coalesce((SELECT max(step) FROM checkpoints
                        WHERE thread_id = :thread_id AND kind = 's' AND step <= :upto), 0)
ORDER BY step;

-- name: checkpoints_range
SELECT * FROM checkpoints
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
    updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND epoch = :epoch AND status = 'running';

-- name: insert_interrupt
-- One row per interrupt reached; a re-execution that reaches it again keeps the first id.
INSERT INTO interrupts (thread_id, step, idx, id, payload, status, created_at)
VALUES (:thread_id, :step, :idx, :id, :payload, 'pending', (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT (thread_id, step, idx) DO NOTHING;

-- name: resolve_interrupt
-- Answers the run's pending interrupt once: a concurrent second answer finds no pending row.
UPDATE interrupts
SET value = :value, status = 'resolved', resolved_at = (julianday('now') - 2440587.5) * 86400.0
-- (+status: look the row up by the primary key's thread_id, not by the status index, which
-- would visit every pending interrupt of every run)
WHERE thread_id = :thread_id AND +status = 'pending' AND (:id IS NULL OR id = :id)
  AND EXISTS (SELECT 1 FROM runs WHERE thread_id = :thread_id AND status = 'waiting')
RETURNING step, idx, id;

-- name: cancel_interrupts
-- A cancelled run's questions are withdrawn from the inbox.
UPDATE interrupts SET status = 'cancelled', resolved_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND +status = 'pending';

-- name: journal_value
INSERT INTO journal (thread_id, step, idx, name, result)
VALUES (:thread_id, :step, :idx, :name, :result);

-- name: wake_waiting
-- A resumed run becomes claimable by any worker of its version.
UPDATE runs SET status = 'queued', waiting_for = NULL, wake_at = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND status = 'waiting';

-- name: get_interrupt
SELECT thread_id, step, idx, id, payload, value, status, created_at, resolved_at
FROM interrupts WHERE id = :id;

-- name: list_interrupts
SELECT thread_id, step, idx, id, payload, value, status, created_at, resolved_at
FROM interrupts
WHERE (:thread_id IS NULL OR thread_id = :thread_id) AND (:status IS NULL OR status = :status)
ORDER BY created_at, id
LIMIT :limit;

-- name: effect_keys_taken
-- Which of a step's effect keys the run already used (explicit keys must be unique per run).
SELECT key FROM outbox WHERE thread_id = :thread_id AND key IN (SELECT value FROM json_each(:keys));

-- name: insert_effect
-- A transactional effect is stored done (performed in this very transaction).
INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at, compensates,
                    created_at, compensable, attempts, done_at)
VALUES (:thread_id, :key, :step, :idx, :name, :payload, :status, (julianday('now') - 2440587.5) * 86400.0,
        NULL, (julianday('now') - 2440587.5) * 86400.0, :compensable,
        CASE WHEN :status = 'done' THEN 1 ELSE 0 END,
        CASE WHEN :status = 'done' THEN (julianday('now') - 2440587.5) * 86400.0 END);

-- name: effect_head_after
-- The head of the first run after `after` in thread_id order: the run's first effect in
-- request order (step, idx) still pending or running (only heads are claimable, so a run's
-- effects go strictly in order and one waiting to be retried holds back the rest). One probe
-- of outbox_live; claim_effects walks runs round robin with it.
SELECT rowid, thread_id, name, status, next_attempt_at, lease_expires_at FROM outbox
WHERE status IN ('pending', 'running') AND thread_id > :after
ORDER BY thread_id, step, idx LIMIT 1;

-- name: effect_head_first
-- The head of the first run (the walk wraps around to it).
SELECT rowid, thread_id, name, status, next_attempt_at, lease_expires_at FROM outbox
WHERE status IN ('pending', 'running')
ORDER BY thread_id, step, idx LIMIT 1;

-- name: claim_effect_rows
-- Leases the due heads the walk found (in the same write transaction), each claim bumping
-- the effect's epoch and attempts.
UPDATE outbox
SET status = 'running', lease_owner = :worker,
    lease_expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl,
    epoch = epoch + 1, attempts = attempts + 1
WHERE rowid IN (SELECT value FROM json_each(:rowids))
  AND status IN ('pending', 'running')
RETURNING thread_id, key, step, idx, name, payload, status, attempts, epoch, next_attempt_at,
          result, error, compensates, created_at, done_at;

-- name: complete_effect
-- Records an effect done once: only the holder of the current effect epoch may.
UPDATE outbox
SET status = 'done', result = :result, error = NULL, lease_owner = NULL, lease_expires_at = NULL,
    done_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND key = :key AND epoch = :epoch AND status = 'running';

-- name: fail_effect
-- A failed attempt: back to pending after :delay seconds, or dead when :delay is NULL.
UPDATE outbox
SET status = CASE WHEN :delay IS NULL THEN 'dead' ELSE 'pending' END,
    next_attempt_at = (julianday('now') - 2440587.5) * 86400.0 + coalesce(:delay, 0),
    error = :error, lease_owner = NULL, lease_expires_at = NULL
WHERE thread_id = :thread_id AND key = :key AND epoch = :epoch AND status = 'running';

-- name: add_compensations
-- Saga: for every effect of the run that is not dead, queue its compensation after all of the
-- run's effects, in reverse order of the originals (idx descending = original order reversed).
INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at, compensates,
                    created_at)
SELECT thread_id, key || ':compensate', :step, -(step * 100000 + idx), name, payload, 'pending',
       (julianday('now') - 2440587.5) * 86400.0, key, (julianday('now') - 2440587.5) * 86400.0
FROM outbox
WHERE thread_id = :thread_id AND compensates IS NULL AND status IN ('pending', 'running', 'done')
  AND (compensable = 1 OR name IN (SELECT value FROM json_each(:names)))
ON CONFLICT DO NOTHING;

-- name: renew_effect_leases
-- One statement renews every effect lease a worker's dispatcher holds.
UPDATE outbox SET lease_expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl
WHERE lease_owner = :worker AND status = 'running'
  AND status IN ('pending', 'running');  -- (lets it read outbox_live)

-- name: get_effect
SELECT thread_id, key, step, idx, name, payload, status, attempts, epoch, next_attempt_at,
       result, error, compensates, created_at, done_at
FROM outbox WHERE thread_id = :thread_id AND key = :key;

-- name: list_effects
SELECT thread_id, key, step, idx, name, payload, status, attempts, epoch, next_attempt_at,
       result, error, compensates, created_at, done_at
FROM outbox
WHERE (:thread_id IS NULL OR thread_id = :thread_id) AND (:status IS NULL OR status = :status)
ORDER BY created_at, thread_id, step, idx
LIMIT :limit;

-- name: retry_effect
-- An operator retries a dead (or failing) effect now, with a fresh attempt budget.
UPDATE outbox
SET status = 'pending', attempts = 0, next_attempt_at = (julianday('now') - 2440587.5) * 86400.0,
    lease_owner = NULL, lease_expires_at = NULL
WHERE key = :key AND (:thread_id IS NULL OR thread_id = :thread_id) AND status IN ('dead', 'pending')
RETURNING thread_id, key, step, idx, name, payload, status, attempts, epoch, next_attempt_at,
          result, error, compensates, created_at, done_at;

-- name: runs_exist
SELECT thread_id FROM runs WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: insert_message
INSERT INTO mailbox (thread_id, sender, message, created_at)
VALUES (:thread_id, :sender, :message, (julianday('now') - 2440587.5) * 86400.0);

-- name: wake_for_mail
-- Delivery wakes an idle actor (waiting for mail) so any worker can claim it.
UPDATE runs SET status = 'queued', waiting_for = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND status = 'waiting' AND waiting_for = 'mail';

-- name: load_inbox
SELECT id, sender, message, created_at FROM mailbox
WHERE thread_id = :thread_id AND consumed_step IS NULL ORDER BY id LIMIT :limit;

-- name: consume_messages
-- Messages are consumed by exactly one committed step (the caller checked the epoch).
UPDATE mailbox SET consumed_step = :step
WHERE thread_id = :thread_id AND consumed_step IS NULL
  AND id IN (SELECT value FROM json_each(:ids));

-- name: requeue_if_mail
-- An actor that parks for mail while mail is already waiting stays claimable.
UPDATE runs SET status = 'queued', waiting_for = NULL
WHERE thread_id = :thread_id AND status = 'waiting' AND waiting_for = 'mail'
  AND EXISTS (SELECT 1 FROM mailbox WHERE thread_id = :thread_id AND consumed_step IS NULL);

-- name: inbox_depth
SELECT count(*) FROM mailbox WHERE thread_id = :thread_id AND consumed_step IS NULL;

-- name: wake_parent
-- A child reached a terminal state: its parent, if parked in join, re-checks its children.
UPDATE runs SET status = 'queued', waiting_for = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = (SELECT parent_thread_id FROM runs WHERE thread_id = :thread_id)
  AND status = 'waiting' AND waiting_for = 'join';

-- name: requeue_if_joined
-- A parent parking in join whose children all finished meanwhile stays claimable.
UPDATE runs SET status = 'queued', waiting_for = NULL
WHERE thread_id = :thread_id AND status = 'waiting' AND waiting_for = 'join'
  AND NOT EXISTS (SELECT 1 FROM runs c
                  WHERE c.thread_id IN (SELECT value FROM json_each(:children))
                    AND c.status NOT IN ('completed', 'failed', 'cancelled'));

-- name: cancel_tree
-- Cancels a run and all its descendants at once, fencing out their holders.
WITH RECURSIVE tree(id) AS (
    SELECT :thread_id
    UNION ALL
    SELECT r.thread_id FROM runs r JOIN tree ON r.parent_thread_id = tree.id
)
UPDATE runs
SET status = 'cancelled', epoch = epoch + 1, lease_owner = NULL, lease_expires_at = NULL,
    wake_at = NULL, updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id IN (SELECT id FROM tree) AND status NOT IN ('completed', 'failed', 'cancelled')
RETURNING thread_id;

-- name: join_group
INSERT INTO group_members (group_name, thread_id, role, joined_at)
VALUES (:group_name, :thread_id, :role, (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT (group_name, thread_id) DO UPDATE SET role = excluded.role;

-- name: group_members
SELECT thread_id FROM group_members WHERE group_name = :group_name ORDER BY thread_id;
