-- Postgres: retention (tether prune): the pruner's lock, the runs it may remove, their removal in
-- one transaction per batch, tombstones, and compaction of long logs.

-- fragment: prunable
-- A run the policy removes: terminal for longer than its status's age (completed, failed,
-- cancelled are cut-off times, NULL = that status is kept), of agent if given, with no
-- effect still to perform and no unconsumed mail.
r.status IN ('completed', 'failed', 'cancelled')
AND r.updated_at < CASE r.status WHEN 'completed' THEN %(completed)s::float8
                                 WHEN 'failed' THEN %(failed)s::float8
                                 ELSE %(cancelled)s::float8 END
AND (%(agent)s::text IS NULL OR r.agent = %(agent)s::text)
AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.thread_id = r.thread_id
                AND o.status IN ('pending', 'running'))
AND NOT EXISTS (SELECT 1 FROM mailbox m WHERE m.thread_id = r.thread_id
                AND m.consumed_step IS NULL)

-- name: take_lock
-- Takes (or renews) the named lease for %(owner)s when it is free, expired or already ours.
INSERT INTO maintenance_locks (name, owner, expires_at)
VALUES (%(name)s, %(owner)s, extract(epoch FROM clock_timestamp())::float8 + %(ttl)s::float8)
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
WHERE maintenance_locks.owner = EXCLUDED.owner
   OR maintenance_locks.expires_at < extract(epoch FROM clock_timestamp())::float8
RETURNING owner;

-- name: drop_lock
DELETE FROM maintenance_locks WHERE name = %(name)s AND owner = %(owner)s RETURNING name;

-- name: running_now
-- Whether a worker holds an unexpired lease on a running run (a small partial index: runs_lease).
SELECT EXISTS (SELECT 1 FROM runs WHERE lease_owner IS NOT NULL AND status = 'running'
               AND lease_expires_at > extract(epoch FROM clock_timestamp())::float8);

-- name: prune_candidates
-- The next prunable runs after (%(after_at)s, %(after)s) in (created_at, thread_id) order, with
-- their created_at (the walk's next position): a walk over run_keys_created (migration 0018),
-- each run read by primary key, so a prune reads the runs table once, however many batches
-- it takes. Creation order is the order a run's rows
-- were written in (runs, and roughly their checkpoints and journal), so a batch's deletes fall
-- on few heap pages, each emptied by one or two batches; in thread_id order (random: uuids,
-- hashes) every batch touched pages all over the heap, each page dirtied (and written, with a
-- full-page image in the WAL after each checkpoint) again and again. The walk ends at the
-- latest cut-off (%(horizon)s): a run created after it cannot have finished before it.
-- (LATERAL: the walk is the outer side, whatever the statistics; a join of the two tables was
-- planned, generically and unanalyzed, as a scan of runs with a walk of run_keys for each.)
SELECT r.thread_id, r.created_at
FROM run_keys k CROSS JOIN LATERAL (
    SELECT r.thread_id, r.created_at FROM runs r
    WHERE r.thread_id = k.thread_id AND
    {{prunable}}
) AS r
WHERE (k.created_at, k.thread_id) > (%(after_at)s::float8, %(after)s::text)
  AND k.created_at < %(horizon)s::float8
ORDER BY k.created_at, k.thread_id LIMIT %(limit)s;

-- name: prune_estimate
-- What a prune would remove, by status and agent: runs and the bytes of their rows' payloads.
SELECT r.status, r.agent, count(*)::bigint,
       COALESCE(SUM(octet_length(r.input) + COALESCE(octet_length(r.error), 0)
           + (SELECT COALESCE(SUM(octet_length(c.data)), 0) FROM checkpoints c WHERE c.thread_id = r.thread_id)
           + (SELECT COALESCE(SUM(octet_length(j.result) + COALESCE(octet_length(j.args), 0)), 0) FROM journal j WHERE j.thread_id = r.thread_id)
           + (SELECT COALESCE(SUM(octet_length(o.payload) + COALESCE(octet_length(o.result), 0)), 0)
              FROM outbox o WHERE o.thread_id = r.thread_id)
           + (SELECT COALESCE(SUM(octet_length(m.message)), 0) FROM mailbox m WHERE m.thread_id = r.thread_id)), 0)
FROM runs r WHERE
{{prunable}}
GROUP BY r.status, r.agent ORDER BY r.status, r.agent;

-- name: prune_mark
-- The batch's runs that are still prunable inside the removing transaction (a run retried or
-- sent mail since it was listed stays: the DELETE locks each row and, if a worker changed it
-- meanwhile, tests the row as it is now), deleted, and recorded as tombstones. Deleting the
-- run rows here, not in a statement of their own after the other tables, finds each row once
-- (one primary-key lookup, not two) and takes the run's row lock first, as workers do.
WITH gone AS (
    DELETE FROM runs r WHERE r.thread_id = ANY(%(ids)s::text[]) AND
    {{prunable}}
    RETURNING r.thread_id, r.agent, r.status, r.updated_at
)
INSERT INTO tombstones (thread_id, agent, status, finished_at, pruned_at)
SELECT thread_id, agent, status, updated_at, extract(epoch FROM clock_timestamp())::float8
FROM gone
ON CONFLICT (thread_id) DO UPDATE SET agent = EXCLUDED.agent, status = EXCLUDED.status,
    finished_at = EXCLUDED.finished_at, pruned_at = EXCLUDED.pruned_at
