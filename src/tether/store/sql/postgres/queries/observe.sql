-- Postgres: store-wide counts for the gauges of `tether serve` (/metrics).

-- name: status_counts
-- Runs by status and version, and effects not done by status (kind 'run' or 'effect'): one
-- statement, read at most every few seconds (the server caches it).
SELECT 'run', status, version, count(*) FROM runs GROUP BY status, version
UNION ALL
SELECT 'effect', status, '', count(*) FROM outbox
WHERE status IN ('pending', 'running', 'dead') GROUP BY status;

-- name: status_counts_capped
-- status_counts for a person (the dashboard): every count stops at %(cap)s (kind 'run+' or
-- 'effect+': at least that many), each read through an index, never every open run:
-- open runs per version (given: the skip scan open_versions, read first: a known array
-- keeps the plan's estimate under the JIT threshold) and status, a range of runs_open read
-- at most %(cap)s + 1 far; failed and cancelled, their partial indexes (at most %(cap)s entries, by version);
-- completed, among the newest %(cap)s finished runs (runs_finished); effects, at most %(cap)s
-- + 1 of each status, each status a literal so that its partial index serves it (pending
-- and running: outbox_live; dead: outbox_dead, migration 0017), never every done effect.
-- Each count of runs is in its index's order, and the store reads this with sorting and JIT
-- off (read_by_index): the planner then reads each index alone, a page of it (runs_failed
-- holds the version), where it took a bitmap read of every run counted (10,000 rows on
-- 10,000 pages: 50 ms) and compiled the plan (40 ms): 30 ms in all at a million runs, was
-- 100-150.
SELECT CASE WHEN n > %(cap)s THEN 'run+' ELSE 'run' END, status, version, least(n, %(cap)s)
FROM (
    SELECT v.version AS version, s.status,
           (SELECT count(*) FROM (SELECT 1 FROM runs AS r
                                  WHERE r.version = v.version AND r.status = s.status
                                    AND r.status IN ('queued', 'running', 'waiting', 'sleeping')
                                  ORDER BY r.created_at  -- runs_open's order: see below
                                  LIMIT %(cap)s + 1) AS x) AS n
    FROM unnest(%(versions)s::text[]) AS v(version)
    CROSS JOIN (VALUES ('queued'), ('running'), ('waiting'), ('sleeping')) AS s(status)
    OFFSET 0  -- each count once, not again for each column that uses it
) AS o
WHERE n > 0
UNION ALL
SELECT CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM runs WHERE status = 'failed'
                                        ORDER BY created_at
                                        LIMIT %(cap)s) AS c) >= %(cap)s THEN 'run+' ELSE 'run' END,
       'failed', version, count(*)
FROM (SELECT version FROM runs WHERE status = 'failed' ORDER BY created_at LIMIT %(cap)s) AS f
GROUP BY version
UNION ALL
SELECT CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM runs WHERE status = 'cancelled'
                                        ORDER BY created_at
                                        LIMIT %(cap)s) AS c) >= %(cap)s THEN 'run+' ELSE 'run' END,
       'cancelled', version, count(*)
FROM (SELECT version FROM runs WHERE status = 'cancelled' ORDER BY created_at LIMIT %(cap)s) AS f
GROUP BY version
UNION ALL
SELECT CASE WHEN (SELECT count(*) FROM (SELECT 1 FROM runs WHERE finished_at IS NOT NULL
                                        LIMIT %(cap)s) AS c) >= %(cap)s THEN 'run+' ELSE 'run' END,
       'completed', version, count(*)
FROM (SELECT status, version FROM runs WHERE finished_at IS NOT NULL
      ORDER BY finished_at DESC LIMIT %(cap)s) AS f
WHERE status = 'completed'
GROUP BY version
UNION ALL
SELECT CASE WHEN n > %(cap)s THEN 'effect+' ELSE 'effect' END, status, '', least(n, %(cap)s)
FROM (
    SELECT 'pending' AS status, (SELECT count(*) FROM (SELECT 1 FROM outbox
                                     WHERE status = 'pending'
                                       AND status IN ('pending', 'running')
                                     LIMIT %(cap)s + 1) AS x) AS n
    UNION ALL
    SELECT 'running', (SELECT count(*) FROM (SELECT 1 FROM outbox
                                     WHERE status = 'running'
                                       AND status IN ('pending', 'running')
                                     LIMIT %(cap)s + 1) AS x)
    UNION ALL
    SELECT 'dead', (SELECT count(*) FROM (SELECT 1 FROM outbox
                                     WHERE status = 'dead' LIMIT %(cap)s + 1) AS x)
    OFFSET 0  -- each count once, not again for each column that uses it
) AS e
WHERE n > 0;
