-- SQLite: the audit log of operator actions.

-- name: insert_audit
-- Inside the action's own transaction, after the action's writes: committed with it or not
-- at all.
INSERT INTO audit (at, actor, action, thread_id, target, details)
VALUES ((julianday('now') - 2440587.5) * 86400.0, :actor, :action, :thread_id, :target,
        :details);

-- name: list_audit
-- Newest first, keyset-paginated on id; filtered by run and action (audit_thread,
-- audit_action).
SELECT id, at, actor, action, thread_id, target, details FROM audit
WHERE (:thread_id IS NULL OR thread_id = :thread_id)
  AND (:action IS NULL OR action = :action)
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit;
