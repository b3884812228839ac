-- Durable group membership for two-layer coordination (MegaAgent): members of a group chat
-- densely; admins of all groups share the admin channel. Keyed by the member's thread_id.
CREATE TABLE group_members (
    group_name TEXT NOT NULL,
    thread_id  TEXT NOT NULL,
    role       TEXT NOT NULL,                 -- member|admin
    joined_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (group_name, thread_id)
);
CREATE INDEX group_members_thread ON group_members (thread_id);
