-- Postgres: interrupts (the questions a person answers).

-- fragment: woken(take, worker, ttl)
-- The SET of a run an answer wakes: queued for any worker of its version to claim, or, where
-- {{take}} (a Handover: a worker of the answering process), leased to {{worker}} for {{ttl}}
-- seconds as claim_runs leases a run (epoch and attempt bumped).
status = CASE WHEN {{take}} THEN 'running' ELSE 'queued' END,
    lease_owner = CASE WHEN {{take}} THEN {{worker}} END,
    lease_expires_at = CASE WHEN {{take}}
                       THEN extract(epoch FROM clock_timestamp())::float8 + {{ttl}} END,
    epoch = epoch + ({{take}})::int, attempt = attempt + ({{take}})::int,
    waiting_for = NULL, wake_at = NULL,
    updated_at = extract(epoch FROM clock_timestamp())::float8

-- name: resume_interrupt
-- Answers the run's pending interrupt exactly once (a concurrent second answer waits on the
-- row, then finds it resolved), journals the value for the re-executed node, and makes the
-- run claimable, announced, or (%(worker)s given, and the run of %(version)s and one of
-- %(agents)s) leases it to that worker, unannounced; all or nothing. The row: the
-- interrupt's columns, the run's and true if it was leased (else NULLs), then a count.
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
    UPDATE runs SET {{woken((%(worker)s::text IS NOT NULL AND version = %(version)s::text AND agent = ANY(%(agents)s::text[])), %(worker)s::text, %(ttl)s::float8)}}
    WHERE thread_id = %(thread_id)s AND status = 'waiting' AND EXISTS (SELECT 1 FROM r)
    RETURNING {{run_columns}}, lease_owner IS NOT NULL AS taken
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM w WHERE NOT taken)
SELECT r.*, w.*, (SELECT count(*) FROM woke) FROM r LEFT JOIN w ON w.taken;

-- name: resume_interrupts
-- Many resume_interrupts (distinct runs) in one statement, inside a group commit: each row
-- answers its run's pending interrupt exactly as resume_interrupt does (once; a concurrent
-- answer to the same interrupt finds it resolved and gets no row), journals the value and
-- makes the run claimable or leases it to its row's worker. Returns resume_interrupt's row
-- for each interrupt answered, the run's columns in it whether leased or not; one
-- announcement per version woken. The rows come as one JSON array of resume_interrupt's
-- parameters (value as its UTF-8 text; agents a JSON array). Each interrupt is found by its
-- run's key, one lookup per row (OFFSET 0 keeps it so), and updated by TID: a join would be
-- planned, without statistics, as a scan of every pending interrupt.
WITH x AS (
    SELECT a.thread_id, a.id, convert_to(a.value, 'UTF8') AS value, a.name, a.worker,
           a.version, a.agents, a.ttl
    FROM json_to_recordset(%(rows)s::json)
         AS a(thread_id text, value text, id text, name text, worker text, version text,
              agents text[], ttl float8)
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
    RETURNING interrupts.thread_id AS i_thread_id, interrupts.step AS i_step,
              interrupts.idx AS i_idx, interrupts.id AS i_id, interrupts.payload AS i_payload,
              interrupts.value AS i_value, interrupts.status AS i_status,
              interrupts.created_at AS i_created_at, interrupts.resolved_at AS i_resolved_at,
              f.name AS i_name, f.worker, f.version AS lversion, f.agents, f.ttl
),
j AS (
    INSERT INTO journal (thread_id, step, idx, name, result)
    SELECT i_thread_id, i_step, i_idx, i_name, i_value FROM r
),
-- Each run by its key (status || '': not by runs_open's range of every waiting run).
w AS (
    UPDATE runs SET {{woken(coalesce(h.worker IS NOT NULL AND runs.version = h.lversion AND runs.agent = ANY(h.agents), false), h.worker, h.ttl)}}
    FROM (SELECT DISTINCT ON (i_thread_id) * FROM r) AS h
    WHERE runs.thread_id = h.i_thread_id AND runs.status || '' = 'waiting'
    RETURNING h.i_thread_id, h.i_step, h.i_idx, h.i_id, h.i_payload, h.i_value, h.i_status,
              h.i_created_at, h.i_resolved_at, {{run_columns}},
              runs.lease_owner IS NOT NULL AS taken
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', v.version)
                      FROM (SELECT DISTINCT version FROM w WHERE NOT taken) v)
SELECT w.*, (SELECT count(*) FROM woke) FROM w;

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
