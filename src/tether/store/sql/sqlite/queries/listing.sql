-- SQLite: the runs list (store/listing.py decides which query serves a listing). Each
-- order is a keyset: the cursor (cur_ts, cur_id) is the key of the last row seen, bound as an
-- infinity on the first page, and the time range is always bound (infinities when open), so
-- both are index ranges. Status, agent, version and the prefix are filters on what the range
-- reads; a `_prefix` query reads only the primary-key range of the prefix, a `_parent`
-- query only the run's children (runs_parent): named with INDEXED BY, as the planner takes
-- runs_created for them (an unbounded time range looks selective to it), analyzed or not,
-- and then reads every run. A `_failed` or `_cancelled` query reads only the runs of that
-- status (its partial index, named: with a version, the planner would take runs_version).
-- An `_agent`, `_version` or `_completed` query reads only that agent's, version's or
-- status's runs (runs_agent, runs_version, runs_completed: migration 0017, named). The latest updated are the running
-- runs (runs_open, per version), the resting ones (runs_idle, by idle_at, per status: 0017)
-- and the finished ones (runs_finished, by finished_at: 0012).
-- Every query is a `page` in one order (the fragments newest, oldest, updated) of one
-- variant, given where it is used: the table with its index hint, and the condition (a
-- status a literal: a partial index serves only a query that names its status).

-- fragment: run_filter
WHERE (:status IS NULL OR status = :status)
  AND (:agent IS NULL OR agent = :agent)
  AND (:version IS NULL OR version = :version)
  AND (:prefix IS NULL OR substr(thread_id, 1, length(:prefix)) = :prefix)
  AND created_at >= :since AND created_at < :until

-- fragment: page(source, key, cmp, dir, cond)
-- The runs of `source` past the cursor in the order of (key, thread_id) `dir` (`cmp` is <
-- going down, > going up) that pass run_filter and `cond` (none, or `AND ...`), a page of them.
SELECT {{run_columns}} FROM {{source}}
{{run_filter}}
  AND ({{key}}, thread_id) {{cmp}} (:cur_ts, :cur_id)
  {{cond}}
ORDER BY {{key}} {{dir}}, thread_id {{dir}}
LIMIT :limit

-- fragment: newest(source, cond)
{{page({{source}}, created_at, <, DESC, {{cond}})}}

-- fragment: oldest(source, cond)
{{page({{source}}, created_at, >, ASC, {{cond}})}}

-- fragment: updated(source, cond)
{{page({{source}}, updated_at, <, DESC, {{cond}})}}

-- fragment: running_part
-- The running runs past the cursor by updated_at, all of them (they are what workers lease):
-- per version that has open runs (open_versions, which must precede it), that version's
-- range of runs_open for 'running'; never the resting runs, however many are parked.
SELECT {{run_columns}} FROM runs INDEXED BY runs_open
{{run_filter}}
  AND version IN (SELECT version FROM v WHERE version IS NOT NULL) AND status = 'running'
  AND status IN ('queued', 'running', 'waiting', 'sleeping')
  AND (updated_at, thread_id) < (:cur_ts, :cur_id)
ORDER BY updated_at DESC, thread_id DESC
LIMIT :limit

-- fragment: idle_part(status)
-- A page of the runs resting in `status` (a literal, or the bound status), down runs_idle.
{{page(runs INDEXED BY runs_idle, idle_at, <, DESC, AND status = {{status}} AND idle_at IS NOT NULL)}}

-- fragment: finished_part
{{page(runs INDEXED BY runs_finished, finished_at, <, DESC, AND finished_at IS NOT NULL)}}

-- name: list_runs_newest
-- Newest first (runs_created, downwards).
{{newest(runs, )}}

-- name: list_runs_newest_prefix
-- list_runs_newest within the primary-key range of a thread_id prefix.
{{newest(runs INDEXED BY sqlite_autoindex_runs_1, AND thread_id >= :lo AND thread_id < :hi)}}

-- name: list_runs_newest_parent
-- list_runs_newest of one run's children (runs_parent).
{{newest(runs INDEXED BY runs_parent, AND parent_thread_id = :parent)}}

-- name: list_runs_oldest
-- Oldest first (runs_created, upwards).
{{oldest(runs, )}}

-- name: list_runs_oldest_prefix
-- list_runs_oldest within the primary-key range of a thread_id prefix.
{{oldest(runs INDEXED BY sqlite_autoindex_runs_1, AND thread_id >= :lo AND thread_id < :hi)}}

-- name: list_runs_oldest_parent
-- list_runs_oldest of one run's children (runs_parent).
{{oldest(runs INDEXED BY runs_parent, AND parent_thread_id = :parent)}}

-- name: list_runs_newest_failed
-- list_runs_newest of the failed runs (runs_failed, a partial index).
{{newest(runs INDEXED BY runs_failed, AND status = 'failed')}}

-- name: list_runs_newest_failed_version
-- list_runs_newest_failed of one version, checked in runs_failed's key.
{{newest(runs INDEXED BY runs_failed, AND status = 'failed' AND version = :version)}}

-- name: list_runs_oldest_failed
-- list_runs_oldest of the failed runs (runs_failed, a partial index).
{{oldest(runs INDEXED BY runs_failed, AND status = 'failed')}}

