-- Postgres: the runs list (store/listing.py decides which query serves a listing). Each
-- order is a keyset: the cursor (cur_ts, cur_id) is the key of the last row seen, bound as an
-- infinity on the first page, and the time range is always bound (infinities when open), so
-- both are index ranges. Status, agent, version and the prefix are filters on what the range
-- reads; a `_prefix` query also reads only the primary-key range of the prefix, a `_parent`
-- query only the run's children (runs_parent), a `_failed` or `_cancelled` query only
-- the runs of that status (partial indexes), an `_agent`, `_version` or `_completed` query
-- only that agent's, version's or status's runs (run_keys_agent, run_keys_version: migration
-- 0018; runs_completed: 0017). The newest and oldest of all runs walk run_keys_created (0018).
-- The latest updated are the running runs (runs_open, per version), the resting ones
-- (runs_idle, by idle_at, per status: 0017) and the finished ones (runs_finished, by
-- finished_at: 0012).
-- Every query is a `page` in one order (the fragments newest, oldest, updated) of one
-- variant, given where it is used: its condition (a status a literal: a partial index serves
-- only a query that names its status).

-- fragment: run_filter
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s::text)
  AND (%(version)s::text IS NULL OR version = %(version)s::text)
  AND (%(prefix)s::text IS NULL OR starts_with(thread_id, %(prefix)s::text))
  AND created_at >= %(since)s::float8 AND created_at < %(until)s::float8

-- fragment: page(key, cmp, dir, cond)
-- The runs past the cursor in the order of (key, thread_id) `dir` (`cmp` is < going down,
-- > going up) that pass run_filter and `cond` (none, or `AND ...`), a page of them.
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND ({{key}}, thread_id) {{cmp}} (%(cur_ts)s::float8, %(cur_id)s::text)
  {{cond}}
ORDER BY {{key}} {{dir}}, thread_id {{dir}}
LIMIT %(limit)s

-- fragment: keyed(cmp, dir, cond, last)
-- A `page` in created order read from an index whose key ends (created_at, thread_id, last):
-- `last` as a last sort key changes no order (thread_id is unique), but only that index
-- gives the order without a sort, so the planner takes it whatever share of the runs it
-- estimates the filter keeps (a walk of every run in created order would read every run
-- that does not match, newest first, before the first that does).
SELECT {{run_columns}} FROM runs
{{run_filter}}
  AND (created_at, thread_id) {{cmp}} (%(cur_ts)s::float8, %(cur_id)s::text)
  {{cond}}
ORDER BY created_at {{dir}}, thread_id {{dir}}, {{last}} {{dir}}
LIMIT %(limit)s

-- fragment: keys_page(cmp, dir, cond, last)
-- A page in created order read from run_keys (migration 0018: created_at, thread_id), or
-- from its key of an agent or a version (`cond` names it: run_keys_agent, run_keys_version,
-- whose keys end (created_at, thread_id, `last`): only that index gives this order without
-- a sort, as in `keyed`), each key's run read by primary key and filtered as run_filter
-- filters. `last` is thread_id when no such index is meant (a repeated sort key is dropped).
SELECT r.* FROM run_keys k CROSS JOIN LATERAL (
    SELECT {{run_columns}} FROM runs
    WHERE runs.thread_id = k.thread_id
      AND (%(status)s::text IS NULL OR status = %(status)s::text)
      AND (%(prefix)s::text IS NULL OR starts_with(thread_id, %(prefix)s::text))
) AS r
WHERE (%(agent)s::text IS NULL OR k.agent = %(agent)s::text)
  AND (%(version)s::text IS NULL OR k.version = %(version)s::text)
  AND k.created_at >= %(since)s::float8 AND k.created_at < %(until)s::float8
  AND (k.created_at, k.thread_id) {{cmp}} (%(cur_ts)s::float8, %(cur_id)s::text)
  {{cond}}
