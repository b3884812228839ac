-- Named queries of tether.langgraph.TetherSaver on Postgres (tables of migrations 0005, 0009),
-- psycopg placeholders. Key lists are parallel arrays read with unnest, so that a statement
-- has a fixed text whatever the number of keys. Each statement runs alone in autocommit
-- unless said otherwise: one statement is one atomic write.

-- name: schema_table
SELECT to_regclass('schema_version') IS NOT NULL;

-- name: schema_applied
SELECT coalesce(max(version), 0) FROM schema_version;

-- name: put_checkpoint
-- A checkpoint and the blobs of the channel versions it introduces, atomically. A blob whose
-- version is stored already is kept (the first value stored for a version wins). A delta blob
-- (base_version given) whose base is missing (the thread was pruned or deleted meanwhile)
-- makes the statement write no checkpoint; it returns how many such deltas there were, and the
-- saver puts again with full values.
WITH b AS (
    SELECT * FROM unnest(%(channels)s::text[], %(versions)s::text[], %(types)s::text[],
                         %(blobs)s::bytea[], %(bases)s::text[])
           AS b (channel, version, type, blob, base_version)
), missing AS (
    SELECT count(*) AS n FROM b
    WHERE b.base_version IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM lg_blobs AS o
        WHERE o.thread_id = %(thread_id)s AND o.checkpoint_ns = %(ns)s
          AND o.channel = b.channel AND o.version = b.base_version)
), blobs AS (
    INSERT INTO lg_blobs (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
    SELECT %(thread_id)s, %(ns)s, b.channel, b.version, b.type, b.blob, b.base_version
    FROM b, missing WHERE missing.n = 0
    ON CONFLICT DO NOTHING
), ckpt AS (
    INSERT INTO lg_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                                run_id, type, checkpoint, metadata)
    SELECT %(thread_id)s, %(ns)s, %(checkpoint_id)s, %(parent_id)s, %(run_id)s, %(type)s,
           %(checkpoint)s, %(metadata)s::jsonb
    FROM missing WHERE missing.n = 0
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = excluded.parent_checkpoint_id, run_id = excluded.run_id,
        type = excluded.type, checkpoint = excluded.checkpoint, metadata = excluded.metadata
)
SELECT n FROM missing;

-- fragment: commit_mode
-- The statement's own transaction commits with synchronous_commit = %(commit)s ('on' or 'off'):
-- set_config(..., true) holds until that commit. 'off' returns before the WAL flush; the next
-- synchronous commit (a checkpoint's) flushes the WAL up to itself, these writes included.
(SELECT set_config('synchronous_commit', %(commit)s, true)) AS commit_mode

-- name: insert_writes
-- A task's writes, packed in one row (migration 0009), if the task has none stored yet: a row
-- back when stored. No row: the task has writes stored already, and the saver merges under
-- the row's lock (lock_task_writes, update_task_writes), so that writes stay deduplicated by
-- (task_id, idx).
INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, writes)
SELECT %(thread_id)s, %(ns)s, %(checkpoint_id)s, %(task_id)s, %(task_path)s, %(writes)s
FROM {{commit_mode}}
ON CONFLICT DO NOTHING
RETURNING 1;

-- name: set_commit_mode
-- The same as commit_mode, for a transaction of several statements.
SELECT set_config('synchronous_commit', %(commit)s, true);

-- name: lock_task_writes
SELECT task_path, writes FROM lg_writes
WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s
  AND checkpoint_id = %(checkpoint_id)s AND task_id = %(task_id)s
FOR UPDATE;

-- name: update_task_writes
UPDATE lg_writes SET task_path = %(task_path)s, writes = %(writes)s
WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s
  AND checkpoint_id = %(checkpoint_id)s AND task_id = %(task_id)s;

-- fragment: checkpoint_columns
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
       metadata::text
FROM lg_checkpoints

-- fragment: metadata_filter
-- %(filter)s is a JSON object (or NULL: no filter); a checkpoint matches when its metadata has
-- each key with an equal value (jsonb equality, not containment).
AND (%(filter)s::jsonb IS NULL OR NOT EXISTS (
    SELECT 1 FROM jsonb_each(%(filter)s::jsonb) AS f
    WHERE lg_checkpoints.metadata -> f.key IS DISTINCT FROM f.value))

-- name: get_checkpoint
{{checkpoint_columns}}
WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s
  AND checkpoint_id = %(checkpoint_id)s;

-- name: latest_checkpoint
-- Checkpoint ids grow with time: the greatest is the newest.
{{checkpoint_columns}}
WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s
ORDER BY checkpoint_id DESC LIMIT 1;

-- name: list_in_namespace
-- Newest first, strictly before %(before)s when given; LIMIT NULL is no limit.
{{checkpoint_columns}}
WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s
  AND (%(checkpoint_id)s::text IS NULL OR checkpoint_id = %(checkpoint_id)s)
  AND (%(before)s::text IS NULL OR checkpoint_id < %(before)s)
{{metadata_filter}}
ORDER BY checkpoint_id DESC LIMIT %(limit)s;

-- name: list_in_thread
{{checkpoint_columns}}
WHERE thread_id = %(thread_id)s
  AND (%(checkpoint_id)s::text IS NULL OR checkpoint_id = %(checkpoint_id)s)
  AND (%(before)s::text IS NULL OR checkpoint_id < %(before)s)
{{metadata_filter}}
ORDER BY checkpoint_id DESC LIMIT %(limit)s;

