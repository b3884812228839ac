-- SQLite: mailboxes and groups.

-- name: insert_message
INSERT INTO mailbox (thread_id, sender, message, created_at)
VALUES (:thread_id, :sender, :message, (julianday('now') - 2440587.5) * 86400.0);

-- name: wake_for_mail
-- Delivery wakes an idle actor (waiting for mail) so any worker can claim it.
UPDATE runs SET status = 'queued', waiting_for = NULL,
                updated_at = (julianday('now') - 2440587.5) * 86400.0,
                {{resting('queued', (julianday('now') - 2440587.5) * 86400.0)}}
WHERE thread_id = :thread_id AND status = 'waiting' AND waiting_for = 'mail';

-- name: load_inbox
SELECT id, sender, message, created_at FROM mailbox
WHERE thread_id = :thread_id AND consumed_step IS NULL ORDER BY id LIMIT :limit;

-- name: with_mail
-- Which of these runs (a JSON array) have unconsumed mail (mailbox_pending, a probe each).
SELECT DISTINCT thread_id FROM mailbox
WHERE thread_id IN (SELECT value FROM json_each(:ids)) AND consumed_step IS NULL;

-- name: consume_messages
-- Messages are consumed by exactly one committed step (the caller checked the epoch).
UPDATE mailbox SET consumed_step = :step
WHERE thread_id = :thread_id AND consumed_step IS NULL
  AND id IN (SELECT value FROM json_each(:ids));

-- name: requeue_if_mail
-- An actor that parks for mail while mail is already waiting stays claimable.
UPDATE runs SET status = 'queued', waiting_for = NULL, {{resting('queued', updated_at)}}
WHERE thread_id = :thread_id AND status = 'waiting' AND waiting_for = 'mail'
  AND EXISTS (SELECT 1 FROM mailbox WHERE thread_id = :thread_id AND consumed_step IS NULL);

-- name: sent_mail
-- What a run sent, newest first (mailbox_sender): recipient, when, consumed or not.
SELECT id, thread_id, message, created_at, consumed_step FROM mailbox
WHERE sender = :sender
ORDER BY id DESC
LIMIT :limit;

-- name: inbox_depth
SELECT count(*) FROM mailbox WHERE thread_id = :thread_id AND consumed_step IS NULL;

-- name: join_group
INSERT INTO group_members (group_name, thread_id, role, joined_at)
VALUES (:group_name, :thread_id, :role, (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT (group_name, thread_id) DO UPDATE SET role = excluded.role;

-- name: group_members
SELECT thread_id FROM group_members WHERE group_name = :group_name ORDER BY thread_id;
