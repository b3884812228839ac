-- SQLite: store-wide counts for the gauges of `tether serve` (/metrics).

-- name: status_counts
-- Runs by status and version, and effects not done by status (kind 'run' or 'effect'): one
-- statement, read at most every few seconds (the server caches it).
SELECT 'run', status, version, count(*) FROM runs GROUP BY status, version
UNION ALL
SELECT 'effect', status, '', count(*) FROM outbox
WHERE status IN ('pending', 'running', 'dead') GROUP BY status;

-- name: status_counts_capped
-- status_counts for a person (the dashboard): every count stops at :cap (kind 'run+' or
-- 'effect+': at least that many), each read through an index, never every open run:
-- open runs per version (a skip scan of runs_open) and status, a range of runs_open read
-- at most :cap + 1 far; failed and cancelled, their partial indexes (at most :cap entries, by version);
-- completed, among the newest :cap finished runs (runs_finished); effects, at most :cap
-- + 1 of each status, each status a literal so that its partial index serves it (pending
-- and running: outbox_live; dead: outbox_dead, migration 0017), never every done effect.
{{open_versions}}
SELECT CASE WHEN n > :cap THEN 'run+' ELSE 'run' END, status, version, min(n, :cap)
FROM (
    SELECT v.version, s.status,
           (SELECT count(*) FROM (SELECT 1 FROM runs AS r
                                  WHERE r.version = v.version AND r.status = s.status
                                    AND r.status IN ('queued', 'running', 'waiting', 'sleeping')
                                  LIMIT :cap + 1)) AS n
    FROM v
    CROSS JOIN open_status AS s
    WHERE v.version IS NOT NULL
    LIMIT -1 OFFSET 0  -- each count once, not again for each column that uses it
)
WHERE n > 0
UNION ALL
SELECT CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM runs WHERE status = 'failed'
                                        LIMIT :cap)) >= :cap THEN 'run+' ELSE 'run' END,
       'failed', version, count(*)
FROM (SELECT version FROM runs WHERE status = 'failed' LIMIT :cap)
GROUP BY version
UNION ALL
SELECT CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM runs WHERE status = 'cancelled'
                                        LIMIT :cap)) >= :cap THEN 'run+' ELSE 'run' END,
       'cancelled', version, count(*)
FROM (SELECT version FROM runs WHERE status = 'cancelled' LIMIT :cap)
GROUP BY version
UNION ALL
SELECT CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM runs WHERE finished_at IS NOT NULL
                                        LIMIT :cap)) >= :cap THEN 'run+' ELSE 'run' END,
       'completed', version, count(*)
FROM (SELECT status, version FROM runs WHERE finished_at IS NOT NULL
      ORDER BY finished_at DESC LIMIT :cap)
WHERE status = 'completed'
GROUP BY version
UNION ALL
SELECT CASE WHEN n > :cap THEN 'effect+' ELSE 'effect' END, status, '', min(n, :cap)
FROM (
    SELECT 'pending' AS status, (SELECT count(*) FROM (SELECT 1 FROM outbox
                                     WHERE status = 'pending'
                                       AND status IN ('pending', 'running')
                                     LIMIT :cap + 1)) AS n
    UNION ALL
    SELECT 'running', (SELECT count(*) FROM (SELECT 1 FROM outbox
                                     WHERE status = 'running'
                                       AND status IN ('pending', 'running')
                                     LIMIT :cap + 1))
    UNION ALL
    SELECT 'dead', (SELECT count(*) FROM (SELECT 1 FROM outbox
                                     WHERE status = 'dead' LIMIT :cap + 1))
    LIMIT -1 OFFSET 0  -- each count once, not again for each column that uses it
) AS e
WHERE n > 0;
