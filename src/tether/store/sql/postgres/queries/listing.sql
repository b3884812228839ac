-- Postgres: the runs list (store/listing.py decides which query serves a listing). Each
-- order is a keyset: the cursor (cur_ts, cur_id) is the key of the last row seen, bound as an
-- infinity on the first page, and the time range is always bound (infinities when open), so
-- both are index ranges. Status, agent, version and the prefix are filters on what the range
-- reads; a `_prefix` query also reads only the primary-key range of the prefix, a `_parent`
-- query only the run's children (runs_parent), a `_failed` or `_cancelled` query only
-- the runs of that status (partial indexes). The latest updated are the open runs
-- (runs_open) and the finished ones (runs_finished, by finished_at: migration 0012).

-- fragment: run_filter
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s::text)
  AND (%(version)s::text IS NULL OR version = %(version)s::text)
  AND (%(prefix)s::text IS NULL OR starts_with(thread_id, %(prefix)s::text))
  AND created_at >= %(since)s::float8 AND created_at < %(until)s::float8

-- name: list_runs_newest
-- Newest first (runs_created, downwards).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
ORDER BY created_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_newest_prefix
-- list_runs_newest within the primary-key range of a thread_id prefix.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND thread_id >= %(lo)s::text AND thread_id < %(hi)s::text
ORDER BY created_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_newest_parent
-- list_runs_newest of one run's children (runs_parent).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND parent_thread_id = %(parent)s::text
ORDER BY created_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_oldest
-- Oldest first (runs_created, upwards).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (%(cur_ts)s::float8, %(cur_id)s::text)
ORDER BY created_at ASC, thread_id ASC
LIMIT %(limit)s;

-- name: list_runs_oldest_prefix
-- list_runs_oldest within the primary-key range of a thread_id prefix.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (%(cur_ts)s::float8, %(cur_id)s::text)
  AND thread_id >= %(lo)s::text AND thread_id < %(hi)s::text
ORDER BY created_at ASC, thread_id ASC
LIMIT %(limit)s;

-- name: list_runs_oldest_parent
-- list_runs_oldest of one run's children (runs_parent).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (%(cur_ts)s::float8, %(cur_id)s::text)
  AND parent_thread_id = %(parent)s::text
ORDER BY created_at ASC, thread_id ASC
LIMIT %(limit)s;

-- name: list_runs_newest_failed
-- list_runs_newest of the failed runs (runs_failed, a partial index).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND status = 'failed'
ORDER BY created_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_newest_failed_version
-- list_runs_newest_failed of one version, checked in runs_failed's key.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND status = 'failed'
  AND version = %(version)s::text
ORDER BY created_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_oldest_failed
-- list_runs_oldest of the failed runs (runs_failed, a partial index).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (%(cur_ts)s::float8, %(cur_id)s::text)
  AND status = 'failed'
ORDER BY created_at ASC, thread_id ASC
LIMIT %(limit)s;

-- name: list_runs_oldest_failed_version
-- list_runs_oldest_failed of one version, checked in runs_failed's key.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (%(cur_ts)s::float8, %(cur_id)s::text)
  AND status = 'failed'
  AND version = %(version)s::text
ORDER BY created_at ASC, thread_id ASC
LIMIT %(limit)s;

-- name: list_runs_newest_cancelled
-- list_runs_newest of the cancelled runs (runs_cancelled, a partial index).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND status = 'cancelled'
ORDER BY created_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_newest_cancelled_version
-- list_runs_newest_cancelled of one version, checked in runs_cancelled's key.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND status = 'cancelled'
  AND version = %(version)s::text
ORDER BY created_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_oldest_cancelled
-- list_runs_oldest of the cancelled runs (runs_cancelled, a partial index).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (%(cur_ts)s::float8, %(cur_id)s::text)
  AND status = 'cancelled'
ORDER BY created_at ASC, thread_id ASC
LIMIT %(limit)s;

-- name: list_runs_oldest_cancelled_version
-- list_runs_oldest_cancelled of one version, checked in runs_cancelled's key.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) > (%(cur_ts)s::float8, %(cur_id)s::text)
  AND status = 'cancelled'
  AND version = %(version)s::text
ORDER BY created_at ASC, thread_id ASC
LIMIT %(limit)s;

-- name: list_runs_updated
-- Most recently updated first: the open runs (runs_open: few, read whole and sorted) merged
-- with the finished ones walked down runs_finished (finished_at = updated_at once finished:
-- migration 0012), each part at most a page; every run is in exactly one part.
SELECT * FROM (
    (SELECT {{run_columns}} FROM runs
     {{run_filter}}
       AND (updated_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
       AND status IN ('queued', 'running', 'waiting', 'sleeping')
     ORDER BY updated_at DESC, thread_id DESC
     LIMIT %(limit)s)
    UNION ALL
    (SELECT {{run_columns}} FROM runs
     {{run_filter}}
       AND (finished_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
       AND finished_at IS NOT NULL
     ORDER BY finished_at DESC, thread_id DESC
     LIMIT %(limit)s)
) AS r
ORDER BY updated_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_updated_open
-- list_runs_updated of an open status: the open runs alone (runs_open).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (updated_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND status IN ('queued', 'running', 'waiting', 'sleeping')
ORDER BY updated_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_updated_finished
-- list_runs_updated of a terminal status: the finished runs alone (runs_finished).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (finished_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND finished_at IS NOT NULL
ORDER BY finished_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_updated_prefix
-- list_runs_updated within the primary-key range of a thread_id prefix.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (updated_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND thread_id >= %(lo)s::text AND thread_id < %(hi)s::text
ORDER BY updated_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_updated_parent
-- list_runs_updated of one run's children (runs_parent).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (updated_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
  AND parent_thread_id = %(parent)s::text
ORDER BY updated_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: code_point_order
-- Whether the database's default collation (thread_id's) orders text by code point, as C,
-- POSIX and C.UTF-8 do: then a thread_id prefix is one primary-key range. Any linguistic
-- collation fails one of the two (it ignores the hyphen, or puts 'a' before 'B').
SELECT 'a-c' < 'ab' AND 'B' < 'a';
