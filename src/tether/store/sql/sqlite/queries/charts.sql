-- SQLite: what the dashboard's charts (/ui/metrics) and agent pages (/ui/agents/{name}) read.
-- Reads only, each bounded: a time range of an index (runs_finished, checkpoints_finished,
-- runs_created), a LIMIT, or both. :since is the window's start; the counts per bucket are read
-- as slices of it (charts.py: Buckets; the dashboard remembers the complete buckets).

-- fragment: slices(source, cond)
-- Per slice k of :n, [since + k * slice, since + (k + 1) * slice): how many rows of `source`
-- finished in it, counted up to :cap, and when the :cap-th of them finished (NULL when there
-- are fewer: then the count is exact), so a full slice can be estimated from the time its
-- first :cap rows took (charts.py). Each slice reads at most :cap entries of one index range
-- (skipped to the :cap-th; counted only when there are fewer), so a read is bounded by
-- n * cap however busy the window was; slices with no row are left out.
WITH RECURSIVE s(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM s WHERE k + 1 < :n),
f AS MATERIALIZED (
    SELECT s.k, :since + s.k * :slice AS lo, :since + (s.k + 1) * :slice AS hi,
           (SELECT finished_at FROM {{source}}
            WHERE finished_at >= :since + s.k * :slice
              AND finished_at < :since + (s.k + 1) * :slice
              {{cond}}
            ORDER BY finished_at LIMIT 1 OFFSET :cap - 1) AS last
    FROM s
)
SELECT k, n, last FROM (
    SELECT f.k, f.last,
           CASE WHEN f.last IS NOT NULL THEN :cap
                ELSE (SELECT count(*) FROM {{source}}
                      WHERE finished_at >= f.lo AND finished_at < f.hi
                        {{cond}}) END AS n
    FROM f)
WHERE n > 0

-- name: charts_runs_finished
-- Runs finished (completed, failed or cancelled) per slice (see slices): runs_finished alone.
{{slices(runs, AND finished_at IS NOT NULL)}};

-- name: charts_steps_finished
-- Steps committed per slice (see slices): checkpoints_finished alone.
{{slices(checkpoints, )}};

-- name: charts_step_sample
-- The newest :limit steps of the window, with their run's agent: seconds from start to commit.
SELECT r.agent, c.finished_at - c.started_at
FROM (SELECT thread_id, started_at, finished_at FROM checkpoints
      WHERE finished_at >= :since ORDER BY finished_at DESC LIMIT :limit) AS c
JOIN runs AS r ON r.thread_id = c.thread_id;

-- name: charts_run_sample
-- The newest :limit runs finished in the window: agent, status, seconds from start to finish.
SELECT agent, status, finished_at - created_at FROM runs
WHERE finished_at >= :since AND finished_at IS NOT NULL
ORDER BY finished_at DESC LIMIT :limit;

-- name: charts_queue_sample
-- The newest :limit runs started in the window and the start of their first step (NULL while
-- none started: the run has waited since created_at). A fork's first step is forked_step + 1.
SELECT r.agent, r.created_at, c.started_at
FROM (SELECT thread_id, agent, created_at, forked_step FROM runs
      WHERE created_at >= :since ORDER BY created_at DESC LIMIT :limit) AS r
LEFT JOIN checkpoints AS c
       ON c.thread_id = r.thread_id AND c.step = coalesce(r.forked_step, 0) + 1;

-- name: charts_failed_sample
-- The :limit newest failed runs (runs_failed, newest first), kept if they failed in the window.
SELECT agent, error, finished_at
FROM (SELECT agent, error, finished_at FROM runs WHERE status = 'failed'
      ORDER BY created_at DESC LIMIT :limit) AS f
WHERE finished_at >= :since;

-- name: agent_edges
-- The transitions the given runs took (node -> next node, NULL once finished), with counts,
-- over at most :limit of their checkpoints.
SELECT node, next_node, count(*)
FROM (SELECT node, next_node FROM checkpoints
      WHERE thread_id IN (SELECT value FROM json_each(:ids)) LIMIT :limit) AS c
GROUP BY node, next_node;

-- name: agent_path
-- One run's steps in order (at most :limit): the path it took.
SELECT step, node, next_node FROM checkpoints WHERE thread_id = :thread_id
ORDER BY step LIMIT :limit;

-- name: run_calls
-- The calls one run journaled in steps :first to :last, in step and call order
-- (at most :limit): what its page shows beside the steps it lists (a range of the
-- journal's primary key).
SELECT step, idx, name, result, args FROM journal
WHERE thread_id = :thread_id AND step >= :first AND step <= :last
ORDER BY step, idx LIMIT :limit;

-- name: charts_tip
-- The last run and the last step finished: what the live probe of /ui/metrics compares (two
-- index seeks).
SELECT (SELECT MAX(finished_at) FROM runs WHERE finished_at IS NOT NULL),
       (SELECT MAX(finished_at) FROM checkpoints);
