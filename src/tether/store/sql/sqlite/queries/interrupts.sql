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

-- name: wake_waiting
-- A resumed run becomes claimable by any worker of its version.
UPDATE runs SET status = 'queued', waiting_for = NULL, wake_at = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0,
                {{resting('queued', (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id = :thread_id AND status = 'waiting';

-- name: wake_waiting_set
-- wake_waiting for many runs: ?1 is a JSON array of their thread_ids.
UPDATE runs SET status = 'queued', waiting_for = NULL, wake_at = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0,
                {{resting('queued', (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id IN (SELECT value FROM json_each(?1)) AND status = 'waiting';

-- name: get_interrupt
SELECT {{interrupt_columns}}
FROM interrupts WHERE id = :id;

-- name: list_interrupts
SELECT {{interrupt_columns}}
FROM interrupts
WHERE (:thread_id IS NULL OR thread_id = :thread_id) AND (:status IS NULL OR status = :status)
ORDER BY created_at, id
LIMIT :limit;
