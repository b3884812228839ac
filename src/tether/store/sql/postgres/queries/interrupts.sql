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

-- name: resume_interrupts
-- Many resume_interrupts (distinct runs) in one statement, inside a group commit: each row
-- answers its run's pending interrupt exactly as resume_interrupt does (once; a concurrent
-- answer to the same interrupt finds it resolved and gets no row), journals the value and
-- makes the run claimable. Returns resume_interrupt's row for each interrupt answered; one
-- announcement per version woken. The rows come as one JSON array of resume_interrupt's
-- parameters (value as its UTF-8 text). Each interrupt is found by its run's key, one lookup
-- per row (OFFSET 0 keeps it so), and updated by TID: a join would be planned, without
-- statistics, as a scan of every pending interrupt.
WITH x AS (
    SELECT a.thread_id, a.id, convert_to(a.value, 'UTF8') AS value, a.name
    FROM json_to_recordset(%(rows)s::json) AS a(thread_id text, value text, id text, name text)
),
f AS MATERIALIZED (
    SELECT x.*, l.rid
    FROM x, LATERAL (SELECT ctid AS rid FROM interrupts
                     WHERE thread_id = x.thread_id AND status = 'pending'
                       AND (x.id IS NULL OR id = x.id)
                       AND EXISTS (SELECT 1 FROM runs
                                   WHERE thread_id = x.thread_id AND status = 'waiting')
                     OFFSET 0) AS l
),
r AS (
    UPDATE interrupts
    SET value = f.value, status = 'resolved',
        resolved_at = extract(epoch FROM clock_timestamp())::float8
    FROM f
    WHERE interrupts.ctid = ANY (ARRAY(SELECT rid FROM f)) AND interrupts.ctid = f.rid
      AND interrupts.status = 'pending'
    RETURNING interrupts.thread_id, interrupts.step, interrupts.idx, interrupts.id,
              interrupts.payload, interrupts.value, interrupts.status, interrupts.created_at,
              interrupts.resolved_at, f.name
),
j AS (
    INSERT INTO journal (thread_id, step, idx, name, result)
    SELECT thread_id, step, idx, name, value FROM r
),
w AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL, wake_at = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = ANY (ARRAY(SELECT thread_id FROM r)) AND status = 'waiting'
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', v.version)
                      FROM (SELECT DISTINCT version FROM w) v)
SELECT r.thread_id, r.step, r.idx, r.id, r.payload, r.value, r.status, r.created_at,
       r.resolved_at, (SELECT count(*) FROM woke)
FROM r;

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