RETURNING thread_id;

-- name: prune_checkpoints
DELETE FROM checkpoints WHERE thread_id = ANY(%(ids)s::text[]);

-- name: prune_journal
DELETE FROM journal WHERE thread_id = ANY(%(ids)s::text[]);

-- name: prune_outbox
DELETE FROM outbox WHERE thread_id = ANY(%(ids)s::text[]);

-- name: prune_mailbox
DELETE FROM mailbox WHERE thread_id = ANY(%(ids)s::text[]);

-- name: prune_interrupts
DELETE FROM interrupts WHERE thread_id = ANY(%(ids)s::text[]);

-- name: prune_groups
DELETE FROM group_members WHERE thread_id = ANY(%(ids)s::text[]);

-- name: prune_child_links
-- Children outlive a pruned parent; their link to it goes (it would name a run that is gone).
UPDATE runs SET parent_thread_id = NULL
WHERE parent_thread_id = ANY(%(ids)s::text[]);

-- name: get_tombstone
SELECT thread_id, agent, status, finished_at, pruned_at FROM tombstones
WHERE thread_id = %(thread_id)s;

-- name: long_logs
-- Runs with more than %(keep)s checkpoints, after %(after)s in thread_id order (compaction).
SELECT thread_id FROM runs WHERE thread_id > %(after)s AND step > %(keep)s
ORDER BY thread_id LIMIT %(limit)s;

-- name: interrupt_steps
-- The steps at which a run was interrupted (kept by compaction when asked): the checkpoint
-- before the interrupt's step is where a fork re-asks it.
SELECT DISTINCT step - 1 FROM interrupts WHERE thread_id = %(thread_id)s AND step < %(before)s;

-- name: snapshot_checkpoint
-- Rewrites one checkpoint as a snapshot of the state after it (the same state a replay gives).
UPDATE checkpoints SET kind = 's', data = %(data)s WHERE thread_id = %(thread_id)s AND step = %(step)s;

-- name: compact_checkpoints
-- Removes the run's checkpoints before %(before)s except the %(keep)s steps.
DELETE FROM checkpoints WHERE thread_id = %(thread_id)s AND step < %(before)s
  AND NOT (step = ANY(%(keep)s::bigint[]));

-- name: compact_journal
-- Journal entries of committed steps before %(before)s: a replay never reads them again.
DELETE FROM journal WHERE thread_id = %(thread_id)s AND step < %(before)s;

-- name: compact_estimate
-- The rows compact_checkpoints and compact_journal would remove for the run (a dry run), none
-- for a run the same prune removes first (prunable under the cut-offs).
SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %(thread_id)s AND step < %(before)s
          AND NOT (step = ANY(%(keep)s::bigint[])))
     + (SELECT count(*) FROM journal WHERE thread_id = %(thread_id)s AND step < %(before)s)
FROM runs r WHERE r.thread_id = %(thread_id)s AND NOT COALESCE((
{{prunable}}
), false);
