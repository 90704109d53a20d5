-- BabelQueue transactional outbox for SQLite (ADR-0029, issue 22).
--
-- The layout of the PostgreSQL outbox (babelqueue-postgres/sql/babelqueue_outbox.sql) with
-- times as Unix epoch milliseconds (INTEGER). A producer INSERTs the encoded envelope in
-- its own transaction; babelqueue_core::outbox::OutboxRelay publishes it.
-- babelqueue_sqlite::SqliteOutbox creates it on open, and SqliteOutbox::migrate(&conn) on
-- any connection (with the table and index names substituted after validation).
-- Every statement is idempotent.

CREATE TABLE IF NOT EXISTS babelqueue_outbox (
    -- Write order; relays claim and publish the oldest first.
    id             INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
    -- The queue to publish to (meta.queue, else `default`).
    queue          TEXT    NOT NULL,
    -- The element to publish, byte for byte.
    payload        BLOB    NOT NULL,
    created_at     INTEGER NOT NULL,
    -- When the row is due: the write, or the next try after a failed publish.
    available_at   INTEGER NOT NULL,
    -- Failed publishes so far, and the last failure's reason.
    attempts       INTEGER NOT NULL DEFAULT 0,
    last_error     TEXT    NULL,
    -- A relay's claim (set in an IMMEDIATE transaction): others skip the row until then.
    claimed_until  INTEGER NULL,
    -- Set once the broker accepted the row; NULL = still to publish.
    published_at   INTEGER NULL
);

CREATE INDEX IF NOT EXISTS babelqueue_outbox_unpublished_idx
    ON babelqueue_outbox (id) WHERE published_at IS NULL;
