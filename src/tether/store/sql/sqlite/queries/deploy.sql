-- SQLite: rainbow deploys (the worker registry, the routing weights, open runs by version,
-- retirement and the upgrade of parked runs).

-- name: beat_worker
-- Registers a worker or renews its row: last_seen is the database clock, a stopped row that
-- beats again serves again.
INSERT INTO workers (id, host, pid, version, agents, concurrency, busy, lease_ttl, started_at,
                     last_seen, stopped_at)
VALUES (:id, :host, :pid, :version, :agents, :concurrency, :busy, :lease_ttl,
        (julianday('now') - 2440587.5) * 86400.0, (julianday('now') - 2440587.5) * 86400.0, NULL)
ON CONFLICT (id) DO UPDATE
SET busy = excluded.busy, agents = excluded.agents, concurrency = excluded.concurrency,
    lease_ttl = excluded.lease_ttl, last_seen = excluded.last_seen, stopped_at = NULL;

-- name: prune_workers
-- Rows of workers not seen for a day go (a crashed worker never removes its own).
DELETE FROM workers WHERE last_seen < (julianday('now') - 2440587.5) * 86400.0 - 86400.0;

-- name: stop_worker
-- A clean stop: the worker no longer serves from now.
UPDATE workers
SET stopped_at = (julianday('now') - 2440587.5) * 86400.0,
    last_seen = (julianday('now') - 2440587.5) * 86400.0
WHERE id = :id;

-- name: list_workers
SELECT id, host, pid, version, agents, concurrency, busy, lease_ttl, started_at, last_seen,
       stopped_at
FROM workers ORDER BY version, id;

-- name: list_deployments
SELECT version, weight, retired_at, updated_at FROM deployments ORDER BY version;

-- name: clear_weights
-- route() replaces the whole table: versions it does not name get weight 0.
UPDATE deployments SET weight = 0, updated_at = (julianday('now') - 2440587.5) * 86400.0
WHERE weight <> 0;

-- name: set_weight
-- A retired version keeps its retired_at (the caller refuses a weight > 0 for it).
INSERT INTO deployments (version, weight, retired_at, updated_at)
VALUES (:version, :weight, NULL, (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT (version) DO UPDATE SET weight = excluded.weight, updated_at = excluded.updated_at;

-- name: open_runs
-- Open runs by version and status from runs_open alone (no row read).
SELECT version, status, count(*), min(created_at)
FROM runs
WHERE status IN ('queued', 'running', 'waiting', 'sleeping')
GROUP BY version, status
ORDER BY version, status;

-- fragment: open_versions
-- The versions that have open runs, one index seek each (a skip scan of runs_open: a
-- recursive walk to the next version), however many runs each has.
WITH RECURSIVE v(version) AS (
    SELECT (SELECT version FROM runs INDEXED BY runs_open
            WHERE status IN ('queued', 'running', 'waiting', 'sleeping')
            ORDER BY version LIMIT 1)
    UNION ALL
    SELECT (SELECT r.version FROM runs AS r INDEXED BY runs_open
            WHERE r.status IN ('queued', 'running', 'waiting', 'sleeping')
              AND r.version > v.version
            ORDER BY r.version LIMIT 1)
    FROM v WHERE v.version IS NOT NULL
), open_status(status) AS (VALUES ('queued'), ('running'), ('waiting'), ('sleeping'))

-- fragment: open_count(version, status)
-- The open runs of one version and status, counted at most :cap + 1 of them: one range of
-- runs_open (the literal status list makes the partial index usable for a bound status).
(SELECT count(*) FROM (SELECT 1 FROM runs AS r
                       WHERE r.version = {{version}} AND r.status = {{status}}
                         AND r.status IN ('queued', 'running', 'waiting', 'sleeping')
                       LIMIT :cap + 1))

-- name: open_runs_capped
-- open_runs with each count stopping at :cap + 1 (the caller shows "cap+"): per version
-- (open_versions) and status, a range of runs_open read at most that far, and the first
-- entry of it for the oldest; never every open run, however many are parked.
{{open_versions}}
SELECT * FROM (
    SELECT v.version, s.status, {{open_count(v.version, s.status)}} AS n,
           (SELECT r.created_at FROM runs AS r
            WHERE r.version = v.version AND r.status = s.status
              AND r.status IN ('queued', 'running', 'waiting', 'sleeping')
            ORDER BY r.created_at LIMIT 1) AS oldest
    FROM v CROSS JOIN open_status AS s
    WHERE v.version IS NOT NULL
)
WHERE n > 0
ORDER BY version, status;

-- name: stranded_runs
-- Counted at most :cap + 1 (NULL: all, as LIMIT -1 is none): a version's open runs not
-- updated since before.
SELECT count(*)
FROM (SELECT 1 FROM runs
      WHERE version = :version AND status IN ('queued', 'running', 'waiting', 'sleeping')
        AND updated_at < :before
      LIMIT coalesce(:cap + 1, -1));

-- name: open_run_ids
-- The oldest open runs of a version (what retire names when it refuses).
SELECT thread_id
FROM runs
WHERE version = :version AND status IN ('queued', 'running', 'waiting', 'sleeping')
ORDER BY created_at, thread_id
LIMIT :limit;

-- name: retire_version
-- Retired keeps its first time; the weight is 0 from now on.
INSERT INTO deployments (version, weight, retired_at, updated_at)
VALUES (:version, 0, (julianday('now') - 2440587.5) * 86400.0,
        (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT (version) DO UPDATE
SET weight = 0, retired_at = coalesce(deployments.retired_at, excluded.retired_at),
    updated_at = excluded.updated_at;

-- name: parked_runs
-- Every parked run of a version (upgrade's candidates when no thread_id is named). The
-- status test is runs_open's predicate and one more term, so the index is used.
SELECT {{run_columns}}
FROM runs
WHERE version = :version AND status IN ('queued', 'running', 'waiting', 'sleeping')
  AND status <> 'running'
ORDER BY created_at, thread_id;

-- name: runs_by_ids
-- The named runs (upgrade's candidates when thread_ids are named), in any status.
SELECT {{run_columns}}
FROM runs
WHERE thread_id IN (SELECT value FROM json_each(:ids))
ORDER BY created_at, thread_id;

-- name: move_runs
-- Moves the named runs to another version if each is still parked on the old one (the
-- caller checks the count: all or nothing). Status, node, wake_at and the epoch stay: the
-- run is not woken, and a queued one is claimable by the new version's workers at once.
UPDATE runs SET version = :to_version, updated_at = (julianday('now') - 2440587.5) * 86400.0,
                {{resting(status, (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id IN (SELECT value FROM json_each(:ids))
  AND version = :from_version AND status IN ('queued', 'waiting', 'sleeping');
