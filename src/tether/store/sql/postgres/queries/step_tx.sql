-- Postgres: the multi-statement step writes (mail, effects, groups, a final failure, a park),
-- each in a transaction that locks the run rows it touches first (see postgres.py).

-- name: lock_runs
-- Locks every run row a multi-statement write will touch (the run itself, the runs it sends
-- mail to, its parent when it finishes), in thread_id order like every other multi-row lock,
-- before any of them is read for a decision: a concurrent park or send either commits first
-- (and the later statements of this transaction see it) or waits for us. Returns the ones
-- that exist, each with its epoch and status (what a fence on it will find).
-- One primary-key lookup and lock per id, made in the ids' order (the outer side of the
-- nested loop, sorted); a lock of `runs` joined to the ids, or with an OR, was planned
-- without statistics as a scan of the whole table: O(runs) per step, 20,000 rows read to
-- lock 200 (and, at a million parked actors, a million).
SELECT r.thread_id, r.epoch, r.status
FROM (SELECT w.id
      FROM (SELECT unnest(%(ids)s::text[])
            UNION
            SELECT parent_thread_id FROM runs
            WHERE thread_id = %(thread_id)s AND %(parent)s::boolean) AS w(id)
      WHERE w.id IS NOT NULL
      ORDER BY w.id) AS w,
     LATERAL (SELECT thread_id, epoch, status FROM runs WHERE thread_id = w.id
              FOR NO KEY UPDATE) AS r
ORDER BY r.thread_id;

-- name: lock_runs_many
-- lock_runs for many steps' transactions sharing one commit (pg_full.py): every run row
-- they touch (the runs, their recipients, the parents of those that finish), in thread_id
-- order, in one statement, one primary-key lookup each (see lock_runs). The ids come as JSON
-- arrays (one parameter each to encode).
SELECT r.thread_id, r.epoch, r.status
FROM (SELECT w.id
      FROM (SELECT i.id FROM json_array_elements_text(%(ids)s::json) AS i(id)
            UNION
            SELECT c.parent_thread_id
            FROM json_array_elements_text(%(terminal)s::json) AS f(id),
                 LATERAL (SELECT parent_thread_id FROM runs WHERE thread_id = f.id
                          OFFSET 0) AS c
            WHERE c.parent_thread_id IS NOT NULL) AS w
      ORDER BY w.id) AS w,
     LATERAL (SELECT thread_id, epoch, status FROM runs WHERE thread_id = w.id
              FOR NO KEY UPDATE) AS r
ORDER BY r.thread_id;

-- name: effect_keys_taken
-- Which of a step's effect keys the run already used (explicit keys must be unique per run).
SELECT key FROM outbox WHERE thread_id = %(thread_id)s AND key = ANY(%(keys)s::text[]);

