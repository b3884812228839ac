-- SQLite: the outbox (effects, their claims, done marks, retries, compensations).

-- name: effect_keys_taken
-- Which of a step's effect keys the run already used (explicit keys must be unique per run).
SELECT key FROM outbox WHERE thread_id = :thread_id AND key IN (SELECT value FROM json_each(:keys));

-- name: insert_effect
-- A transactional effect is stored done (performed in this very transaction).
INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at, compensates,
                    created_at, compensable, attempts, done_at)
VALUES (:thread_id, :key, :step, :idx, :name, :payload, :status, (julianday('now') - 2440587.5) * 86400.0,
        NULL, (julianday('now') - 2440587.5) * 86400.0, :compensable,
        CASE WHEN :status = 'done' THEN 1 ELSE 0 END,
        CASE WHEN :status = 'done' THEN (julianday('now') - 2440587.5) * 86400.0 END);

-- name: effect_head_after
-- The head of the first run after `after` in thread_id order: the run's first effect in
-- request order (step, idx) still pending or running (only heads are claimable, so a run's
-- effects go strictly in order and one waiting to be retried holds back the rest). One probe
-- of outbox_live; claim_effects walks runs round robin with it.
SELECT rowid, thread_id, name, status, next_attempt_at, lease_expires_at FROM outbox
WHERE status IN ('pending', 'running') AND thread_id > :after
ORDER BY thread_id, step, idx LIMIT 1;

-- name: effect_head_first
-- The head of the first run (the walk wraps around to it).
SELECT rowid, thread_id, name, status, next_attempt_at, lease_expires_at FROM outbox
WHERE status IN ('pending', 'running')
ORDER BY thread_id, step, idx LIMIT 1;

-- name: claim_effect_rows
-- Leases the due heads the walk found (in the same write transaction), each claim bumping
-- the effect's epoch and attempts.
UPDATE outbox
SET status = 'running', lease_owner = :worker,
    lease_expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl,
    epoch = epoch + 1, attempts = attempts + 1
WHERE rowid IN (SELECT value FROM json_each(:rowids))
  AND status IN ('pending', 'running')
RETURNING {{effect_columns}};

-- name: complete_effect
-- Records an effect done once: only the holder of the current effect epoch may.
UPDATE outbox
SET status = 'done', result = :result, error = NULL, lease_owner = NULL, lease_expires_at = NULL,
    done_at = (julianday('now') - 2440587.5) * 86400.0
WHERE thread_id = :thread_id AND key = :key AND epoch = :epoch AND status = 'running';

-- name: fail_effect
-- A failed attempt: back to pending after :delay seconds, or dead when :delay is NULL.
UPDATE outbox
SET status = CASE WHEN :delay IS NULL THEN 'dead' ELSE 'pending' END,
    next_attempt_at = (julianday('now') - 2440587.5) * 86400.0 + coalesce(:delay, 0),
    error = :error, lease_owner = NULL, lease_expires_at = NULL
WHERE thread_id = :thread_id AND key = :key AND epoch = :epoch AND status = 'running';

-- name: add_compensations
-- Saga: for every effect of the run that is not dead, queue its compensation after all of the
-- run's effects, in reverse order of the originals (idx descending = original order reversed).
INSERT INTO outbox (thread_id, key, step, idx, name, payload, status, next_attempt_at, compensates,
                    created_at)
SELECT thread_id, key || ':compensate', :step, -(step * 100000 + idx), name, payload, 'pending',
       (julianday('now') - 2440587.5) * 86400.0, key, (julianday('now') - 2440587.5) * 86400.0
FROM outbox
WHERE thread_id = :thread_id AND compensates IS NULL AND status IN ('pending', 'running', 'done')
  AND (compensable = 1 OR name IN (SELECT value FROM json_each(:names)))
ON CONFLICT DO NOTHING;

-- name: renew_effect_leases
-- One statement renews every effect lease a worker's dispatcher holds.
UPDATE outbox SET lease_expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl
WHERE lease_owner = :worker AND status = 'running'
  AND status IN ('pending', 'running');  -- (lets it read outbox_live)

-- name: get_effect
SELECT {{effect_columns}}
FROM outbox WHERE thread_id = :thread_id AND key = :key;

-- name: list_effects
-- Effects by age, of a run, of a status, or both. The dead ones of every run (the
-- dashboard's list) are a range of outbox_dead (migration 0017), the pending or running ones
-- the live effects of outbox_live, sorted: never a read of every done effect. One branch
-- each, the last for everything else (each runs only when its condition on the parameters
-- holds).
SELECT * FROM (
    SELECT * FROM (
        SELECT {{effect_columns}}
        FROM outbox INDEXED BY outbox_dead
        WHERE :status IS 'dead' AND :thread_id IS NULL AND status = 'dead'
        ORDER BY created_at, thread_id, step, idx
        LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT {{effect_columns}}
        FROM outbox INDEXED BY outbox_live
        WHERE :status IN ('pending', 'running') AND :thread_id IS NULL AND status = :status
          AND status IN ('pending', 'running')  -- (lets it read outbox_live)
        ORDER BY created_at, thread_id, step, idx
        LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT {{effect_columns}}
        FROM outbox
        WHERE NOT (coalesce(:status IN ('dead', 'pending', 'running'), false)
                   AND :thread_id IS NULL)
          AND (:thread_id IS NULL OR thread_id = :thread_id)
          AND (:status IS NULL OR status = :status)
        ORDER BY created_at, thread_id, step, idx
        LIMIT :limit)
)
ORDER BY created_at, thread_id, step, idx
LIMIT :limit;

-- name: retry_effect
-- An operator retries a dead (or failing) effect now, with a fresh attempt budget.
UPDATE outbox
SET status = 'pending', attempts = 0, next_attempt_at = (julianday('now') - 2440587.5) * 86400.0,
    lease_owner = NULL, lease_expires_at = NULL
WHERE key = :key AND (:thread_id IS NULL OR thread_id = :thread_id) AND status IN ('dead', 'pending')
RETURNING {{effect_columns}};
