-- Postgres: rainbow deploys (the worker registry, the routing weights, open runs by version,
-- retirement and the upgrade of parked runs).

-- name: beat_worker
-- Registers a worker or renews its row (last_seen is the database clock; a stopped row that
-- beats again serves again), and drops rows of workers not seen for a day: one statement.
WITH t AS MATERIALIZED (SELECT extract(epoch FROM clock_timestamp())::float8 AS now),
gone AS (DELETE FROM workers WHERE last_seen < (SELECT now FROM t) - 86400.0
                               AND id <> %(id)s)
INSERT INTO workers (id, host, pid, version, agents, concurrency, busy, lease_ttl, started_at,
                     last_seen, stopped_at)
SELECT %(id)s, %(host)s, %(pid)s, %(version)s, %(agents)s, %(concurrency)s, %(busy)s,
       %(lease_ttl)s::float8, t.now, t.now, NULL
FROM t
ON CONFLICT (id) DO UPDATE
SET busy = excluded.busy, agents = excluded.agents, concurrency = excluded.concurrency,
    lease_ttl = excluded.lease_ttl, last_seen = excluded.last_seen, stopped_at = NULL
RETURNING id;

-- name: stop_worker
-- A clean stop: the worker no longer serves from now.
UPDATE workers
SET stopped_at = extract(epoch FROM clock_timestamp())::float8,
    last_seen = extract(epoch FROM clock_timestamp())::float8
WHERE id = %(id)s
RETURNING id;

-- name: list_workers
SELECT id, host, pid, version, agents, concurrency, busy, lease_ttl, started_at, last_seen,
       stopped_at
FROM workers ORDER BY version, id;

-- name: list_deployments
SELECT version, weight, retired_at, updated_at FROM deployments ORDER BY version;

-- name: lock_deployments
-- Serializes writers of the weight table (route, drain, retire): each reads and writes it
-- whole under this lock, so two concurrent routes end as one of them, never a mix.
LOCK TABLE deployments IN SHARE ROW EXCLUSIVE MODE;

-- name: clear_weights
-- route() replaces the whole table: versions it does not name get weight 0.
UPDATE deployments SET weight = 0, updated_at = extract(epoch FROM clock_timestamp())::float8
WHERE weight <> 0;

-- name: set_weight
-- A retired version keeps its retired_at (the caller refuses a weight > 0 for it).
INSERT INTO deployments (version, weight, retired_at, updated_at)
VALUES (%(version)s, %(weight)s, NULL, extract(epoch FROM clock_timestamp())::float8)
ON CONFLICT (version) DO UPDATE SET weight = excluded.weight, updated_at = excluded.updated_at;

-- name: open_runs
-- Open runs by version and status from runs_open (an index-only scan where the visibility
-- map allows).
SELECT version, status, count(*), min(created_at)
FROM runs
WHERE status IN ('queued', 'running', 'waiting', 'sleeping')
GROUP BY version, status
ORDER BY version, status;

-- fragment: open_version_walk
-- The versions that have open runs as `v(version)`, one index seek each (a skip scan of
-- runs_open: a recursive walk to the next version), however many runs each has; the last
-- row is NULL.
WITH RECURSIVE v(version) AS (
    (SELECT version FROM runs WHERE status IN ('queued', 'running', 'waiting', 'sleeping')
     ORDER BY version LIMIT 1)
    UNION ALL
    SELECT (SELECT r.version FROM runs AS r
            WHERE r.status IN ('queued', 'running', 'waiting', 'sleeping')
              AND r.version > v.version
            ORDER BY r.version LIMIT 1)
    FROM v WHERE v.version IS NOT NULL
)

-- name: open_versions
-- The versions that have open runs (open_version_walk).
{{open_version_walk}}
SELECT version FROM v WHERE version IS NOT NULL;