-- name: commit_step_tx
-- commit_step with everything a step may carry, for a transaction that locked the rows
-- first (lock_runs): the fenced update and checkpoint, then, only if the fence held,
-- children, group memberships, consumed mail, sent mail and effects (transactional ones
-- already done). The fence also requires the step's preconditions: every effect key new to
-- the run and every direct recipient an existing run (locked by lock_runs, so still there at
-- COMMIT). A step that fails one writes nothing at all, so its transaction may commit as it
-- is; the caller tells which check failed from lock_runs and effect_keys_taken and raises
-- LeaseLost, DuplicateEffectKey or RunNotFound. One row back = committed.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
u AS (
    {{step_update}}
      AND NOT EXISTS (SELECT 1 FROM outbox
                      WHERE thread_id = %(thread_id)s AND key = ANY(%(e_keys)s::text[]))
      AND (SELECT count(*) FROM runs WHERE thread_id = ANY(%(direct)s::text[]))
          = cardinality(%(direct)s::text[])
    RETURNING thread_id
),
c AS (
    {{step_checkpoint}}
    RETURNING thread_id
),
k AS (
    {{spawn_children}}
),
g AS (
    INSERT INTO group_members (group_name, thread_id, role, joined_at)
    SELECT x.group_name, u.thread_id, x.role, t.now
    FROM u, t, unnest(%(g_names)s::text[], %(g_roles)s::text[]) AS x(group_name, role)
    ON CONFLICT (group_name, thread_id) DO UPDATE SET role = excluded.role
),
cm AS (
    UPDATE mailbox SET consumed_step = %(step)s
    WHERE thread_id = %(thread_id)s AND consumed_step IS NULL
      AND id = ANY(%(consumed)s::bigint[]) AND EXISTS (SELECT 1 FROM u)
),
sm AS (
    INSERT INTO mailbox (thread_id, sender, message, created_at)
    SELECT x.recipient, u.thread_id, x.message, t.now
    FROM u, t, unnest(%(m_recipients)s::text[], %(m_messages)s::bytea[]) WITH ORDINALITY
         AS x(recipient, message, n)
    ORDER BY x.n
),
e AS (
    INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at,
                        compensates, created_at, compensable, attempts, done_at)
    SELECT u.thread_id, x.key, %(step)s, x.idx, x.name, x.payload, x.status, t.now, NULL,
           t.now, x.compensable, CASE WHEN x.status = 'done' THEN 1 ELSE 0 END,
           CASE WHEN x.status = 'done' THEN t.now END
    FROM u, t, unnest(%(e_keys)s::text[], %(e_idxs)s::bigint[], %(e_names)s::text[],
                   %(e_payloads)s::bytea[], %(e_statuses)s::text[], %(e_compensables)s::bool[])
         AS x(key, idx, name, payload, status, compensable)
    -- (no ON CONFLICT: u checked every key is new, under the run's row lock)
)
SELECT 1 FROM c;

-- name: wake_after_commit
-- The wake-ups of a step's transaction, read after lock_runs (a fresh snapshot), only if its
-- commit_step_tx committed the step (ok: the run is at this step under the caller's epoch):
-- recipients idle for mail become queued; so does the run itself if it parks for mail while
-- mail waits; a finished run's parent parked in join re-checks its children. Announces them
-- (and, when asked, the run's own new work) on tether_work. Every wake-up finds its rows by
-- primary key, one lookup per recipient (OFFSET 0 keeps it so), and the status tests are
-- written `status || ''` so that no partial index on status (runs_open) can serve them
-- instead: without statistics (a runs table not analyzed since it filled) status = 'waiting'
-- looks rare, and an update planned as a walk over every parked run (runs_open or the table),
-- joined to its recipients, cost O(parked) per batch of mail: 682-761 ms for 200-500
-- messages among 20,000 parked actors. (The same in wake_after_commit_many, send_messages.)
WITH ok AS MATERIALIZED (
    SELECT 1 FROM runs
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND step = %(step)s
),
wt AS MATERIALIZED (
    {{mail_idle_rows((SELECT DISTINCT x.id FROM unnest(%(recipients)s::text[]) AS x(id)) AS x, x.id)}}
    WHERE EXISTS (SELECT 1 FROM ok)
),
wm AS (
    {{wake_mail_rows(wt)}}
),
rq AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL
    WHERE %(mail)s::boolean AND EXISTS (SELECT 1 FROM ok)
      AND thread_id = %(thread_id)s AND status || '' = 'waiting'
      AND waiting_for = 'mail'
      AND NOT (thread_id = ANY(%(recipients)s::text[]))
      AND EXISTS (SELECT 1 FROM mailbox WHERE thread_id = %(thread_id)s AND consumed_step IS NULL)
    RETURNING version
),
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE %(parent)s::boolean AND EXISTS (SELECT 1 FROM ok)
      AND thread_id = (SELECT parent_thread_id FROM runs WHERE thread_id = %(thread_id)s)
      AND status || '' = 'waiting' AND waiting_for = 'join'
    RETURNING version
),
woke AS MATERIALIZED (
    SELECT pg_notify('tether_work', v.version)
    FROM (SELECT version FROM wm UNION SELECT version FROM rq UNION SELECT version FROM wp
          UNION SELECT version FROM runs WHERE thread_id = %(thread_id)s AND %(notify)s::boolean
                                              AND EXISTS (SELECT 1 FROM ok)) v
),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '')
                    WHERE %(effects)s::boolean AND EXISTS (SELECT 1 FROM ok))
