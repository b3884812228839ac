-- Postgres: mailboxes and groups.

-- name: send_message
-- Delivers mail from outside a step (the recipient's row is locked by lock_runs first), and
-- wakes the recipient if it is idle for mail. No row back = no such run, or a finished one
-- (which can never read it: the caller tells which).
WITH m AS (
    INSERT INTO mailbox (thread_id, sender, message, created_at)
    SELECT thread_id, %(sender)s, %(message)s, extract(epoch FROM clock_timestamp())::float8
    FROM runs WHERE thread_id = %(thread_id)s AND status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING id
),
w AS (
    UPDATE runs SET status = 'queued', waiting_for = NULL,
                    updated_at = extract(epoch FROM clock_timestamp())::float8
    WHERE thread_id = %(thread_id)s AND status || '' = 'waiting' AND waiting_for = 'mail'
    RETURNING version
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', version) FROM w)
SELECT m.id, (SELECT count(*) FROM woke) FROM m;

-- fragment: mail_idle_rows(ids, id)
-- The rows (ctid as rid) of the runs idle for mail among `ids` (a FROM item; `id` is its thread
-- id column), one primary-key lookup each (OFFSET 0 keeps it so; `status || ''`: see
-- wake_after_commit). A WHERE may follow.
SELECT l.rid
FROM {{ids}},
     LATERAL (SELECT ctid AS rid FROM runs
              WHERE thread_id = {{id}}
                AND status || '' = 'waiting' AND waiting_for = 'mail'
              OFFSET 0) AS l

-- fragment: wake_mail_rows(rows)
-- The runs idle for mail among the rows the CTE `rows` found (their ctid as rid, each found by
-- primary key) become queued, by TID: the rows were locked before, they stay where they are.
-- The status test is written `status || ''` (see wake_after_commit). Returns their versions.
UPDATE runs SET status = 'queued', waiting_for = NULL,
                updated_at = extract(epoch FROM clock_timestamp())::float8
WHERE ctid = ANY (ARRAY(SELECT rid FROM {{rows}}))
  AND status || '' = 'waiting' AND waiting_for = 'mail'
RETURNING version

-- fragment: send_messages_wake
-- send_messages' wake-ups and rows, after its CTE m (the mail inserted: id, thread_id).
wt AS MATERIALIZED (
    {{mail_idle_rows((SELECT DISTINCT thread_id FROM m) AS x, x.thread_id)}}
),
w AS (
    {{wake_mail_rows(wt)}}
),
woke AS MATERIALIZED (SELECT pg_notify('tether_work', v.version)
                      FROM (SELECT DISTINCT version FROM w) v)
SELECT m.thread_id, m.id, (SELECT count(*) FROM woke) FROM m ORDER BY m.id;

-- name: send_messages
-- send_message for many (pg_send.py), in a transaction that locked the recipients first
-- (lock_runs_many): mail to each recipient that exists and has not finished, in the order
-- given (ids follow it); recipients idle for mail are woken and announced. The mail comes as
-- one JSON array of rows, the messages as base64. Returns each message's (recipient, id).
-- Every recipient is found by primary key, one lookup each (OFFSET 0 keeps it so), and woken
-- by TID, whatever the planner's statistics say (see wake_after_commit).
WITH m AS (
    INSERT INTO mailbox (thread_id, sender, message, created_at)
    SELECT y.recipient, y.sender, decode(y.message, 'base64'),
           extract(epoch FROM clock_timestamp())::float8
    FROM ROWS FROM (json_to_recordset(%(mail)s::json)
                    AS (recipient text, sender text, message text))
         WITH ORDINALITY AS y(recipient, sender, message, n),
         LATERAL (SELECT 1 FROM runs r
                  WHERE r.thread_id = y.recipient
                    AND r.status NOT IN ('completed', 'failed', 'cancelled')
                  OFFSET 0) AS open
    ORDER BY y.n
    RETURNING id, thread_id
),
{{send_messages_wake}}

-- name: send_messages_audited
-- send_messages with audit rows (every message sent over HTTP, and runtime.send(actor=...)):
-- the rows carry insert_audit's parameters (audit_actor...: NULL for a send not audited),
-- and each message delivered gets its audit row, in the order sent; a message refused (no
-- such run, or a finished one) gets none. The recipients are locked (lock_runs_many), so
-- both CTEs find the same ones open.
WITH y AS (
    SELECT * FROM ROWS FROM (json_to_recordset(%(mail)s::json)
        AS (recipient text, sender text, message text, audit_actor text, audit_action text,
            audit_thread_id text, audit_target text, audit_details text))
        WITH ORDINALITY AS y(recipient, sender, message, audit_actor, audit_action,
                             audit_thread_id, audit_target, audit_details, n),
        LATERAL (SELECT 1 FROM runs r
                 WHERE r.thread_id = y.recipient
                   AND r.status NOT IN ('completed', 'failed', 'cancelled')
                 OFFSET 0) AS open
),
m AS (
    INSERT INTO mailbox (thread_id, sender, message, created_at)
    SELECT y.recipient, y.sender, decode(y.message, 'base64'),
           extract(epoch FROM clock_timestamp())::float8
    FROM y
    ORDER BY y.n
    RETURNING id, thread_id
),
aud AS (
    INSERT INTO audit (at, actor, action, thread_id, target, details)
    SELECT extract(epoch FROM clock_timestamp())::float8, y.audit_actor, y.audit_action,
           y.audit_thread_id, y.audit_target, y.audit_details
    FROM y
    WHERE y.audit_actor IS NOT NULL
    ORDER BY y.n
),
{{send_messages_wake}}

-- name: load_inbox
SELECT id, sender, message, created_at FROM mailbox
WHERE thread_id = %(thread_id)s AND consumed_step IS NULL
ORDER BY id
LIMIT %(limit)s;

-- name: load_inbox_many
-- load_inbox of many runs (Store.load_claimed): each run's unconsumed mail, oldest first, at
-- most limit each, one range of mailbox_pending per run, in (thread_id, id) order. The ids
-- come as one JSON array.
SELECT m.thread_id, m.id, m.sender, m.message, m.created_at
FROM json_array_elements_text(%(ids)s::json) AS x(id),
     LATERAL (SELECT thread_id, id, sender, message, created_at FROM mailbox
              WHERE thread_id = x.id AND consumed_step IS NULL
              ORDER BY id
              LIMIT %(limit)s) AS m
ORDER BY m.thread_id, m.id;

-- name: with_mail
-- Which of these runs have unconsumed mail (a claim's runs; mailbox_pending, a probe each).
SELECT DISTINCT thread_id FROM mailbox
WHERE thread_id = ANY(%(ids)s::text[]) AND consumed_step IS NULL;

-- name: sent_mail
-- What a run sent, newest first (mailbox_sender): recipient, when, consumed or not.
SELECT id, thread_id, message, created_at, consumed_step FROM mailbox
WHERE sender = %(sender)s::text
ORDER BY id DESC
LIMIT %(limit)s;

-- name: inbox_depth
SELECT count(*) FROM mailbox WHERE thread_id = %(thread_id)s AND consumed_step IS NULL;

-- name: group_members
SELECT thread_id FROM group_members WHERE group_name = %(group_name)s ORDER BY thread_id;

-- name: group_recipients
-- Who a step's group messages go to: every member but the sender.
SELECT group_name, thread_id FROM group_members
WHERE group_name = ANY(%(groups)s::text[]) AND thread_id <> %(thread_id)s
ORDER BY group_name, thread_id;