-- name: open_runs_capped
-- open_runs of the given versions (open_versions) with each count stopping at %(cap)s + 1
-- (the caller shows "cap+"): per version and status a range of runs_open read at most that
-- far, and its first entry for the oldest; never every open run, however many are parked.
-- The literal status list makes the partial index usable for a status bound at run time.
-- Two statements, not one: the versions are then a known array, and the plan's estimate
-- stays under the JIT threshold (compiling it cost 40 ms, more than the reads).
SELECT v.version, s.status, c.n, o.oldest
FROM unnest(%(versions)s::text[]) AS v(version)
CROSS JOIN (VALUES ('queued'), ('running'), ('waiting'), ('sleeping')) AS s(status)
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (SELECT 1 FROM runs AS r
                               WHERE r.version = v.version AND r.status = s.status
                                 AND r.status IN ('queued', 'running', 'waiting', 'sleeping')
                               LIMIT %(cap)s + 1) AS x) AS c
CROSS JOIN LATERAL (
    SELECT r.created_at AS oldest FROM runs AS r
    WHERE r.version = v.version AND r.status = s.status
      AND r.status IN ('queued', 'running', 'waiting', 'sleeping')
    ORDER BY r.created_at LIMIT 1) AS o
ORDER BY v.version, s.status;

-- name: stranded_runs
-- Counted at most %(cap)s + 1 (NULL: all): a version's open runs not updated since before,
-- read along runs_open (its order named, so a seq scan of the table that stops at the cap
-- is not taken: it reads every other version's runs first).
SELECT count(*)
FROM (SELECT 1 FROM runs
      WHERE version = %(version)s AND status IN ('queued', 'running', 'waiting', 'sleeping')
        AND updated_at < %(before)s::float8
      ORDER BY version, status, created_at, thread_id
      LIMIT %(cap)s::bigint + 1) AS s;

-- name: open_run_ids
-- The oldest open runs of a version (what retire names when it refuses).
SELECT thread_id
FROM runs
WHERE version = %(version)s AND status IN ('queued', 'running', 'waiting', 'sleeping')
ORDER BY created_at, thread_id
LIMIT %(limit)s;

-- name: retire_version
-- Retired keeps its first time; the weight is 0 from now on.
INSERT INTO deployments (version, weight, retired_at, updated_at)
VALUES (%(version)s, 0, extract(epoch FROM clock_timestamp())::float8,
        extract(epoch FROM clock_timestamp())::float8)
ON CONFLICT (version) DO UPDATE
SET weight = 0, retired_at = coalesce(deployments.retired_at, excluded.retired_at),
    updated_at = excluded.updated_at;

-- name: parked_runs
-- Every parked run of a version (upgrade's candidates when no thread_id is named), locked in
-- thread_id order (as a group commit locks runs) until the move commits: a claim skips them
-- (SKIP LOCKED) and a resume waits, so none can start running in between.
SELECT {{run_columns}}
FROM runs
WHERE version = %(version)s AND status IN ('queued', 'running', 'waiting', 'sleeping')
  AND status <> 'running'
ORDER BY thread_id
FOR NO KEY UPDATE;

-- name: runs_by_ids
-- The named runs (upgrade's candidates when thread_ids are named), in any status, locked as
-- parked_runs locks them.
SELECT {{run_columns}}
FROM runs
WHERE thread_id = ANY(%(ids)s::text[])
ORDER BY thread_id
FOR NO KEY UPDATE;

-- name: move_runs
-- Moves the named runs to another version if each is still parked on the old one (the
-- caller checks the count: all or nothing). Status, node, wake_at and the epoch stay: the
-- run is not woken; the new version's workers are told when one is queued.
WITH moved AS (
    UPDATE runs SET version = %(to_version)s,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = ANY(%(ids)s::text[])
      AND version = %(from_version)s AND status IN ('queued', 'waiting', 'sleeping')
    RETURNING status
),
woke AS MATERIALIZED (
    SELECT pg_notify('tether_work', %(to_version)s)
    WHERE EXISTS (SELECT 1 FROM moved WHERE status IN ('queued', 'sleeping'))
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM woke);