ORDER BY k.created_at {{dir}}, k.thread_id {{dir}}, k.{{last}} {{dir}}
LIMIT %(limit)s

-- fragment: newest(cond)
{{page(created_at, <, DESC, {{cond}})}}

-- fragment: oldest(cond)
{{page(created_at, >, ASC, {{cond}})}}

-- fragment: updated(cond)
{{page(updated_at, <, DESC, {{cond}})}}

-- fragment: running_part
-- The running runs past the cursor by updated_at, all of them (they are what workers lease):
-- per version that has open runs (open_version_walk, which must precede it), that version's
-- range of runs_open for 'running'; never the resting runs, however many are parked.
SELECT p.* FROM v CROSS JOIN LATERAL (
    SELECT {{run_columns}} FROM runs
    {{run_filter}}
      AND version = v.version AND status = 'running'
      AND status IN ('queued', 'running', 'waiting', 'sleeping')
      AND (updated_at, thread_id) < (%(cur_ts)s::float8, %(cur_id)s::text)
) AS p
WHERE v.version IS NOT NULL
ORDER BY p.updated_at DESC, p.thread_id DESC
LIMIT %(limit)s

-- fragment: idle_part(status)
-- A page of the runs resting in `status` (a literal, or the bound status), down runs_idle.
{{page(idle_at, <, DESC, AND status = {{status}} AND idle_at IS NOT NULL)}}

-- fragment: finished_part
{{page(finished_at, <, DESC, AND finished_at IS NOT NULL)}}

-- name: list_runs_newest
-- Newest first (run_keys_created, downwards).
{{keys_page(<, DESC, , thread_id)}}

-- name: list_runs_newest_prefix
-- list_runs_newest within the primary-key range of a thread_id prefix.
{{newest(AND thread_id >= %(lo)s::text AND thread_id < %(hi)s::text)}}

-- name: list_runs_newest_parent
-- list_runs_newest of one run's children (runs_parent).
{{newest(AND parent_thread_id = %(parent)s::text)}}

-- name: list_runs_oldest
-- Oldest first (run_keys_created, upwards).
{{keys_page(>, ASC, , thread_id)}}

-- name: list_runs_oldest_prefix
-- list_runs_oldest within the primary-key range of a thread_id prefix.
{{oldest(AND thread_id >= %(lo)s::text AND thread_id < %(hi)s::text)}}

-- name: list_runs_oldest_parent
-- list_runs_oldest of one run's children (runs_parent).
{{oldest(AND parent_thread_id = %(parent)s::text)}}

-- name: list_runs_newest_failed
-- list_runs_newest of the failed runs (runs_failed, a partial index).
{{newest(AND status = 'failed')}}

-- name: list_runs_newest_failed_version
-- list_runs_newest_failed of one version, checked in runs_failed's key.
{{newest(AND status = 'failed' AND version = %(version)s::text)}}

-- name: list_runs_oldest_failed
-- list_runs_oldest of the failed runs (runs_failed, a partial index).
{{oldest(AND status = 'failed')}}

-- name: list_runs_oldest_failed_version
-- list_runs_oldest_failed of one version, checked in runs_failed's key.
{{oldest(AND status = 'failed' AND version = %(version)s::text)}}

-- name: list_runs_newest_cancelled
-- list_runs_newest of the cancelled runs (runs_cancelled, a partial index).
{{newest(AND status = 'cancelled')}}

-- name: list_runs_newest_cancelled_version
-- list_runs_newest_cancelled of one version, checked in runs_cancelled's key.
{{newest(AND status = 'cancelled' AND version = %(version)s::text)}}

-- name: list_runs_oldest_cancelled
-- list_runs_oldest of the cancelled runs (runs_cancelled, a partial index).
{{oldest(AND status = 'cancelled')}}

-- name: list_runs_oldest_cancelled_version
-- list_runs_oldest_cancelled of one version, checked in runs_cancelled's key.
{{oldest(AND status = 'cancelled' AND version = %(version)s::text)}}

