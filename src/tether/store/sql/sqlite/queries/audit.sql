-- SQLite: the audit log of operator actions.

-- name: insert_audit
-- Inside the action's own transaction, after the action's writes: committed with it or not
-- at all.
INSERT INTO audit (at, actor, action, thread_id, target, details)
VALUES ((julianday('now') - 2440587.5) * 86400.0, :actor, :action, :thread_id, :target,
        :details);

-- name: insert_audit_row
-- insert_audit with positional parameters (actor, action, thread_id, target, details): the
-- audit row of a start batched as a fenced write (sqlite_create), written only where its
-- run was inserted.
INSERT INTO audit (at, actor, action, thread_id, target, details)
VALUES ((julianday('now') - 2440587.5) * 86400.0, ?1, ?2, ?3, ?4, ?5);

-- name: insert_audit_row_set
-- insert_audit_row for a whole group commit: ?1 is a JSON array of its parameter lists, in
-- the order the starts were made.
INSERT INTO audit (at, actor, action, thread_id, target, details)
SELECT (julianday('now') - 2440587.5) * 86400.0, a.value ->> 0, a.value ->> 1, a.value ->> 2,
       a.value ->> 3, a.value ->> 4
FROM json_each(?1) AS a
ORDER BY a.key;

-- name: list_audit
-- Newest first, keyset-paginated on id; filtered by run and action (audit_thread,
-- audit_action).
SELECT id, at, actor, action, thread_id, target, details FROM audit
WHERE (:thread_id IS NULL OR thread_id = :thread_id)
  AND (:action IS NULL OR action = :action)
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit;
