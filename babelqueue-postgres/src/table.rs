//! The table name: validated as a plain SQL identifier before it is ever written into SQL.

use std::fmt;

/// The default table name, shared with every BabelQueue SDK.
pub const DEFAULT_TABLE: &str = "babelqueue_idempotency";

/// The DDL shipped in `sql/babelqueue_idempotency.sql`, written for [`DEFAULT_TABLE`].
pub const DDL: &str = include_str!("../sql/babelqueue_idempotency.sql");

/// The longest identifier PostgreSQL keeps (NAMEDATALEN - 1).
const MAX_IDENT: usize = 63;

/// A table name that is not a plain SQL identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid table name {name:?}: {reason} (allowed: [A-Za-z_][A-Za-z0-9_]*, at most 63 bytes, \
     optionally schema-qualified as schema.table)"
)]
pub struct InvalidTableName {
    /// The rejected name.
    pub name: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

/// A validated table name, optionally schema-qualified (`schema.table`).
///
/// Only ASCII letters, digits and `_` (not starting with a digit), at most 63 bytes per
/// part. The name is folded to lower case, which is how PostgreSQL resolves the same
/// name written unquoted (as the Go SDK writes it), and always emitted double-quoted, so
/// a reserved word such as `user` is still a valid table name.
///
/// ```
/// use babelqueue_postgres::TableName;
/// assert_eq!(TableName::parse("Billing.Idempotency")?.to_string(), "billing.idempotency");
/// assert!(TableName::parse("t; DROP TABLE x").is_err());
/// assert!(TableName::parse("a.b.c").is_err());
/// # Ok::<(), babelqueue_postgres::InvalidTableName>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    table: String,
}

fn ident(name: &str, part: &str) -> Result<String, InvalidTableName> {
    let bad = |reason| InvalidTableName {
        name: name.to_owned(),
        reason,
    };
    let mut chars = part.chars();
    match chars.next() {
        None => return Err(bad("empty identifier")),
        Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
            return Err(bad("an identifier must start with a letter or `_`"));
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(bad("only ASCII letters, digits and `_` are allowed"));
    }
    if part.len() > MAX_IDENT {
        return Err(bad("an identifier is at most 63 bytes"));
    }
    Ok(part.to_ascii_lowercase())
}

impl TableName {
    /// Validates `name` (`table` or `schema.table`).
    pub fn parse(name: &str) -> Result<Self, InvalidTableName> {
        let mut parts = name.split('.');
        let (first, second) = (parts.next().unwrap_or(""), parts.next());
        if parts.next().is_some() {
            return Err(InvalidTableName {
                name: name.to_owned(),
                reason: "at most one `.` (schema.table)",
            });
        }
        Ok(match second {
            None => TableName {
                schema: None,
                table: ident(name, first)?,
            },
            Some(table) => TableName {
                schema: Some(ident(name, first)?),
                table: ident(name, table)?,
            },
        })
    }

    /// The schema, if qualified (lower case).
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The table part (lower case).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The name as written in SQL: `"table"` or `"schema"."table"`.
    pub fn sql(&self) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{}\"", self.table),
            None => format!("\"{}\"", self.table),
        }
    }

    /// The expiry index, `<table>_expires_at_idx` (the Go SDK's name), unqualified and
    /// quoted (an index lives in its table's schema). PostgreSQL truncates it to 63 bytes,
    /// as it does for the Go SDK.
    pub fn index_sql(&self) -> String {
        let mut index = format!("{}_expires_at_idx", self.table);
        index.truncate(MAX_IDENT);
        format!("\"{index}\"")
    }

    /// The fencing-token sequence of lease mode, `<table>_fence_seq` (truncated to 63
    /// bytes like the index), qualified like the table and quoted.
    pub fn fence_sequence_sql(&self) -> String {
        let mut seq = format!("{}_fence_seq", self.table);
        seq.truncate(MAX_IDENT);
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{seq}\""),
            None => format!("\"{seq}\""),
        }
    }

    /// The expiry index, qualified like the table (for `to_regclass`).
    pub(crate) fn qualified_index_sql(&self) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".{}", self.index_sql()),
            None => self.index_sql(),
        }
    }

    /// The shipped DDL ([`DDL`]) for this table: the identifier tokens
    /// `babelqueue_idempotency`, `babelqueue_idempotency_expires_at_idx` and
    /// `babelqueue_idempotency_fence_seq` are replaced by this (validated, quoted) table,
    /// index and sequence name; nothing else changes.
    pub fn ddl(&self) -> String {
        let (table, index, seq) = (self.sql(), self.index_sql(), self.fence_sequence_sql());
        let default_index = format!("{DEFAULT_TABLE}_expires_at_idx");
        let default_seq = format!("{DEFAULT_TABLE}_fence_seq");
        babelqueue_core::sql::rename_identifiers(DDL, |word| {
            if word == DEFAULT_TABLE {
                Some(table.clone())
            } else if word == default_index {
                Some(index.clone())
            } else if word == default_seq {
                Some(seq.clone())
            } else {
                None
            }
        })
    }
}

impl Default for TableName {
    fn default() -> Self {
        TableName {
            schema: None,
            table: DEFAULT_TABLE.to_owned(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.table),
            None => f.write_str(&self.table),
        }
    }
}

impl std::str::FromStr for TableName {
    type Err = InvalidTableName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_qualified_names() {
        assert_eq!(TableName::parse("bq").unwrap().sql(), "\"bq\"");
        assert_eq!(TableName::parse("_x9").unwrap().sql(), "\"_x9\"");
        let q = TableName::parse("App.Idem").unwrap();
        assert_eq!(q.sql(), "\"app\".\"idem\"");
        assert_eq!(q.index_sql(), "\"idem_expires_at_idx\"");
        assert_eq!(q.qualified_index_sql(), "\"app\".\"idem_expires_at_idx\"");
        assert_eq!(TableName::parse("user").unwrap().sql(), "\"user\"");
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a.b.c",
            "1abc",
            "a-b",
            "a b",
            "a\"b",
            "a;b",
            "tablé",
            "a'b",
            "a\0",
            &"x".repeat(64),
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(TableName::parse(&"x".repeat(63)).is_ok());
    }

    #[test]
    fn ddl_substitutes_only_whole_identifiers() {
        let ddl = TableName::parse("s.t").unwrap().ddl();
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS \"s\".\"t\" ("));
        assert!(ddl.contains("CREATE INDEX IF NOT EXISTS \"t_expires_at_idx\""));
        assert!(ddl.contains("ON \"s\".\"t\" (expires_at)"));
        assert!(ddl.contains("ALTER TABLE \"s\".\"t\" ADD COLUMN IF NOT EXISTS lease_token"));
        assert!(!ddl.contains("babelqueue_idempotency"));
        // The default name renders the shipped file with quoted identifiers only.
        let default = TableName::default().ddl();
        assert_eq!(
            default.replace('"', ""),
            DDL.replace('"', ""),
            "only quoting differs for the default table"
        );
    }
}
