-- Dashboard sessions (tether serve --token): one row per sign-in, so that signing out ends the
-- session on the server at once; a copied cookie is refused from then on. The cookie holds
-- the random session id; only its SHA-256 (hex) is stored, so a read of this table gives no
-- cookie. A row lives until expires_at (sign-in + 12 h): sign-out sets revoked_at, and each
-- sign-in deletes the rows already expired (by ui_sessions_expires).
CREATE TABLE ui_sessions (
    id_hash    TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    last_seen  REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX ui_sessions_expires ON ui_sessions (expires_at);
