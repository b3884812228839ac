-- Postgres: store-wide counts for the gauges of `tether serve` (/metrics).

-- name: status_counts
-- Runs by status and version, and effects not done by status (kind 'run' or 'effect'): one
-- statement, read at most every few seconds (the server caches it).
SELECT 'run', status, version, count(*) FROM runs GROUP BY status, version
UNION ALL
SELECT 'effect', status, '', count(*) FROM outbox
WHERE status IN ('pending', 'running', 'dead') GROUP BY status;
