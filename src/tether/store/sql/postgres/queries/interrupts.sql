-- Postgres: interrupts (the questions a person answers).

-- fragment: resume_interrupt_writes
-- resume_interrupt's writes (CTEs r, j and w), each query adding its own after them.
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

-- fragment: resume_interrupt_result
-- resume_interrupt's announcement and row (after its writes).
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM w)
SELECT r.*, (SELECT count(*) FROM woke) FROM r;

-- name: resume_interrupt
-- Answers the run's pending interrupt exactly once (a concurrent second answer waits on the
-- row, then finds it resolved), journals the value for the re-executed node, and makes the
-- run claimable, announced; all or nothing.
{{resume_interrupt_writes}}
{{resume_interrupt_result}}

-- name: resume_interrupt_audited
-- resume_interrupt with its audit row (insert_audit's columns, prefixed audit_), written
-- only when the interrupt was answered, in the same statement: an audited answer (every
-- POST /runs/{id}/resume) is group-committed with other writes, as one without audit is.
{{resume_interrupt_writes}}
aud AS (INSERT INTO audit (at, actor, action, thread_id, target, details)
        SELECT extract(epoch FROM clock_timestamp())::float8, %(audit_actor)s,
               %(audit_action)s, %(audit_thread_id)s, %(audit_target)s, %(audit_details)s
        WHERE EXISTS (SELECT 1 FROM r)),
{{resume_interrupt_result}}

-- fragment: resume_interrupts_writes
-- resume_interrupts' writes (CTEs x, f, r, j and w), each query adding its own after them.
WITH x AS (
    SELECT a.thread_id, a.id, convert_to(a.value, 'UTF8') AS value, a.name, a.audit_actor,
           a.audit_action, a.audit_thread_id, a.audit_target, a.audit_details
    FROM json_to_recordset(%(rows)s::json)
        AS a(thread_id text, value text, id text, name text, audit_actor text,
             audit_action text, audit_thread_id text, audit_target text, audit_details text)
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

-- fragment: resume_interrupts_result
-- resume_interrupts' announcement and rows (after its writes).
woke AS MATERIALIZED (SELECT pg_notify('tether_work', v.version)
                      FROM (SELECT DISTINCT version FROM w) v)
SELECT r.thread_id, r.step, r.idx, r.id, r.payload, r.value, r.status, r.created_at,
       r.resolved_at, (SELECT count(*) FROM woke)
FROM r;

-- name: resume_interrupts
-- Many resume_interrupts (distinct runs) in one statement, inside a group commit: each row
-- answers its run's pending interrupt exactly as resume_interrupt does (once; a concurrent
-- answer to the same interrupt finds it resolved and gets no row), journals the value and
-- makes the run claimable. Returns resume_interrupt's row for each interrupt answered; one
-- announcement per version woken. The rows come as one JSON array of resume_interrupt's
-- parameters (value as its UTF-8 text). Each interrupt is found by its run's key, one lookup
-- per row (OFFSET 0 keeps it so), and updated by TID: a join would be planned, without
-- statistics, as a scan of every pending interrupt.
{{resume_interrupts_writes}}
{{resume_interrupts_result}}

-- name: resume_interrupts_audited
-- resume_interrupts of audited answers: each interrupt answered gets its audit row
-- (resume_interrupt_audited's parameters); one not answered gets none.
{{resume_interrupts_writes}}
aud AS (INSERT INTO audit (at, actor, action, thread_id, target, details)
        SELECT extract(epoch FROM clock_timestamp())::float8, x.audit_actor, x.audit_action,
               x.audit_thread_id, x.audit_target, x.audit_details
        FROM x JOIN r ON r.thread_id = x.thread_id
        WHERE x.audit_actor IS NOT NULL),
{{resume_interrupts_result}}

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