SELECT (SELECT count(*) FROM woke), (SELECT count(*) FROM fx);

-- name: effect_keys_taken_many
-- effect_keys_taken for many steps: which (thread_id, key) pairs the runs already used.
SELECT o.thread_id, o.key
FROM json_to_recordset(%(effects)s::json) AS x(owner text, key text)
JOIN outbox o ON o.thread_id = x.owner AND o.key = x.key;

-- name: commit_steps_tx
-- commit_step_tx for many steps (distinct runs) in one statement, inside a transaction that
-- took lock_runs_many first (pg_full.py): each step fenced on its own, exactly as
-- commit_step_tx (epoch, step, status running, every effect key new to its run, every direct
-- recipient an existing run); only the steps that match write their checkpoint, children,
-- group memberships, consumed and sent mail and effects. Each comes as one JSON array of
-- rows (one parameter to encode, bytes as base64): the steps, and what they carry, each row
-- naming the run it belongs to (its owner). Returns the thread_id of each step committed.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
x AS MATERIALIZED (
    SELECT r.thread_id, r.epoch, r.step, r.node, r.next_node, r.kind,
           decode(r.data, 'base64') AS data, r.worker, r.attempt, r.started_at,
           r.finished_at, r.status, r.wake_at, r.waiting_for, r.ttl
    FROM json_to_recordset(%(steps)s::json)
        AS r(thread_id text, epoch bigint, step bigint, node text, next_node text, kind text,
             data text, worker text, attempt int, started_at float8, finished_at float8,
             status text, wake_at float8, waiting_for text, ttl float8)
),
ek AS MATERIALIZED (
    SELECT DISTINCT y.owner FROM json_to_recordset(%(effects)s::json) AS y(owner text, key text)
    JOIN outbox o ON o.thread_id = y.owner AND o.key = y.key
),
dm AS MATERIALIZED (
    SELECT DISTINCT y.owner FROM json_to_recordset(%(direct)s::json) AS y(owner text, recipient text)
    WHERE NOT EXISTS (SELECT 1 FROM runs WHERE thread_id = y.recipient)
),
f AS MATERIALIZED (
    -- Each step's run found by primary key, one lookup per row (OFFSET 0 keeps it so), and
    -- fenced there (see commit_steps); then the step's own preconditions.
    SELECT x.*
    FROM x, LATERAL (SELECT 1 FROM runs
                     WHERE thread_id = x.thread_id AND epoch = x.epoch AND status || '' = 'running'
                       AND step = x.step - 1
                     OFFSET 0) AS l
    WHERE x.thread_id NOT IN (SELECT owner FROM ek) AND x.thread_id NOT IN (SELECT owner FROM dm)
),
u AS (
    UPDATE runs
    SET step = f.step, node = f.next_node, status = f.status,
        attempt = CASE WHEN f.status = 'running' THEN 1 ELSE 0 END, failures = 0,
        wake_at = f.wake_at, waiting_for = f.waiting_for,
        lease_owner = CASE WHEN f.status = 'running' THEN runs.lease_owner END,
        lease_expires_at = CASE WHEN f.status = 'running' THEN  -- see fragment step_update
            CASE WHEN runs.lease_expires_at < extract(epoch FROM clock_timestamp())::float8
                                              + f.ttl / 2
                 THEN extract(epoch FROM clock_timestamp())::float8 + f.ttl
                 ELSE runs.lease_expires_at END END,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    FROM f
    -- (by primary key from f: a join on ctid was planned as a scan of f per row, O(n^2))
    WHERE runs.thread_id = f.thread_id
      AND runs.epoch = f.epoch AND runs.status || '' = 'running' AND runs.step = f.step - 1
    RETURNING runs.thread_id, f.step
),
c AS (
    INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, attempt,
                             started_at, finished_at)
    SELECT x.thread_id, x.step, x.node, x.next_node, x.kind, x.data, x.worker, x.attempt,
           x.started_at, x.finished_at
    FROM x JOIN u ON u.thread_id = x.thread_id
),
k AS (
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                      idempotency_key, parent_thread_id, forked_from, forked_step,
                      created_at, updated_at)
    SELECT y.thread_id, y.agent, y.version, 'queued', y.node, decode(y.input, 'base64'),
           y.input_hash, y.idempotency_key, y.parent_thread_id, y.forked_from, y.forked_step,
           t.now, t.now
    FROM t, ROWS FROM (json_to_recordset(%(children)s::json)
                       AS (owner text, thread_id text, agent text, version text, node text,
                           input text, input_hash text, idempotency_key text,
                           parent_thread_id text, forked_from text, forked_step bigint))
         WITH ORDINALITY AS y(owner, thread_id, agent, version, node, input, input_hash,
                              idempotency_key, parent_thread_id, forked_from, forked_step, n)
    WHERE y.owner IN (SELECT thread_id FROM u)
    ORDER BY y.n
    ON CONFLICT DO NOTHING
),
g AS (
    INSERT INTO group_members (group_name, thread_id, role, joined_at)
    SELECT y.group_name, y.owner, y.role, t.now
    FROM t, json_to_recordset(%(groups)s::json) AS y(owner text, group_name text, role text)
    WHERE y.owner IN (SELECT thread_id FROM u)
    ON CONFLICT (group_name, thread_id) DO UPDATE SET role = excluded.role
),
cm AS (
    UPDATE mailbox SET consumed_step = u.step
    FROM json_to_recordset(%(consumed)s::json) AS y(owner text, id bigint)
         JOIN u ON u.thread_id = y.owner
    WHERE mailbox.id = y.id AND mailbox.thread_id = y.owner AND mailbox.consumed_step IS NULL
),
sm AS (
    INSERT INTO mailbox (thread_id, sender, message, created_at)
    SELECT y.recipient, y.owner, decode(y.message, 'base64'), t.now
    FROM t, ROWS FROM (json_to_recordset(%(mail)s::json)
                       AS (owner text, recipient text, message text))
         WITH ORDINALITY AS y(owner, recipient, message, n)
    WHERE y.owner IN (SELECT thread_id FROM u)
    ORDER BY y.n
),
e AS (
    INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at,
                        compensates, created_at, compensable, attempts, done_at)
    SELECT y.owner, y.key, u.step, y.idx, y.name, decode(y.payload, 'base64'), 'pending',
           t.now, NULL, t.now, y.compensable, 0, NULL
    FROM t, json_to_recordset(%(effects)s::json)
         AS y(owner text, key text, idx bigint, name text, payload text, compensable boolean)
         JOIN u ON u.thread_id = y.owner
)
SELECT thread_id FROM u;

