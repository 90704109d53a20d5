-- BabelQueue idempotency table for SQLite (the embedded persistent store).
--
-- The layout of the PostgreSQL table of SPEC section 3, with times as Unix epoch
-- milliseconds (INTEGER). babelqueue_sqlite::SqliteStore creates it on open (with the
-- table and index names substituted after validation). Every statement is idempotent.

CREATE TABLE IF NOT EXISTS babelqueue_idempotency (
    -- meta.id, verbatim; the primary key is the claim.
    message_id        TEXT    NOT NULL PRIMARY KEY,
    -- When the id was claimed or remembered (Unix ms).
    created_at        INTEGER NOT NULL,
    -- When the row stops counting (Unix ms); NULL = never.
    -- seen = expires_at IS NULL OR expires_at > now.
    expires_at        INTEGER NULL,
    -- Lease mode: the holder's token while the id is in flight, else NULL. An in-flight
    -- row has expires_at = lease_expires_at = the lease deadline.
    lease_token       TEXT    NULL,
    lease_expires_at  INTEGER NULL,
    -- Payload fingerprint (opt-in): `sha256:<hex>` of the canonical JSON of `data`, and
    -- the created_at it was written with (it counts only while the two are equal).
    -- Files created before these columns existed gain them on open.
    fingerprint       TEXT    NULL,
    fingerprint_at    INTEGER NULL
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS babelqueue_idempotency_expires_at_idx
    ON babelqueue_idempotency (expires_at);

-- Lease mode fencing tokens: one counter row, incremented by every claim (inside the
-- claim's IMMEDIATE transaction), so a later claim of an id always carries a larger token
-- than any earlier one, whatever happened to the id's row in between.
CREATE TABLE IF NOT EXISTS babelqueue_idempotency_fence (
    id     INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    value  INTEGER NOT NULL
);
