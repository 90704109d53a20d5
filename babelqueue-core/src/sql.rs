//! Small helpers shared by the SQL-backed stores (PostgreSQL, SQLite).

/// Rewrites the identifiers of `sql`: every maximal run of ASCII letters, digits and `_`
/// is passed to `rename`, and replaced by what it returns (`None` keeps the word). Other
/// characters are copied unchanged.
///
/// This is how the SQL stores turn the shipped DDL, written for the default table name,
/// into the DDL of a configured (already validated) table, without touching anything
/// else in the statement.
///
/// ```
/// use babelqueue_core::sql::rename_identifiers;
/// let ddl = "CREATE TABLE IF NOT EXISTS babelqueue_idempotency (message_id TEXT);";
/// let out = rename_identifiers(ddl, |w| (w == "babelqueue_idempotency").then(|| "\"dedupe\"".to_owned()));
/// assert_eq!(out, "CREATE TABLE IF NOT EXISTS \"dedupe\" (message_id TEXT);");
/// ```
pub fn rename_identifiers(sql: &str, rename: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        match rename(word) {
            Some(new) => out.push_str(&new),
            None => out.push_str(word),
        }
        word.clear();
    };
    for c in sql.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}