-- name: wake_after_commit_many
-- wake_after_commit for many steps' transactions sharing one commit (pg_full.py), once,
-- after their commit_steps_tx: the steps and the (sender, recipient) pairs of their mail
-- as JSON arrays of rows. Only steps that committed (ok) wake anyone. It sees every
-- step of the batch, so a run of the batch that parks for mail is woken here by mail a
-- batch-mate sent it (wm), as by mail that waited before (rq). The three updates touch
-- different rows (recipients; parkers that are not recipients; parents in join). Every row
-- is found by primary key, one lookup each (OFFSET 0 keeps it so), and the updates reach
-- them by TID (the rows were locked by lock_runs_many: they stay where they are), whatever
-- the planner's statistics say (see wake_after_commit).
WITH s AS MATERIALIZED (
    SELECT * FROM json_to_recordset(%(steps)s::json)
        AS x(thread_id text, epoch bigint, step bigint, parent boolean, mail boolean,
             notify boolean, effects boolean)
),
ok AS MATERIALIZED (
    SELECT s.thread_id, s.parent, s.mail, s.notify, s.effects, r.parent_thread_id, r.version
    FROM s, LATERAL (SELECT parent_thread_id, version FROM runs
                     WHERE thread_id = s.thread_id AND epoch = s.epoch AND step = s.step
                     OFFSET 0) AS r
),
rc AS MATERIALIZED (
    SELECT DISTINCT x.recipient
    FROM json_to_recordset(%(mail)s::json) AS x(sender text, recipient text)
    WHERE x.sender IN (SELECT thread_id FROM ok)
),
tm AS MATERIALIZED (  -- the rows to wake: recipients (tm), parkers (tq), parents (tp)
    {{mail_idle_rows(rc, rc.recipient)}}
),
tq AS MATERIALIZED (
    SELECT l.rid
    FROM (SELECT thread_id FROM ok WHERE mail
          EXCEPT SELECT recipient FROM rc) AS p,
         LATERAL (SELECT ctid AS rid FROM runs
                  WHERE thread_id = p.thread_id
                    AND status || '' = 'waiting' AND waiting_for = 'mail'
                    AND EXISTS (SELECT 1 FROM mailbox m
                                WHERE m.thread_id = p.thread_id AND m.consumed_step IS NULL)
                  OFFSET 0) AS l
),
tp AS MATERIALIZED (
    SELECT l.rid
    FROM (SELECT DISTINCT parent_thread_id FROM ok WHERE parent) AS p,
         LATERAL (SELECT ctid AS rid FROM runs
                  WHERE thread_id = p.parent_thread_id
                    AND status || '' = 'waiting' AND waiting_for = 'join'
                  OFFSET 0) AS l
),
wm AS (
    {{wake_mail_rows(tm)}}
),
rq AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL
    WHERE ctid = ANY (ARRAY(SELECT rid FROM tq))
      AND status || '' = 'waiting' AND waiting_for = 'mail'
    RETURNING version
),
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE ctid = ANY (ARRAY(SELECT rid FROM tp))
      AND status || '' = 'waiting' AND waiting_for = 'join'
    RETURNING version
),
woke AS MATERIALIZED (
    SELECT pg_notify('tether_work', v.version)
    FROM (SELECT version FROM wm UNION SELECT version FROM rq UNION SELECT version FROM wp
          UNION SELECT version FROM ok WHERE notify) v
),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '')
                    WHERE EXISTS (SELECT 1 FROM ok WHERE effects))
