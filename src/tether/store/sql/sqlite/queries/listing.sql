-- SQLite: the runs list (store/listing.py decides which query serves a listing). Each
-- order is a keyset: the cursor (cur_ts, cur_id) is the key of the last row seen, bound as an
-- infinity on the first page, and the time range is always bound (infinities when open), so
-- both are index ranges. Status, agent, version and the prefix are filters on what the range
-- reads; a `_prefix` query reads only the primary-key range of the prefix, a `_parent`
-- query only the run's children (runs_parent): named with INDEXED BY, as the planner takes
-- runs_created for them (an unbounded time range looks selective to it), analyzed or not,
-- and then reads every run. A `_failed` or `_cancelled` query reads only the runs of that
-- status (its partial index, which the planner takes by itself). The latest updated are the
-- open runs (runs_open) and the finished ones (runs_finished, by finished_at: 0012).

-- fragment: run_filter
WHERE (:status IS NULL OR status = :status)
  AND (:agent IS NULL OR agent = :agent)
  AND (:version IS NULL OR version = :version)
  AND (:prefix IS NULL OR substr(thread_id, 1, length(:prefix)) = :prefix)
  AND created_at >= :since AND created_at < :until

-- name: list_runs_newest
-- Newest first (runs_created, downwards).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (:cur_ts, :cur_id)
ORDER BY created_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_newest_prefix
-- list_runs_newest within the primary-key range of a thread_id prefix.
SELECT {{run_columns}} FROM runs INDEXED BY sqlite_autoindex_runs_1
{{run_filter}}
  AND (created_at, thread_id) < (:cur_ts, :cur_id)
  AND thread_id >= :lo AND thread_id < :hi
ORDER BY created_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_newest_parent
-- list_runs_newest of one run's children (runs_parent).
SELECT {{run_columns}} FROM runs INDEXED BY runs_parent
{{run_filter}}
  AND (created_at, thread_id) < (:cur_ts, :cur_id)
  AND parent_thread_id = :parent
ORDER BY created_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_oldest
-- Oldest first (runs_created, upwards).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (:cur_ts, :cur_id)
ORDER BY created_at ASC, thread_id ASC
LIMIT :limit;

-- name: list_runs_oldest_prefix
-- list_runs_oldest within the primary-key range of a thread_id prefix.
SELECT {{run_columns}} FROM runs INDEXED BY sqlite_autoindex_runs_1
{{run_filter}}
  AND (created_at, thread_id) > (:cur_ts, :cur_id)
  AND thread_id >= :lo AND thread_id < :hi
ORDER BY created_at ASC, thread_id ASC
LIMIT :limit;

-- name: list_runs_oldest_parent
-- list_runs_oldest of one run's children (runs_parent).
SELECT {{run_columns}} FROM runs INDEXED BY runs_parent
{{run_filter}}
  AND (created_at, thread_id) > (:cur_ts, :cur_id)
  AND parent_thread_id = :parent
ORDER BY created_at ASC, thread_id ASC
LIMIT :limit;

-- name: list_runs_newest_failed
-- list_runs_newest of the failed runs (runs_failed, a partial index).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (:cur_ts, :cur_id)
  AND status = 'failed'
ORDER BY created_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_newest_failed_version
-- list_runs_newest_failed of one version, checked in runs_failed's key.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (:cur_ts, :cur_id)
  AND status = 'failed'
  AND version = :version
ORDER BY created_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_oldest_failed
-- list_runs_oldest of the failed runs (runs_failed, a partial index).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (:cur_ts, :cur_id)
  AND status = 'failed'
ORDER BY created_at ASC, thread_id ASC
LIMIT :limit;

-- name: list_runs_oldest_failed_version
-- list_runs_oldest_failed of one version, checked in runs_failed's key.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (:cur_ts, :cur_id)
  AND status = 'failed'
  AND version = :version
ORDER BY created_at ASC, thread_id ASC
LIMIT :limit;

-- name: list_runs_newest_cancelled
-- list_runs_newest of the cancelled runs (runs_cancelled, a partial index).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (:cur_ts, :cur_id)
  AND status = 'cancelled'
ORDER BY created_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_newest_cancelled_version
-- list_runs_newest_cancelled of one version, checked in runs_cancelled's key.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (:cur_ts, :cur_id)
  AND status = 'cancelled'
  AND version = :version
ORDER BY created_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_oldest_cancelled
-- list_runs_oldest of the cancelled runs (runs_cancelled, a partial index).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (:cur_ts, :cur_id)
  AND status = 'cancelled'
ORDER BY created_at ASC, thread_id ASC
LIMIT :limit;

-- name: list_runs_oldest_cancelled_version
-- list_runs_oldest_cancelled of one version, checked in runs_cancelled's key.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (:cur_ts, :cur_id)
  AND status = 'cancelled'
  AND version = :version
ORDER BY created_at ASC, thread_id ASC
LIMIT :limit;

-- name: list_runs_updated
-- Most recently updated first: the open runs (runs_open: few, read whole and sorted) merged
-- with the finished ones walked down runs_finished (finished_at = updated_at once finished:
-- migration 0012), each part at most a page; every run is in exactly one part. Both indexes
-- named: unanalyzed, the planner would walk runs_created for either part.
SELECT * FROM (
    SELECT * FROM (
        SELECT {{run_columns}} FROM runs INDEXED BY runs_open
        {{run_filter}}
          AND (updated_at, thread_id) < (:cur_ts, :cur_id)
          AND status IN ('queued', 'running', 'waiting', 'sleeping')
        ORDER BY updated_at DESC, thread_id DESC
        LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT {{run_columns}} FROM runs INDEXED BY runs_finished
        {{run_filter}}
          AND (finished_at, thread_id) < (:cur_ts, :cur_id)
          AND finished_at IS NOT NULL
        ORDER BY finished_at DESC, thread_id DESC
        LIMIT :limit)
)
ORDER BY updated_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_updated_open
-- list_runs_updated of an open status: the open runs alone (runs_open).
SELECT {{run_columns}} FROM runs INDEXED BY runs_open
{{run_filter}}
  AND (updated_at, thread_id) < (:cur_ts, :cur_id)
  AND status IN ('queued', 'running', 'waiting', 'sleeping')
ORDER BY updated_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_updated_finished
-- list_runs_updated of a terminal status: the finished runs alone (runs_finished).
SELECT {{run_columns}} FROM runs INDEXED BY runs_finished
{{run_filter}}
  AND (finished_at, thread_id) < (:cur_ts, :cur_id)
  AND finished_at IS NOT NULL
ORDER BY finished_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_updated_prefix
-- list_runs_updated within the primary-key range of a thread_id prefix.
SELECT {{run_columns}} FROM runs INDEXED BY sqlite_autoindex_runs_1
{{run_filter}}
  AND (updated_at, thread_id) < (:cur_ts, :cur_id)
  AND thread_id >= :lo AND thread_id < :hi
ORDER BY updated_at DESC, thread_id DESC
LIMIT :limit;

-- name: list_runs_updated_parent
-- list_runs_updated of one run's children (runs_parent).
SELECT {{run_columns}} FROM runs INDEXED BY runs_parent
{{run_filter}}
  AND (updated_at, thread_id) < (:cur_ts, :cur_id)
  AND parent_thread_id = :parent
ORDER BY updated_at DESC, thread_id DESC
LIMIT :limit;