-- name: list_all
{{checkpoint_columns}}
WHERE (%(before)s::text IS NULL OR checkpoint_id < %(before)s)
{{metadata_filter}}
ORDER BY checkpoint_id DESC LIMIT %(limit)s;

-- name: writes_of
-- The pending writes of the keyed checkpoints, a row per task, in the order LangGraph applies
-- them (writes_sort_key: task_path, task_id, then idx: the order packed in a row).
SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.writes
FROM unnest(%(threads)s::text[], %(nss)s::text[], %(ids)s::text[]) AS k (thread_id, ns, id)
JOIN lg_writes AS w
  ON w.thread_id = k.thread_id AND w.checkpoint_ns = k.ns AND w.checkpoint_id = k.id
ORDER BY w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_path, w.task_id;

-- name: blobs_of
-- The keyed blobs and, for a delta, every row of its chain down to the full value it extends.
WITH RECURSIVE need (thread_id, checkpoint_ns, channel, version) AS (
    SELECT * FROM unnest(%(threads)s::text[], %(nss)s::text[], %(channels)s::text[],
                         %(versions)s::text[])
    UNION
    SELECT b.thread_id, b.checkpoint_ns, b.channel, b.base_version
    FROM need AS n
    JOIN lg_blobs AS b
      ON b.thread_id = n.thread_id AND b.checkpoint_ns = n.checkpoint_ns
     AND b.channel = n.channel AND b.version = n.version
    WHERE b.base_version IS NOT NULL
)
SELECT b.thread_id, b.checkpoint_ns, b.channel, b.version, b.type, b.blob, b.base_version
FROM need AS n
JOIN lg_blobs AS b
  ON b.thread_id = n.thread_id AND b.checkpoint_ns = n.checkpoint_ns
 AND b.channel = n.channel AND b.version = n.version;

-- name: delete_thread
-- One statement: the thread's rows go together or not at all.
WITH c AS (DELETE FROM lg_checkpoints WHERE thread_id = %(thread_id)s),
     w AS (DELETE FROM lg_writes WHERE thread_id = %(thread_id)s)
DELETE FROM lg_blobs WHERE thread_id = %(thread_id)s;

-- name: lock_threads
-- Taken first in the transactions of prune and delete_for_runs: two of them on one thread
-- run one after the other (their blob collection reads what the other deletes).
SELECT pg_advisory_xact_lock(hashtextextended('tether.langgraph:' || t, 0))
FROM (SELECT DISTINCT unnest(%(thread_ids)s::text[]) AS t ORDER BY 1) AS s;

-- name: run_namespaces
-- The (thread, namespace) pairs holding checkpoints of the runs in %(run_ids)s.
SELECT DISTINCT thread_id, checkpoint_ns FROM lg_checkpoints
WHERE run_id = ANY(%(run_ids)s::text[]);

-- name: delete_run_writes
DELETE FROM lg_writes AS w
USING lg_checkpoints AS c
WHERE c.run_id = ANY(%(run_ids)s::text[])
  AND w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
  AND w.checkpoint_id = c.checkpoint_id;

-- name: delete_run_checkpoints
DELETE FROM lg_checkpoints WHERE run_id = ANY(%(run_ids)s::text[]);

-- name: delete_older_checkpoints
-- keep_latest: every checkpoint of the thread but the newest of each namespace.
DELETE FROM lg_checkpoints AS d
WHERE d.thread_id = %(thread_id)s
  AND d.checkpoint_id < (SELECT max(c.checkpoint_id) FROM lg_checkpoints AS c
                         WHERE c.thread_id = d.thread_id AND c.checkpoint_ns = d.checkpoint_ns);

-- name: delete_orphan_writes
-- Writes whose checkpoint is gone.
DELETE FROM lg_writes AS w
WHERE w.thread_id = %(thread_id)s
  AND NOT EXISTS (SELECT 1 FROM lg_checkpoints AS c
                  WHERE c.thread_id = w.thread_id AND c.checkpoint_ns = w.checkpoint_ns
                    AND c.checkpoint_id = w.checkpoint_id);

-- name: blob_namespaces
SELECT DISTINCT checkpoint_ns FROM lg_blobs WHERE thread_id = %(thread_id)s;

-- name: namespace_checkpoints
-- The bodies of a namespace's checkpoints (their channel versions say which blobs are live).
SELECT type, checkpoint FROM lg_checkpoints
WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s;

-- name: namespace_blob_keys
SELECT channel, version, base_version FROM lg_blobs
WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s;

-- name: delete_blobs
DELETE FROM lg_blobs AS b
USING unnest(%(channels)s::text[], %(versions)s::text[]) AS k (channel, version)
WHERE b.thread_id = %(thread_id)s AND b.checkpoint_ns = %(ns)s
  AND b.channel = k.channel AND b.version = k.version;

-- name: copy_thread
-- copy_thread, in one statement: rows the target already has are kept.
WITH c AS (
    INSERT INTO lg_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                                run_id, type, checkpoint, metadata)
    SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
           checkpoint, metadata
    FROM lg_checkpoints WHERE thread_id = %(source)s
    ON CONFLICT DO NOTHING
), b AS (
    INSERT INTO lg_blobs (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
    SELECT %(target)s, checkpoint_ns, channel, version, type, blob, base_version
    FROM lg_blobs WHERE thread_id = %(source)s
    ON CONFLICT DO NOTHING
)
INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, writes)
SELECT %(target)s, checkpoint_ns, checkpoint_id, task_id, task_path, writes
FROM lg_writes WHERE thread_id = %(source)s
ON CONFLICT DO NOTHING;
