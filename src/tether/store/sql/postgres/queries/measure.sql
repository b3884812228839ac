-- Postgres: what `tether advise --measure` reads of the load over a window. Reads only, each a
-- single scan; %(since)s and %(mid)s are seconds since the epoch (the window's start and middle).

-- name: measure_runs
-- Runs started and finished in the window (finished = terminal, last updated in it), their
-- mean duration and steps, the first run ever, the longest-waiting run's park time, and the
-- runs started in the window's second half (for the growth estimate).
SELECT COALESCE(SUM(CASE WHEN created_at >= %(since)s THEN 1 ELSE 0 END), 0),
       COALESCE(SUM(CASE WHEN status IN ('completed', 'failed', 'cancelled')
                          AND updated_at >= %(since)s THEN 1 ELSE 0 END), 0),
       AVG(CASE WHEN status IN ('completed', 'failed', 'cancelled') AND updated_at >= %(since)s
                THEN updated_at - created_at END),
       AVG(CASE WHEN status IN ('completed', 'failed', 'cancelled') AND updated_at >= %(since)s
                THEN step END),
       MIN(created_at),
       MIN(CASE WHEN status = 'waiting' THEN updated_at END),
       COALESCE(SUM(CASE WHEN created_at >= %(mid)s THEN 1 ELSE 0 END), 0)
FROM runs;

-- name: measure_statuses
SELECT status, count(*)::bigint FROM runs GROUP BY status;

-- name: measure_runs_peak
-- The busiest minute of run starts in the window (a range of run_keys_created: 0018).
SELECT floor(created_at / 60)::bigint AS minute, count(*) AS n FROM run_keys
WHERE created_at >= %(since)s GROUP BY minute ORDER BY n DESC LIMIT 1;

-- name: measure_steps
-- Steps committed in the window, their checkpoint bytes, those in its second half, and the
-- whole log's rows and bytes (the window's share of the database's growth).
SELECT (SELECT count(*) FROM checkpoints WHERE finished_at >= %(since)s),
       (SELECT COALESCE(SUM(length(data))::bigint, 0) FROM checkpoints WHERE finished_at >= %(since)s),
       (SELECT count(*) FROM checkpoints WHERE finished_at >= %(mid)s),
       (SELECT count(*) FROM checkpoints),
       (SELECT MIN(finished_at) FROM checkpoints);

-- name: measure_steps_peak
SELECT floor(finished_at / 60)::bigint AS minute, count(*) AS n FROM checkpoints
WHERE finished_at >= %(since)s GROUP BY minute ORDER BY n DESC LIMIT 1;

-- name: measure_step_durations
-- A bounded sample of step durations in the window (the percentiles are taken in Python).
SELECT finished_at - started_at FROM checkpoints WHERE finished_at >= %(since)s LIMIT %(limit)s;

-- name: measure_interrupts
SELECT count(*), MIN(created_at) FROM interrupts WHERE status = 'pending';

-- name: measure_effects
-- Effects requested in the window; dead and unfinished ones now.
SELECT COALESCE(SUM(CASE WHEN created_at >= %(since)s THEN 1 ELSE 0 END), 0),
       COALESCE(SUM(CASE WHEN status = 'dead' THEN 1 ELSE 0 END), 0),
       COALESCE(SUM(CASE WHEN status IN ('pending', 'running') THEN 1 ELSE 0 END), 0)
FROM outbox;

-- name: measure_mail
SELECT count(*) FROM mailbox WHERE created_at >= %(since)s;

-- name: measure_db
-- The database's size in bytes (the WAL file apart) and, for Postgres only, max_connections.
SELECT pg_database_size(current_database()), current_setting('max_connections')::int;

-- name: measure_deploys
-- Deploys in the window: versions whose first registered worker started in it, and changes of
-- the routing weights (a version's row updated in it).
SELECT (SELECT count(*) FROM (SELECT version FROM workers GROUP BY version
                              HAVING MIN(started_at) >= %(since)s) AS v),
       (SELECT count(*) FROM deployments WHERE updated_at >= %(since)s);