-- name: list_runs_oldest_failed_version
-- list_runs_oldest_failed of one version, checked in runs_failed's key.
{{oldest(runs INDEXED BY runs_failed, AND status = 'failed' AND version = :version)}}

-- name: list_runs_newest_cancelled
-- list_runs_newest of the cancelled runs (runs_cancelled, a partial index).
{{newest(runs INDEXED BY runs_cancelled, AND status = 'cancelled')}}

-- name: list_runs_newest_cancelled_version
-- list_runs_newest_cancelled of one version, checked in runs_cancelled's key.
{{newest(runs INDEXED BY runs_cancelled, AND status = 'cancelled' AND version = :version)}}

-- name: list_runs_oldest_cancelled
-- list_runs_oldest of the cancelled runs (runs_cancelled, a partial index).
{{oldest(runs INDEXED BY runs_cancelled, AND status = 'cancelled')}}

-- name: list_runs_oldest_cancelled_version
-- list_runs_oldest_cancelled of one version, checked in runs_cancelled's key.
{{oldest(runs INDEXED BY runs_cancelled, AND status = 'cancelled' AND version = :version)}}

-- name: list_runs_newest_completed
-- list_runs_newest of the completed runs (runs_completed, a partial index).
{{newest(runs INDEXED BY runs_completed, AND status = 'completed')}}

-- name: list_runs_oldest_completed
-- list_runs_oldest of the completed runs (runs_completed, a partial index).
{{oldest(runs INDEXED BY runs_completed, AND status = 'completed')}}

-- name: list_runs_newest_agent
-- list_runs_newest of one agent (runs_agent; a version is checked in its key).
{{newest(runs INDEXED BY runs_agent, AND agent = :agent)}}

-- name: list_runs_oldest_agent
-- list_runs_oldest of one agent (runs_agent).
{{oldest(runs INDEXED BY runs_agent, AND agent = :agent)}}

-- name: list_runs_newest_version
-- list_runs_newest of one version (runs_version).
{{newest(runs INDEXED BY runs_version, AND version = :version)}}

-- name: list_runs_oldest_version
-- list_runs_oldest of one version (runs_version).
{{oldest(runs INDEXED BY runs_version, AND version = :version)}}

-- fragment: open_page(cmp, dir)
-- A page of one open status (bound: :status is one of them) in created order: per version
-- that has open runs (a skip scan of runs_open, one seek each), that version's range of
-- runs_open (version, status, created_at, thread_id: migration 0016) past the cursor, a page
-- of it (a correlated IN: SQLite has no LATERAL), then the pages merged; never every open
-- run of the status, however many are parked.
{{open_versions}}
SELECT {{run_columns}} FROM (SELECT version AS ver FROM v) AS o, runs  -- o: runs has a version too
WHERE o.ver IS NOT NULL AND runs.rowid IN (
    SELECT rowid FROM runs INDEXED BY runs_open
    {{run_filter}}
      AND version = o.ver AND status = :status
      AND status IN ('queued', 'running', 'waiting', 'sleeping')
      AND (created_at, thread_id) {{cmp}} (:cur_ts, :cur_id)
    ORDER BY created_at {{dir}}, thread_id {{dir}}
    LIMIT :limit
)
ORDER BY created_at {{dir}}, thread_id {{dir}}
LIMIT :limit

-- name: list_runs_newest_open
-- list_runs_newest of an open status (open_page).
{{open_page(<, DESC)}}

-- name: list_runs_oldest_open
-- list_runs_oldest of an open status (open_page).
{{open_page(>, ASC)}}

-- name: list_runs_updated
-- Most recently updated first: the running runs (running_part: all of them, sorted), a page
-- of each resting status down runs_idle (idle_at = updated_at while queued, waiting or
-- sleeping: migration 0017) and a page of the finished ones down runs_finished
-- (finished_at = updated_at once finished: 0012), merged; every run is in exactly one part.
-- Every index named: unanalyzed, the planner would walk runs_created for a part.
{{open_versions}}
SELECT * FROM (
    SELECT * FROM ({{running_part}})
    UNION ALL
    SELECT * FROM ({{idle_part('queued')}})
    UNION ALL
    SELECT * FROM ({{idle_part('waiting')}})
    UNION ALL
    SELECT * FROM ({{idle_part('sleeping')}})
    UNION ALL
    SELECT * FROM ({{finished_part}})
)
ORDER BY updated_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_updated_running
-- list_runs_updated of the running runs alone (running_part).
{{open_versions}}
{{running_part}}

-- name: list_runs_updated_idle
-- list_runs_updated of a resting status (queued, waiting or sleeping): a page of runs_idle.
{{idle_part(:status)}}

-- name: list_runs_updated_finished
-- list_runs_updated of a terminal status: the finished runs alone (runs_finished).
{{finished_part}}

-- name: list_runs_updated_prefix
-- list_runs_updated within the primary-key range of a thread_id prefix.
{{updated(runs INDEXED BY sqlite_autoindex_runs_1, AND thread_id >= :lo AND thread_id < :hi)}}

-- name: list_runs_updated_parent
-- list_runs_updated of one run's children (runs_parent).
{{updated(runs INDEXED BY runs_parent, AND parent_thread_id = :parent)}}
