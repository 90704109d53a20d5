//! The SQL of the transactional and fingerprint paths, rendered once per store for its
//! validated table: held by the store (`store.rs`) and run by `txn.rs`, so neither of them
//! imports the other for it.

use crate::table::TableName;

/// The statements of the transactional and fingerprint paths, rendered once for a validated table.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `$1` id, `$2` TTL ms or NULL, `$3` fingerprint text or NULL. The SPEC claim
    /// (`INSERT … ON CONFLICT … WHERE <expired> RETURNING`), also writing the fingerprint
    /// columns; a take-over clears a stale lease.
    pub(crate) claim: String,
    /// `$1` id: the stored fingerprint of a live row (NULL when none or stale), no row
    /// when unseen.
    pub(crate) lookup: String,
    /// `$1` batch size: deletes up to that many expired rows, skipping rows locked by a
    /// transaction in progress.
    pub(crate) purge_batch: String,
}

impl Statements {
    pub(crate) fn new(table: &TableName) -> Self {
        let t = table.sql();
        Statements {
            claim: format!(
                "INSERT INTO {t} (message_id, created_at, expires_at, fingerprint, fingerprint_at) \
                 VALUES ($1, now(), now() + $2::bigint * interval '1 millisecond', $3::text, \
                         CASE WHEN $3::text IS NULL THEN NULL ELSE now() END) \
                 ON CONFLICT (message_id) DO UPDATE \
                 SET created_at = now(), expires_at = EXCLUDED.expires_at, \
                     fingerprint = EXCLUDED.fingerprint, fingerprint_at = EXCLUDED.fingerprint_at, \
                     lease_token = NULL, lease_expires_at = NULL \
                 WHERE {t}.expires_at IS NOT NULL AND {t}.expires_at <= now() \
                 RETURNING message_id"
            ),
            lookup: format!(
                "SELECT CASE WHEN fingerprint_at IS NOT DISTINCT FROM created_at \
                        THEN fingerprint END \
                 FROM {t} WHERE message_id = $1 \
                 AND (expires_at IS NULL OR expires_at > now())"
            ),
            purge_batch: format!(
                "DELETE FROM {t} WHERE message_id IN ( \
                   SELECT message_id FROM {t} \
                   WHERE expires_at IS NOT NULL AND expires_at <= now() \
                   LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_bind_ids_and_name_the_table() {
        let s = Statements::new(&TableName::parse("app.t").unwrap());
        for sql in [&s.claim, &s.lookup, &s.purge_batch] {
            assert!(sql.contains("\"app\".\"t\""), "{sql}");
        }
        assert!(s.claim.contains("VALUES ($1"));
        assert!(s.lookup.contains("message_id = $1"));
        assert!(s.purge_batch.contains("SKIP LOCKED"));
    }
}
