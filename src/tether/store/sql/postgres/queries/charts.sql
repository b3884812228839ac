-- Postgres: what the dashboard's charts (/ui/metrics) and agent pages (/ui/agents/{name}) read.
-- Reads only, each bounded: a time range of an index (runs_finished, checkpoints_finished,
-- run_keys_created), a LIMIT, or both. %(since)s is the window's start; the counts per bucket are
-- read as slices of it (charts.py: Buckets; the dashboard remembers the complete buckets).

-- fragment: slices(source, cond)
-- Per slice k of %(n)s, [since + k * slice, since + (k + 1) * slice): how many rows of `source`
-- finished in it, counted up to %(cap)s, and when the last of those finished (so a full slice
-- can be estimated from the time its first %(cap)s rows took: charts.py). One index range of
-- at most %(cap)s entries per slice, so a read is bounded by n * cap however busy the window
-- was; slices with no row are left out.
SELECT s.k, x.n, x.last
FROM generate_series(0, %(n)s::int - 1) AS s(k),
     LATERAL (SELECT count(*) AS n, max(y.f) AS last
              FROM (SELECT finished_at AS f FROM {{source}}
                    WHERE finished_at >= %(since)s::float8 + s.k * %(slice)s::float8
                      AND finished_at < %(since)s::float8 + (s.k + 1) * %(slice)s::float8
                      {{cond}}
                    ORDER BY finished_at LIMIT %(cap)s) AS y) AS x
WHERE x.n > 0

-- name: charts_runs_finished
-- Runs finished (completed, failed or cancelled) per slice (see slices): runs_finished alone.
{{slices(runs, AND finished_at IS NOT NULL)}};

-- name: charts_steps_finished
-- Steps committed per slice (see slices): checkpoints_finished alone.
{{slices(checkpoints, )}};

-- name: charts_step_sample
-- The newest %(limit)s steps of the window, with their run's agent: seconds from start to commit.
SELECT r.agent, c.finished_at - c.started_at
FROM (SELECT thread_id, started_at, finished_at FROM checkpoints
      WHERE finished_at >= %(since)s ORDER BY finished_at DESC LIMIT %(limit)s) AS c
JOIN runs AS r ON r.thread_id = c.thread_id;

-- name: charts_run_sample
-- The newest %(limit)s runs finished in the window: agent, status, seconds from start to finish.
SELECT agent, status, finished_at - created_at FROM runs
WHERE finished_at >= %(since)s AND finished_at IS NOT NULL
ORDER BY finished_at DESC LIMIT %(limit)s;

-- name: charts_queue_sample
-- The newest %(limit)s runs started in the window and the start of their first step (NULL while
-- none started: the run has waited since created_at). A fork's first step is forked_step + 1.
SELECT r.agent, r.created_at, c.started_at
FROM (SELECT thread_id, agent, created_at FROM run_keys
      WHERE created_at >= %(since)s ORDER BY created_at DESC LIMIT %(limit)s) AS r
JOIN runs AS f ON f.thread_id = r.thread_id
LEFT JOIN checkpoints AS c
       ON c.thread_id = r.thread_id AND c.step = coalesce(f.forked_step, 0) + 1;

-- name: charts_failed_sample
-- The %(limit)s newest failed runs (runs_failed, newest first), kept if they failed in the window.
SELECT agent, error, finished_at
FROM (SELECT agent, error, finished_at FROM runs WHERE status = 'failed'
      ORDER BY created_at DESC LIMIT %(limit)s) AS f
WHERE finished_at >= %(since)s;

-- name: agent_edges
-- The transitions the given runs took (node -> next node, NULL once finished), with counts,
-- over at most %(limit)s of their checkpoints.
SELECT node, next_node, count(*)
FROM (SELECT node, next_node FROM checkpoints
      WHERE thread_id = ANY(%(ids)s::text[]) LIMIT %(limit)s) AS c
GROUP BY node, next_node;

-- name: agent_path
-- One run's steps in order (at most %(limit)s): the path it took.
SELECT step, node, next_node FROM checkpoints WHERE thread_id = %(thread_id)s
ORDER BY step LIMIT %(limit)s;

-- name: run_calls
-- The calls one run journaled in steps %(first)s to %(last)s, in step and call order
-- (at most %(limit)s): what its page shows beside the steps it lists (a range of the
-- journal's primary key).
SELECT step, idx, name, result, args FROM journal
WHERE thread_id = %(thread_id)s AND step >= %(first)s AND step <= %(last)s
ORDER BY step, idx LIMIT %(limit)s;

-- name: charts_tip
-- The last run and the last step finished: what the live probe of /ui/metrics compares (two
-- index seeks).
SELECT (SELECT MAX(finished_at) FROM runs WHERE finished_at IS NOT NULL),
       (SELECT MAX(finished_at) FROM checkpoints);