-- name: list_runs_newest_completed
-- list_runs_newest of the completed runs (runs_completed, a partial index: keyed).
{{keyed(<, DESC, AND status = 'completed', version)}}

-- name: list_runs_oldest_completed
-- list_runs_oldest of the completed runs (runs_completed, a partial index: keyed).
{{keyed(>, ASC, AND status = 'completed', version)}}

-- name: list_runs_newest_agent
-- list_runs_newest of one agent (run_keys_agent; a version is checked in its key).
{{keys_page(<, DESC, AND k.agent = %(agent)s::text, version)}}

-- name: list_runs_oldest_agent
-- list_runs_oldest of one agent (run_keys_agent).
{{keys_page(>, ASC, AND k.agent = %(agent)s::text, version)}}

-- name: list_runs_newest_version
-- list_runs_newest of one version (run_keys_version; an agent is checked in its key).
{{keys_page(<, DESC, AND k.version = %(version)s::text, agent)}}

-- name: list_runs_oldest_version
-- list_runs_oldest of one version (run_keys_version).
{{keys_page(>, ASC, AND k.version = %(version)s::text, agent)}}

-- fragment: open_page(cmp, dir)
-- A page of one open status (bound: %(status)s is one of them) in created order: per version
-- that has open runs (a skip scan of runs_open, one seek each), that version's range of
-- runs_open (version, status, created_at, thread_id: migration 0016) past the cursor, a page
-- of it, then the pages merged; never every open run of the status, however many are
-- parked. The literal status list makes the partial index usable for a bound status.
{{open_version_walk}}
SELECT p.* FROM v CROSS JOIN LATERAL (
    SELECT {{run_columns}} FROM runs
    {{run_filter}}
      AND version = v.version AND status = %(status)s::text
      AND status IN ('queued', 'running', 'waiting', 'sleeping')
      AND (created_at, thread_id) {{cmp}} (%(cur_ts)s::float8, %(cur_id)s::text)
    ORDER BY created_at {{dir}}, thread_id {{dir}}
    LIMIT %(limit)s
) AS p
WHERE v.version IS NOT NULL
ORDER BY p.created_at {{dir}}, p.thread_id {{dir}}
LIMIT %(limit)s

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
{{open_version_walk}}
SELECT * FROM (
    ({{running_part}})
    UNION ALL
    ({{idle_part('queued')}})
    UNION ALL
    ({{idle_part('waiting')}})
    UNION ALL
    ({{idle_part('sleeping')}})
    UNION ALL
    ({{finished_part}})
) AS r
ORDER BY updated_at DESC, thread_id DESC
LIMIT %(limit)s;

-- name: list_runs_updated_running
-- list_runs_updated of the running runs alone (running_part).
{{open_version_walk}}
{{running_part}}

-- name: list_runs_updated_idle
-- list_runs_updated of a resting status (queued, waiting or sleeping): a page of runs_idle.
{{idle_part(%(status)s::text)}}

-- name: list_runs_updated_finished
-- list_runs_updated of a terminal status: the finished runs alone (runs_finished).
{{finished_part}}

-- name: list_runs_updated_prefix
-- list_runs_updated within the primary-key range of a thread_id prefix.
{{updated(AND thread_id >= %(lo)s::text AND thread_id < %(hi)s::text)}}

-- name: list_runs_updated_parent
-- list_runs_updated of one run's children (runs_parent).
{{updated(AND parent_thread_id = %(parent)s::text)}}

-- name: code_point_order
-- Whether the database's default collation (thread_id's) orders text by code point, as C,
-- POSIX and C.UTF-8 do: then a thread_id prefix is one primary-key range. Any linguistic
-- collation fails one of the two (it ignores the hyphen, or puts 'a' before 'B').
SELECT 'a-c' < 'ab' AND 'B' < 'a';
