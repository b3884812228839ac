-- The mail a run sent (the dashboard's "Sent" list, runtime.sent), newest first, as an index
-- range. Mail from outside a run may have no sender: it stays out of the index.
CREATE INDEX mailbox_sender ON mailbox (sender, id) WHERE sender IS NOT NULL;
