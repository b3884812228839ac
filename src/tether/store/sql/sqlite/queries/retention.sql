-- SQLite: retention (tether prune): the pruner's lock, the runs it may remove, their removal in
-- one transaction per batch, tombstones, and compaction of long logs.

-- fragment: prunable
-- A run the policy removes: terminal for longer than its status's age (:completed, :failed,
-- :cancelled are cut-off times, NULL = that status is kept), of :agent if given, with no
-- effect still to perform and no unconsumed mail.
r.status IN ('completed', 'failed', 'cancelled')
AND r.updated_at < CASE r.status WHEN 'completed' THEN :completed WHEN 'failed' THEN :failed
                                 ELSE :cancelled END
AND (:agent IS NULL OR r.agent = :agent)
AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.thread_id = r.thread_id
                AND o.status IN ('pending', 'running'))
AND NOT EXISTS (SELECT 1 FROM mailbox m WHERE m.thread_id = r.thread_id
                AND m.consumed_step IS NULL)

-- name: take_lock
-- Takes (or renews) the named lease for :owner when it is free, expired or already ours.
INSERT INTO maintenance_locks (name, owner, expires_at)
VALUES (:name, :owner, (julianday('now') - 2440587.5) * 86400.0 + :ttl)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
WHERE maintenance_locks.owner = excluded.owner
   OR maintenance_locks.expires_at < (julianday('now') - 2440587.5) * 86400.0
RETURNING owner;

-- name: drop_lock
DELETE FROM maintenance_locks WHERE name = :name AND owner = :owner;

-- name: prune_candidates
-- The next prunable runs after :after in thread_id order (a walk over the primary key, so a
-- prune reads the runs table once, however many batches it takes).
SELECT r.thread_id FROM runs r
WHERE r.thread_id > :after AND
{{prunable}}
ORDER BY r.thread_id LIMIT :limit;

-- name: prune_estimate
-- What a prune would remove, by status and agent: runs and the bytes of their rows' payloads.
SELECT r.status, r.agent, count(*),
       COALESCE(SUM(length(r.input) + COALESCE(length(r.error), 0)
           + (SELECT COALESCE(SUM(length(c.data)), 0) FROM checkpoints c WHERE c.thread_id = r.thread_id)
           + (SELECT COALESCE(SUM(length(j.result) + COALESCE(length(j.args), 0)), 0) FROM journal j WHERE j.thread_id = r.thread_id)
           + (SELECT COALESCE(SUM(length(o.payload) + COALESCE(length(o.result), 0)), 0)
              FROM outbox o WHERE o.thread_id = r.thread_id)
           + (SELECT COALESCE(SUM(length(m.message)), 0) FROM mailbox m WHERE m.thread_id = r.thread_id)), 0)
FROM runs r WHERE
{{prunable}}
GROUP BY r.status, r.agent ORDER BY r.status, r.agent;

-- name: prune_mark
-- The batch's runs that are still prunable inside the removing transaction (a run retried or
-- sent mail since it was listed stays), recorded as tombstones. :ids is a JSON array.
INSERT INTO tombstones (thread_id, agent, status, finished_at, pruned_at)
SELECT r.thread_id, r.agent, r.status, r.updated_at, (julianday('now') - 2440587.5) * 86400.0
FROM runs r WHERE r.thread_id IN (SELECT value FROM json_each(:ids)) AND
{{prunable}}
ON CONFLICT (thread_id) DO UPDATE SET agent = excluded.agent, status = excluded.status,
    finished_at = excluded.finished_at, pruned_at = excluded.pruned_at
RETURNING thread_id;

-- name: prune_checkpoints
DELETE FROM checkpoints WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: prune_journal
DELETE FROM journal WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: prune_outbox
DELETE FROM outbox WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: prune_mailbox
DELETE FROM mailbox WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: prune_interrupts
DELETE FROM interrupts WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: prune_groups
DELETE FROM group_members WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: prune_child_links
-- Children outlive a pruned parent; their link to it goes (it would name a run that is gone).
UPDATE runs SET parent_thread_id = NULL
WHERE parent_thread_id IN (SELECT value FROM json_each(:ids));

-- name: prune_runs_rows
DELETE FROM runs WHERE thread_id IN (SELECT value FROM json_each(:ids));

-- name: get_tombstone
SELECT thread_id, agent, status, finished_at, pruned_at FROM tombstones
WHERE thread_id = :thread_id;

-- name: running_now
-- Whether a worker holds an unexpired lease on a running run (a small partial index: runs_lease).
SELECT EXISTS (SELECT 1 FROM runs WHERE lease_owner IS NOT NULL AND status = 'running'
               AND lease_expires_at > (julianday('now') - 2440587.5) * 86400.0);

-- name: free_pages
-- The pages free inside the file, their size, and the auto-vacuum mode (2 = incremental).
SELECT freelist_count, page_size, auto_vacuum
FROM pragma_freelist_count(), pragma_page_size(), pragma_auto_vacuum();

-- name: incremental_vacuum
-- Gives one free page back to the file system (in incremental auto-vacuum mode; see reclaim).
PRAGMA incremental_vacuum(1);

-- name: long_logs
-- Runs with more than :keep checkpoints, after :after in thread_id order (compaction).
SELECT thread_id FROM runs WHERE thread_id > :after AND step > :keep
ORDER BY thread_id LIMIT :limit;

-- name: interrupt_steps
-- The steps at which a run was interrupted (kept by compaction when asked): the checkpoint
-- before the interrupt's step is where a fork re-asks it.
SELECT DISTINCT step - 1 FROM interrupts WHERE thread_id = :thread_id AND step < :before;

-- name: snapshot_checkpoint
-- Rewrites one checkpoint as a snapshot of the state after it (the same state a replay gives).
UPDATE checkpoints SET kind = 's', data = :data WHERE thread_id = :thread_id AND step = :step;

-- name: compact_checkpoints
-- Removes the run's checkpoints before :before except the :keep steps (a JSON array).
DELETE FROM checkpoints WHERE thread_id = :thread_id AND step < :before
  AND step NOT IN (SELECT value FROM json_each(:keep));

-- name: compact_journal
-- Journal entries of committed steps before :before: a replay never reads them again.
DELETE FROM journal WHERE thread_id = :thread_id AND step < :before;

-- name: compact_estimate
-- The rows compact_checkpoints and compact_journal would remove for the run (a dry run), none
-- for a run the same prune removes first (prunable under :completed, :failed, :cancelled).
SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = :thread_id AND step < :before
          AND step NOT IN (SELECT value FROM json_each(:keep)))
     + (SELECT count(*) FROM journal WHERE thread_id = :thread_id AND step < :before)
FROM runs r WHERE r.thread_id = :thread_id AND NOT COALESCE((
{{prunable}}
), 0);
