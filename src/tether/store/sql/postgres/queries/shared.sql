-- Postgres: fragments the queries of several files share (no queries here).

-- fragment: run_columns
-- The columns of RunRecord, in its order: every query returning a run row uses them.
thread_id, agent, version, status, node, step, attempt, failures, input, input_hash,
       idempotency_key, lease_owner, lease_expires_at, epoch, wake_at, waiting_for, error,
       parent_thread_id, forked_from, forked_step, created_at, updated_at, trace_context

-- fragment: effect_columns
-- The columns of EffectRecord, in its order.
thread_id, key, step, idx, name, payload, status, attempts, epoch, next_attempt_at,
       result, error, compensates, created_at, done_at

-- fragment: interrupt_columns
-- The columns of InterruptRecord, in its order.
thread_id, step, idx, id, payload, value, status, created_at, resolved_at

-- fragment: checkpoint_columns
-- The columns of CheckpointRecord, in its order.
thread_id, step, node, next_node, kind, data, worker, attempt, started_at, finished_at

-- fragment: step_update
-- The step commits of one run (commit_step, commit_step_notify, commit_step_wake,
-- commit_step_tx) share these two: the run moved past the step, fenced by the epoch (u), and
-- the step's checkpoint, only if u matched (each adds its own RETURNING). A run that stays
-- running has its lease extended to now + ttl when less than half of ttl is left (the commit
-- proves the lease: a worker whose heartbeat lags keeps it); above that it is left as it is,
-- so the hot path's update stays HOT (no index holds a column it changes). Fenced by the
-- epoch and by the step: a commit lost in a failover to an asynchronous standby (the tail it
-- had not received) leaves the run a step behind its worker, whose next commit then matches
-- nothing (LeaseLost) instead of leaving a gap in the checkpoint log.
    UPDATE runs
    SET step = %(step)s, node = %(next_node)s, status = %(status)s,
        attempt = CASE WHEN %(status)s = 'running' THEN 1 ELSE 0 END, failures = 0,
        wake_at = %(wake_at)s, waiting_for = %(waiting_for)s,
        lease_owner = CASE WHEN %(status)s = 'running' THEN lease_owner END,
        lease_expires_at = CASE WHEN %(status)s = 'running' THEN
            CASE WHEN lease_expires_at < extract(epoch FROM clock_timestamp())::float8
                                         + %(ttl)s::float8 / 2
                 THEN extract(epoch FROM clock_timestamp())::float8 + %(ttl)s::float8
                 ELSE lease_expires_at END END,
        updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND epoch = %(epoch)s AND status || '' = 'running'
      AND step = %(step)s - 1  -- the step after the run's last: never a gap in its log

-- fragment: step_checkpoint
    INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, attempt,
                             started_at, finished_at)
    SELECT u.thread_id, %(step)s, %(node)s, %(next_node)s, %(kind)s, %(data)s, %(worker)s,
           %(attempt)s, %(started_at)s, %(finished_at)s
    FROM u

-- fragment: spawn_children
-- The children a step or a park spawns (queued; one that exists already is left as it is),
-- only if the fenced update u matched; the children come as one array per field (see
-- _add_children in postgres.py). Needs CTEs t (the time) and u.
    INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                      idempotency_key, parent_thread_id, forked_from, forked_step,
                      created_at, updated_at)
    SELECT x.thread_id, x.agent, x.version, 'queued', x.node, x.input, x.input_hash,
           x.idempotency_key, x.parent_thread_id, x.forked_from, x.forked_step,
           t.now, t.now
    FROM u, t, unnest(%(c_thread_id)s::text[], %(c_agent)s::text[], %(c_version)s::text[],
                   %(c_node)s::text[], %(c_input)s::bytea[], %(c_input_hash)s::text[],
                   %(c_idempotency_key)s::text[], %(c_parent_thread_id)s::text[],
                   %(c_forked_from)s::text[], %(c_forked_step)s::bigint[])
         AS x(thread_id, agent, version, node, input, input_hash, idempotency_key,
              parent_thread_id, forked_from, forked_step)
    ON CONFLICT DO NOTHING

-- fragment: wake_joined_parent
-- A run that u finished wakes its parent if that is parked in join: lk locks the parent row
-- first, which returns its latest version (waiting for a park in progress to commit), and wp
-- updates through it, so a park and this wake-up cannot miss each other (the parent's
-- requeue_if_joined runs after its park took the row). Needs CTEs t and u (with status and
-- parent_thread_id); the caller announces wp's version.
lk AS (
    SELECT r.thread_id, r.status, r.waiting_for FROM runs r
    WHERE r.thread_id = (SELECT parent_thread_id FROM u
                         WHERE status IN ('completed', 'failed', 'cancelled'))
    FOR NO KEY UPDATE
),
wp AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL, updated_at = t.now
    FROM lk, t
    WHERE runs.thread_id = lk.thread_id AND lk.status = 'waiting' AND lk.waiting_for = 'join'
    RETURNING runs.version
)

-- fragment: compensations
-- Saga: for every effect (not dead) of the runs u ended, its compensation queued after all
-- of the run's effects, in reverse order of the originals, for compensable effects and those
-- named in names. Needs CTEs t and u (thread_id); the caller announces tether_effects when
-- comp returned a row.
comp AS (
    INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at,
                        compensates, created_at)
    SELECT o.thread_id, o.key || ':compensate', %(comp_step)s, -(o.step * 100000 + o.idx),
           o.name, o.payload, 'pending', t.now, o.key, t.now
    FROM t, outbox o JOIN u ON o.thread_id = u.thread_id
    WHERE o.compensates IS NULL AND o.status IN ('pending', 'running', 'done')
      AND (o.compensable OR o.name = ANY(%(names)s::text[]))
    ON CONFLICT DO NOTHING
    RETURNING 1
)