SELECT (SELECT count(*) FROM woke), (SELECT count(*) FROM fx);

-- name: fail_step_final
-- A final failure inside a transaction that locked the run and its parent (lock_runs): the
-- run fails with the error, compensations are queued for its effects named in names, and a
-- parent parked in join is woken (after the lock, so a concurrent park cannot miss it).
-- One row back = recorded.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
u AS (
    UPDATE runs
    SET status = 'failed', node = NULL, failures = %(failures)s, wake_at = %(wake_at)s::float8,
        error = %(error)s::bytea, lease_owner = NULL, lease_expires_at = NULL,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status || '' = 'running'
    RETURNING thread_id, parent_thread_id
),
{{compensations}},
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = (SELECT parent_thread_id FROM u)
      AND status || '' = 'waiting' AND waiting_for = 'join'
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM wp),
fx AS MATERIALIZED (SELECT pg_notify('tether_effects', '') WHERE EXISTS (SELECT 1 FROM comp))
SELECT (SELECT count(*) FROM woke), (SELECT count(*) FROM fx) FROM u;

-- name: park_run
-- Parks a running run (interrupt or join -> waiting, sleep -> sleeping until NOW + seconds),
-- fenced by the epoch and the step (the run is at the step before the parked one, as for a
-- step commit); the lease is released: a parked run holds no worker. In the same
-- statement: the children it spawns, and the pending interrupt or the journaled timer.
-- One row back = parked. Fenced by the epoch alone, the park of a worker whose last commit
-- a failover to an asynchronous standby lost landed a step ahead of the run: answered, the
-- run ran that step again and parked on the same interrupt, already resolved (kept by the
-- ON CONFLICT below), and waited for an answer nobody could give.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
u AS (
    UPDATE runs
    SET status = %(status)s, waiting_for = %(waiting_for)s,
        wake_at = extract(epoch FROM clock_timestamp())::float8 + %(seconds)s::float8,
        lease_owner = NULL, lease_expires_at = NULL, attempt = 0, failures = 0,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status || '' = 'running'
      AND step = %(step)s - 1
    RETURNING thread_id
),
k AS (
    {{spawn_children}}
    RETURNING version
),
i AS (
    -- A re-execution that reaches the same interrupt again keeps the first id.
    INSERT INTO interrupts (thread_id, step, idx, id, payload, status, created_at)
    SELECT u.thread_id, %(step)s, %(idx)s, %(interrupt_id)s, %(payload)s::bytea, 'pending',
           extract(epoch FROM clock_timestamp())::float8
    FROM u WHERE %(kind)s = 'interrupt'
    ON CONFLICT (thread_id, step, idx) DO NOTHING
),
j AS (
    INSERT INTO journal (thread_id, step, idx, name, result)
    SELECT u.thread_id, %(step)s, %(idx)s, %(sleep_name)s, %(timer)s::bytea
    FROM u WHERE %(kind)s = 'sleep'
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM (SELECT DISTINCT version FROM k) v)
SELECT (SELECT count(*) FROM woke) FROM u;

