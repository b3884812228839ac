-- LangGraph pending writes: one lg_writes row per task (thread, namespace, checkpoint, task)
-- instead of one per write. A row and its primary-key entry cost more than the writes they
-- hold (a W1 super-step writes its message and its branch: two rows, two 100-byte keys, for
-- some 30 bytes of values); one row per task halves that. `writes` packs the task's writes:
-- for each, in idx order, int4 idx, int4 length + channel (UTF-8), int4 length + type
-- (UTF-8), int4 length (-1: NULL) + blob, big-endian (tether.langgraph._postgres packs and
-- reads it). Existing rows are carried over.
CREATE TABLE lg_task_writes (
    thread_id     TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id       TEXT NOT NULL,
    task_path     TEXT NOT NULL,
    writes        BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id)
);
INSERT INTO lg_task_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, writes)
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, min(task_path),
       string_agg(int4send(idx)
                  || int4send(octet_length(convert_to(channel, 'UTF8')))
                  || convert_to(channel, 'UTF8')
                  || int4send(octet_length(convert_to(type, 'UTF8')))
                  || convert_to(type, 'UTF8')
                  || int4send(coalesce(octet_length(blob), -1))
                  || coalesce(blob, ''::bytea), ''::bytea ORDER BY idx)
FROM lg_writes
GROUP BY thread_id, checkpoint_ns, checkpoint_id, task_id;
DROP TABLE lg_writes;
ALTER TABLE lg_task_writes RENAME TO lg_writes;
ALTER INDEX lg_task_writes_pkey RENAME TO lg_writes_pkey;
