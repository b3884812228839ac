-- Named queries of tether.langgraph.TetherSaver on SQLite (tables of migration 0005).
-- Keys lists are JSON arrays bound as one text parameter and read with json_each, so that a
-- statement has a fixed text whatever the number of keys.

-- name: insert_checkpoint
-- Writes a checkpoint; putting the same id again replaces its body and metadata (LangGraph
-- puts a checkpoint once, but `update_state` may rewrite one).
INSERT INTO lg_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                            run_id, type, checkpoint, metadata)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_checkpoint_id = excluded.parent_checkpoint_id, run_id = excluded.run_id,
    type = excluded.type, checkpoint = excluded.checkpoint, metadata = excluded.metadata;

-- name: insert_blob
-- A channel version is written once: the first value stored for it wins.
INSERT INTO lg_blobs (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING;

-- name: blob_exists
SELECT 1 FROM lg_blobs
WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ?;

-- name: insert_write
-- Pending writes are deduplicated by (task_id, idx): a task's write that is stored stays.
INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
                       blob, task_path)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING;

-- name: upsert_write
-- Special writes (ERROR, INTERRUPT, ...: negative idx) replace what the task stored before.
INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
                       blob, task_path)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = excluded.channel, type = excluded.type, blob = excluded.blob,
    task_path = excluded.task_path;

-- fragment: checkpoint_columns
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
       metadata
FROM lg_checkpoints

-- fragment: metadata_filter
-- :filter is a JSON object (or NULL: no filter); a checkpoint matches when its metadata has
-- each key with an equal value (same JSON type; objects and arrays compared as the canonical
-- text both sides are written in: sorted keys, no spaces).
AND (:filter IS NULL OR NOT EXISTS (
    SELECT 1 FROM json_each(:filter) AS f
    WHERE NOT EXISTS (
        SELECT 1 FROM json_each(lg_checkpoints.metadata) AS m
        WHERE m.key = f.key AND m.type = f.type AND m.value IS f.value)))

-- name: get_checkpoint
{{checkpoint_columns}}
WHERE thread_id = :thread_id AND checkpoint_ns = :ns AND checkpoint_id = :checkpoint_id;

-- name: latest_checkpoint
-- Checkpoint ids grow with time: the greatest is the newest.
{{checkpoint_columns}}
WHERE thread_id = :thread_id AND checkpoint_ns = :ns
ORDER BY checkpoint_id DESC LIMIT 1;

-- name: list_in_namespace
-- Newest first, strictly before :before when given; LIMIT -1 is no limit.
{{checkpoint_columns}}
WHERE thread_id = :thread_id AND checkpoint_ns = :ns
  AND (:checkpoint_id IS NULL OR checkpoint_id = :checkpoint_id)
  AND (:before IS NULL OR checkpoint_id < :before)
{{metadata_filter}}
ORDER BY checkpoint_id DESC LIMIT :limit;

-- name: list_in_thread
{{checkpoint_columns}}
WHERE thread_id = :thread_id
  AND (:checkpoint_id IS NULL OR checkpoint_id = :checkpoint_id)
  AND (:before IS NULL OR checkpoint_id < :before)
{{metadata_filter}}
ORDER BY checkpoint_id DESC LIMIT :limit;

-- name: list_all
{{checkpoint_columns}}
WHERE (:before IS NULL OR checkpoint_id < :before)
{{metadata_filter}}
ORDER BY checkpoint_id DESC LIMIT :limit;

-- name: writes_of
-- The pending writes of the checkpoints keyed [[thread_id, ns, checkpoint_id], ...], in the
-- order LangGraph applies them (writes_sort_key: task_path, task_id, idx).
SELECT w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.channel, w.type, w.blob
FROM json_each(:keys) AS k
JOIN lg_writes AS w
  ON w.thread_id = k.value ->> 0 AND w.checkpoint_ns = k.value ->> 1
 AND w.checkpoint_id = k.value ->> 2
ORDER BY w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_path, w.task_id, w.idx;

-- name: blobs_of
-- The blobs keyed [[thread_id, ns, channel, version], ...] and, for a delta, every row of its
-- chain down to the full value it extends.
WITH RECURSIVE need (thread_id, checkpoint_ns, channel, version) AS (
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each(:keys)
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

-- name: delete_thread_checkpoints
DELETE FROM lg_checkpoints WHERE thread_id = ?;

-- name: delete_thread_blobs
DELETE FROM lg_blobs WHERE thread_id = ?;

-- name: delete_thread_writes
DELETE FROM lg_writes WHERE thread_id = ?;

-- name: run_namespaces
-- The (thread, namespace) pairs holding checkpoints of the runs in :run_ids (a JSON array).
SELECT DISTINCT thread_id, checkpoint_ns FROM lg_checkpoints
WHERE run_id IN (SELECT value FROM json_each(:run_ids));

-- name: delete_run_writes
DELETE FROM lg_writes
WHERE (thread_id, checkpoint_ns, checkpoint_id) IN (
    SELECT thread_id, checkpoint_ns, checkpoint_id FROM lg_checkpoints
    WHERE run_id IN (SELECT value FROM json_each(:run_ids)));

-- name: delete_run_checkpoints
DELETE FROM lg_checkpoints WHERE run_id IN (SELECT value FROM json_each(:run_ids));

-- name: delete_older_checkpoints
-- keep_latest: every checkpoint of the thread but the newest of each namespace.
DELETE FROM lg_checkpoints
WHERE thread_id = :thread_id
  AND checkpoint_id < (SELECT max(c.checkpoint_id) FROM lg_checkpoints AS c
                       WHERE c.thread_id = lg_checkpoints.thread_id
                         AND c.checkpoint_ns = lg_checkpoints.checkpoint_ns);

-- name: delete_orphan_writes
-- Writes whose checkpoint is gone.
DELETE FROM lg_writes
WHERE thread_id = :thread_id
  AND NOT EXISTS (SELECT 1 FROM lg_checkpoints AS c
                  WHERE c.thread_id = lg_writes.thread_id
                    AND c.checkpoint_ns = lg_writes.checkpoint_ns
                    AND c.checkpoint_id = lg_writes.checkpoint_id);

-- name: blob_namespaces
SELECT DISTINCT checkpoint_ns FROM lg_blobs WHERE thread_id = ?;

-- name: namespace_checkpoints
-- The bodies of a namespace's checkpoints (their channel versions say which blobs are live).
SELECT type, checkpoint FROM lg_checkpoints WHERE thread_id = ? AND checkpoint_ns = ?;

-- name: namespace_blob_keys
SELECT channel, version, base_version FROM lg_blobs WHERE thread_id = ? AND checkpoint_ns = ?;

-- name: delete_blob
DELETE FROM lg_blobs WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ?;

-- name: copy_checkpoints
-- copy_thread: rows the target already has are kept.
INSERT INTO lg_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                            run_id, type, checkpoint, metadata)
SELECT :target, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint,
       metadata
FROM lg_checkpoints WHERE thread_id = :source
ON CONFLICT DO NOTHING;

-- name: copy_blobs
INSERT INTO lg_blobs (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
SELECT :target, checkpoint_ns, channel, version, type, blob, base_version
FROM lg_blobs WHERE thread_id = :source
ON CONFLICT DO NOTHING;

-- name: copy_writes
INSERT INTO lg_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type,
                       blob, task_path)
SELECT :target, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path
FROM lg_writes WHERE thread_id = :source
ON CONFLICT DO NOTHING;