-- name: park_runs
-- Many park_runs (distinct runs, none spawning children) in one statement, inside a group
-- commit: each fenced on its own epoch and step exactly as park_run, with its pending
-- interrupt or journaled timer. Returns (thread_id) for each run parked. The rows come as one
-- JSON array of park_run's parameters (payload and timer as their UTF-8 text). Each run is
-- found by primary key, one lookup per row (OFFSET 0 keeps it so), and updated by TID, as in
-- commit_steps.
WITH x AS (
    SELECT p.thread_id, p.epoch, p.status, p.waiting_for, p.seconds, p.kind, p.step, p.idx,
           p.interrupt_id, p.payload, p.sleep_name, p.timer
    FROM json_to_recordset(%(rows)s::json)
        AS p(thread_id text, epoch bigint, status text, waiting_for text, seconds float8,
             kind text, step bigint, idx int, interrupt_id text, payload text,
             sleep_name text, timer text)
),
f AS MATERIALIZED (
    SELECT x.*, l.rid
    FROM x, LATERAL (SELECT ctid AS rid FROM runs
                     WHERE thread_id = x.thread_id AND epoch = x.epoch
                       AND status || '' = 'running' AND step = x.step - 1
                     OFFSET 0) AS l
),
u AS (
    UPDATE runs
    SET status = f.status, waiting_for = f.waiting_for,
        wake_at = extract(epoch FROM clock_timestamp())::float8 + f.seconds,
        lease_owner = NULL, lease_expires_at = NULL, attempt = 0, failures = 0,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    FROM f
    WHERE runs.ctid = ANY (ARRAY(SELECT rid FROM f)) AND runs.ctid = f.rid
      AND runs.epoch = f.epoch AND runs.status || '' = 'running' AND runs.step = f.step - 1
    RETURNING runs.thread_id, f.kind, f.step, f.idx, f.interrupt_id, f.payload, f.sleep_name,
              f.timer
),
i AS (
    INSERT INTO interrupts (thread_id, step, idx, id, payload, status, created_at)
    SELECT thread_id, step, idx, interrupt_id, convert_to(payload, 'UTF8'), 'pending',
           extract(epoch FROM clock_timestamp())::float8
    FROM u WHERE kind = 'interrupt'
    ON CONFLICT (thread_id, step, idx) DO NOTHING
),
j AS (
    INSERT INTO journal (thread_id, step, idx, name, result)
    SELECT thread_id, step, idx, sleep_name, convert_to(timer, 'UTF8')
    FROM u WHERE kind = 'sleep'
)
SELECT thread_id FROM u;

-- name: requeue_if_joined
-- A parent parking in join whose children all finished meanwhile stays claimable. A later
-- statement than the park (a fresh snapshot): a child that finishes after it locks this row
-- and wakes it (wake_after_commit) instead.
WITH w AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL
    WHERE thread_id = %(thread_id)s AND status || '' = 'waiting' AND waiting_for = 'join'
      AND NOT EXISTS (SELECT 1 FROM runs c
                      WHERE c.thread_id = ANY(%(children)s::text[])
                        AND c.status NOT IN ('completed', 'failed', 'cancelled'))
    RETURNING version
)
SELECT pg_notify('tether_work', version) FROM w;
