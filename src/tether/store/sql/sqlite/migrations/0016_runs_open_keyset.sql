-- runs_open gains thread_id at the end of its key: one version's open runs of one status in
-- (created_at, thread_id) order are then one range of it, so a page of them is a keyset read
-- (the runs list of an open status walks each version's range and merges them), and a count
-- of them can stop at a cap (deploy status, the dashboard). Same entries as before (the
-- open runs), one column wider: a step that changes a run's status writes it as before.
DROP INDEX runs_open;
CREATE INDEX runs_open ON runs (version, status, created_at, thread_id)
    WHERE status IN ('queued', 'running', 'waiting', 'sleeping');
