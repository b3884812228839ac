-- SQLite: interrupts (the questions a person answers).

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
RETURNING {{interrupt_columns}};

-- name: resolve_interrupts
-- resolve_interrupt for many runs at once (sqlite_answers.py: the first answer to each of
-- them in a group commit): ?1 is a JSON array of [thread_id, value, interrupt_id], the value
-- as its UTF-8 text. Returns each interrupt resolved.
UPDATE interrupts
SET value = CAST(a.value ->> 1 AS BLOB), status = 'resolved',
    resolved_at = (julianday('now') - 2440587.5) * 86400.0
FROM json_each(?1) AS a
WHERE interrupts.thread_id = a.value ->> 0 AND +interrupts.status = 'pending'
  AND (a.value ->> 2 IS NULL OR interrupts.id = a.value ->> 2)
  AND EXISTS (SELECT 1 FROM runs WHERE thread_id = a.value ->> 0 AND status = 'waiting')
RETURNING {{interrupt_columns}};

-- name: cancel_interrupts
-- A cancelled run's questions are withdrawn from the inbox.
UPDATE interrupts SET status = 'cancelled', resolved_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND +status = 'pending';

-- fragment: woken(take, worker, ttl, now)
-- The SET of a run an answer wakes: queued for any worker of its version to claim, or, where
-- {{take}} (a Handover: a worker of the answering process), leased to {{worker}} for {{ttl}}
-- seconds as claim_runs leases a run (epoch and attempt bumped).
status = CASE WHEN {{take}} THEN 'running' ELSE 'queued' END,
    lease_owner = CASE WHEN {{take}} THEN {{worker}} END,
    lease_expires_at = CASE WHEN {{take}} THEN {{now}} + {{ttl}} END,
    epoch = epoch + ({{take}}), attempt = attempt + ({{take}}),
    waiting_for = NULL, wake_at = NULL, updated_at = {{now}},
    {{resting((CASE WHEN {{take}} THEN 'running' ELSE 'queued' END), {{now}})}}

-- name: wake_waiting
-- A resumed run becomes claimable by any worker of its version, or (:worker given, and the
-- run of :version and one of :agents, a JSON array) is leased to that worker. Returns the
-- run and whether it was leased.
UPDATE runs SET {{woken((:worker IS NOT NULL AND version = :version AND agent IN (SELECT value FROM json_each(:agents))), :worker, :ttl, (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id = :thread_id AND status = 'waiting'
RETURNING {{run_columns}}, lease_owner IS NOT NULL;

-- name: wake_waiting_set
-- wake_waiting for many runs: ?1 is a JSON array of [thread_id, worker, version, agents,
-- ttl] (worker null: queued). Returns each run and whether it was leased.
UPDATE runs SET {{woken((h.worker IS NOT NULL AND runs.version = h.hversion AND runs.agent IN (SELECT value FROM json_each(h.agents))), h.worker, h.ttl, (julianday('now') - 2440587.5) * 86400.0)}}
FROM (SELECT a.value ->> 0 AS tid, a.value ->> 1 AS worker, a.value ->> 2 AS hversion,
             a.value -> 3 AS agents, a.value ->> 4 AS ttl
      FROM json_each(?1) AS a) AS h
WHERE runs.thread_id = h.tid AND runs.status = 'waiting'
RETURNING {{run_columns}}, lease_owner IS NOT NULL;

-- name: get_interrupt
SELECT {{interrupt_columns}}
FROM interrupts WHERE id = :id;

-- name: list_interrupts
SELECT {{interrupt_columns}}
FROM interrupts
WHERE (:thread_id IS NULL OR thread_id = :thread_id) AND (:status IS NULL OR status = :status)
ORDER BY created_at, id
LIMIT :limit;
