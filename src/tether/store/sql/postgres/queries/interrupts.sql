-- Postgres: interrupts (the questions a person answers).

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
    RETURNING {{interrupt_columns}}
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
SELECT {{interrupt_columns}}
FROM interrupts WHERE id = %(id)s;

-- name: list_interrupts
SELECT {{interrupt_columns}}
FROM interrupts
WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
ORDER BY created_at, id
LIMIT %(limit)s;
