-- BabelQueue idempotency table for PostgreSQL (SPEC section 3).
--
-- The same table the Go, Python, PHP, Java, Node and .NET SDKs read and write, so a
-- mixed-language fleet shares one dedupe state keyed on the envelope's meta.id.
-- babelqueue_postgres::PostgresStore::migrate() runs this file (with the table and index
-- names substituted after validation); apply it yourself with psql or your migration tool
-- if you prefer (rename the table and index to match a custom table name).
-- Every statement is idempotent: running it again changes nothing.

CREATE TABLE IF NOT EXISTS babelqueue_idempotency (
    -- meta.id, verbatim. The primary key is the claim: of N concurrent INSERTs of one id,
    -- exactly one writes the row.
    message_id  TEXT        NOT NULL PRIMARY KEY,
    -- When the id was claimed or remembered (or re-claimed after expiry).
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When the row stops counting (seen = expires_at IS NULL OR expires_at > now()).
    -- NULL = never.
    expires_at  TIMESTAMPTZ NULL
);

-- Keeps the expiry predicate and purge_expired() cheap.
CREATE INDEX IF NOT EXISTS babelqueue_idempotency_expires_at_idx
    ON babelqueue_idempotency (expires_at);

-- In-flight lease mode (Rust SDK), additive: two nullable columns other SDKs ignore.
-- An in-flight row has lease_token = the holder's token and
-- expires_at = lease_expires_at = the lease deadline, so every SDK's seen() treats it
-- as taken until the lease ends. Completing clears both columns and sets expires_at to
-- the TTL deadline (or NULL): exactly a row the Go SDK would have written.
ALTER TABLE babelqueue_idempotency ADD COLUMN IF NOT EXISTS lease_token TEXT NULL;
ALTER TABLE babelqueue_idempotency ADD COLUMN IF NOT EXISTS lease_expires_at TIMESTAMPTZ NULL;

-- Lease mode fencing tokens (Rust SDK), additive: every claim takes the next value, so a
-- later claim of an id always carries a larger token than any earlier one (rows may be
-- deleted and re-created; the sequence never goes back). Other SDKs never read it.
CREATE SEQUENCE IF NOT EXISTS babelqueue_idempotency_fence_seq;
-- Payload fingerprints (Rust SDK, opt-in), additive: `sha256:<hex>` of the canonical
-- JSON of `data`, and the created_at it was written with. It counts only while
-- fingerprint_at = created_at, so a row re-claimed later by an SDK that does not know
-- this column (which rewrites created_at) reads as "no fingerprint", never a stale one.
ALTER TABLE babelqueue_idempotency ADD COLUMN IF NOT EXISTS fingerprint TEXT NULL;
ALTER TABLE babelqueue_idempotency ADD COLUMN IF NOT EXISTS fingerprint_at TIMESTAMPTZ NULL;

-- Housekeeping (purge_expired()): expired rows are already ignored, this reclaims space.
--   DELETE FROM babelqueue_idempotency WHERE expires_at IS NOT NULL AND expires_at <= now();
