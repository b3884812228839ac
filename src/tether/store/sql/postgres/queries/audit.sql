-- Postgres: the audit log of operator actions.

-- name: insert_audit
-- Inside the action's own transaction, after the action's writes: committed with it or not
-- at all.
INSERT INTO audit (at, actor, action, thread_id, target, details)
VALUES (extract(epoch FROM clock_timestamp())::float8, %(actor)s, %(action)s,
        %(thread_id)s, %(target)s, %(details)s);

-- name: list_audit
-- Newest first, keyset-paginated on id; filtered by run and action (audit_thread,
-- audit_action).
SELECT id, at, actor, action, thread_id, target, details FROM audit
WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text)
  AND (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;
