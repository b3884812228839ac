-- SQLite: fragments the queries of several files share (no queries here).

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

-- fragment: resting(status, at)
-- idle_at (0017) and finished_at (0012) for a statement that sets status to {{status}} and
-- updated_at to {{at}}: every statement that changes a run's status or version sets both
-- through this fragment (no trigger keeps them since 0018; tests/integration/
-- test_runs_idle.py checks every kind of move).
idle_at = CASE WHEN {{status}} IN ('queued', 'waiting', 'sleeping') THEN {{at}} END,
    finished_at = CASE WHEN {{status}} IN ('completed', 'failed', 'cancelled') THEN {{at}} END
