//! `babelqueue doctor <store-url>`: checks a live store against the cross-SDK layout.

use std::path::Path;

use crate::CliError;
use crate::report::Report;

/// How many leftover leases / expired ids are listed by name.
const LISTED: i64 = 20;

/// Checks the store at `url` and reports what it found.
pub(crate) async fn run(
    url: &str,
    table: &str,
    prefix: &str,
    sample: usize,
) -> Result<Report, CliError> {
    let mut report = Report::default();
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        crate::redis_cmds::doctor(url, prefix, sample, &mut report).await?;
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        postgres(url, table, &mut report).await?;
    } else {
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        sqlite(Path::new(path), table, &mut report)?;
    }
    Ok(report)
}

fn pg_err<E: std::error::Error + Send + Sync + 'static>(
    context: impl Into<String>,
) -> impl FnOnce(E) -> CliError {
    let context = context.into();
    move |e| CliError::Postgres(context, Box::new(e))
}

/// A column's expected type, nullability and (for `created_at`) default.
struct Expect {
    name: &'static str,
    ty: &'static str,
    not_null: bool,
    required: bool,
}

const PG_COLUMNS: &[Expect] = &[
    Expect {
        name: "message_id",
        ty: "text",
        not_null: true,
        required: true,
    },
    Expect {
        name: "created_at",
        ty: "timestamp with time zone",
        not_null: true,
        required: true,
    },
    Expect {
        name: "expires_at",
        ty: "timestamp with time zone",
        not_null: false,
        required: true,
    },
    Expect {
        name: "lease_token",
        ty: "text",
        not_null: false,
        required: false,
    },
    Expect {
        name: "lease_expires_at",
        ty: "timestamp with time zone",
        not_null: false,
        required: false,
    },
];

const SQLITE_COLUMNS: &[Expect] = &[
    Expect {
        name: "message_id",
        ty: "TEXT",
        not_null: true,
        required: true,
    },
    Expect {
        name: "created_at",
        ty: "INTEGER",
        not_null: true,
        required: true,
    },
    Expect {
        name: "expires_at",
        ty: "INTEGER",
        not_null: false,
        required: true,
    },
    Expect {
        name: "lease_token",
        ty: "TEXT",
        not_null: false,
        required: true,
    },
    Expect {
        name: "lease_expires_at",
        ty: "INTEGER",
        not_null: false,
        required: true,
    },
];

/// Compares the found columns `(name, type, not null)` with `expected`; returns whether
/// the lease columns are all there.
fn check_columns(
    found: &[(String, String, bool)],
    expected: &[Expect],
    table: &str,
    report: &mut Report,
) -> bool {
    let mut leases = true;
    for e in expected {
        match found.iter().find(|(n, _, _)| n == e.name) {
            None if e.required => report.problem(format!("{table}: column {} is missing", e.name)),
            None => {
                leases = false;
                report.note(format!(
                    "{table}: no column {} (the other SDKs' layout; the Rust lease mode adds it on migrate)",
                    e.name
                ));
            }
            Some((_, ty, not_null)) => {
                if !ty.eq_ignore_ascii_case(e.ty) {
                    report.problem(format!("{table}.{}: type {ty}, expected {}", e.name, e.ty));
                } else if *not_null != e.not_null {
                    report.problem(format!(
                        "{table}.{}: {}, expected {}",
                        e.name,
                        if *not_null { "NOT NULL" } else { "nullable" },
                        if e.not_null { "NOT NULL" } else { "nullable" }
                    ));
                } else {
                    report.ok(format!(
                        "{table}.{} {ty}{}",
                        e.name,
                        if *not_null { " NOT NULL" } else { "" }
                    ));
                }
            }
        }
    }
    leases
}

async fn postgres(url: &str, table: &str, report: &mut Report) -> Result<(), CliError> {
    let store = babelqueue_postgres::PostgresStore::builder(url)
        .table(table)
        .pool_size(1)
        .connect()
        .await
        .map_err(pg_err("cannot set up the PostgreSQL connection"))?;
    let client = store
        .pool()
        .get()
        .await
        .map_err(pg_err("cannot connect to PostgreSQL"))?;
    let tls: Option<bool> = client
        .query_opt(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(pg_err("reading pg_stat_ssl"))?
        .map(|r| r.get(0));
    report.ok(format!(
        "PostgreSQL answers ({})",
        if tls == Some(true) { "TLS" } else { "no TLS" }
    ));
    let name = store.table().sql();
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
        .await
        .map_err(pg_err("looking the table up"))?
        .get(0);
    if !exists {
        report.problem(format!(
            "table {name} does not exist (PostgresStore::migrate creates it, or run the shipped DDL)"
        ));
        return Ok(());
    }
    let found: Vec<(String, String, bool)> = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull \
             FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 \
             AND NOT a.attisdropped ORDER BY a.attnum",
            &[&name],
        )
        .await
        .map_err(pg_err("reading the columns"))?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let leases = check_columns(&found, PG_COLUMNS, &name, report);
    let default: Option<String> = client
        .query_opt(
            "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a \
             ON a.attrelid = d.adrelid AND a.attnum = d.adnum \
             WHERE d.adrelid = to_regclass($1) AND a.attname = 'created_at'",
            &[&name],
        )
        .await
        .map_err(pg_err("reading the column defaults"))?
        .map(|r| r.get(0));
    match default {
        Some(d) if d.contains("now()") || d.contains("CURRENT_TIMESTAMP") => {
            report.ok(format!("{name}.created_at DEFAULT {d}"));
        }
        other => report.problem(format!(
            "{name}.created_at has default {}, expected now()",
            other.as_deref().unwrap_or("none")
        )),
    }
    let pk: Vec<String> = client
        .query(
            "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a \
             ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = to_regclass($1) AND i.indisprimary",
            &[&name],
        )
        .await
        .map_err(pg_err("reading the primary key"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if pk == ["message_id"] {
        report.ok(format!("{name}: PRIMARY KEY (message_id)"));
    } else {
        report.problem(format!(
            "{name}: primary key is {pk:?}, expected (message_id)"
        ));
    }
    let indexes: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_index i JOIN pg_attribute a \
             ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
             WHERE i.indrelid = to_regclass($1) AND a.attname = 'expires_at'",
            &[&name],
        )
        .await
        .map_err(pg_err("reading the indexes"))?
        .get(0);
    if indexes > 0 {
        report.ok(format!("{name}: index on expires_at"));
    } else {
        report.problem(format!(
            "{name}: no index on expires_at (seen and purge scan the table)"
        ));
    }
    let t = &name;
    let row = client
        .query_one(
            &format!(
                "SELECT count(*), \
                   count(*) FILTER (WHERE expires_at IS NOT NULL AND expires_at <= now()), \
                   count(*) FILTER (WHERE expires_at IS NULL) FROM {t}"
            ),
            &[],
        )
        .await
        .map_err(pg_err("counting the rows"))?;
    let (total, expired, forever): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    report.ok(format!(
        "{total} row(s): {expired} expired, {forever} without expiry"
    ));
    if expired > 0 {
        let ids: Vec<String> = client
            .query(
                &format!(
                    "SELECT message_id FROM {t} WHERE expires_at IS NOT NULL AND expires_at <= now() \
                     ORDER BY expires_at LIMIT {LISTED}"
                ),
                &[],
            )
            .await
            .map_err(pg_err("listing expired rows"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        report.note(format!(
            "{expired} expired row(s) (ignored by every SDK; PostgresStore::purge_expired deletes them): {}",
            ids.join(", ")
        ));
    }
    if leases {
        let rows = client
            .query(
                &format!(
                    "SELECT message_id, \
                       (expires_at IS NOT NULL AND lease_expires_at IS NOT DISTINCT FROM expires_at \
                        AND expires_at > now()) AS live, \
                       (lease_expires_at <= now()) AS lapsed \
                     FROM {t} WHERE lease_token IS NOT NULL ORDER BY lease_expires_at LIMIT {LISTED}"
                ),
                &[],
            )
            .await
            .map_err(pg_err("listing leases"))?;
        list_leases(
            rows.iter().map(|r| {
                (
                    r.get::<_, String>(0),
                    r.get::<_, bool>(1),
                    r.get::<_, Option<bool>>(2) == Some(true),
                )
            }),
            report,
        );
    }
    Ok(())
}

/// Reports lease rows `(id, in flight now, lease deadline passed)`.
fn list_leases(rows: impl Iterator<Item = (String, bool, bool)>, report: &mut Report) {
    let (mut live, mut left) = (Vec::new(), Vec::new());
    for (id, in_flight, lapsed) in rows {
        if in_flight {
            live.push(id);
        } else {
            left.push(format!(
                "{id} ({})",
                if lapsed {
                    "lease expired: its holder died"
                } else {
                    "lease columns no longer match expires_at"
                }
            ));
        }
    }
    if !live.is_empty() {
        report.note(format!("in flight now: {}", live.join(", ")));
    }
    if left.is_empty() {
        report.ok("no leftover leases");
    } else {
        report.note(format!(
            "leftover lease(s) (harmless: not in flight; purge_expired removes expired ones): {}",
            left.join(", ")
        ));
    }
}

fn sqlite(path: &Path, table: &str, report: &mut Report) -> Result<(), CliError> {
    use rusqlite::{Connection, OpenFlags};

    if !path.is_file() {
        return Err(CliError::Message(format!(
            "no SQLite file at {} (doctor takes redis://, rediss://, postgres://, postgresql:// URLs or a SQLite file)",
            path.display()
        )));
    }
    let valid = table
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(CliError::Message(format!(
            "invalid table name {table:?}: letters, digits and _ only"
        )));
    }
    let err = |context: &str| {
        let context = context.to_owned();
        move |e| CliError::Sqlite(context, e)
    };
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err(&format!("cannot open {}", path.display())))?;
    report.ok(format!("SQLite file {} opens", path.display()));
    let mut stmt = conn
        .prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1)")
        .map_err(err("reading the columns"))?;
    let cols: Vec<(String, String, bool, i64)> = stmt
        .query_map([table], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .and_then(Iterator::collect)
        .map_err(err("reading the columns"))?;
    if cols.is_empty() {
        report.problem(format!(
            "table {table} does not exist (SqliteStore creates it on open)"
        ));
        return Ok(());
    }
    let found: Vec<(String, String, bool)> = cols
        .iter()
        .map(|(n, t, nn, _)| (n.clone(), t.clone(), *nn))
        .collect();
    let leases = check_columns(&found, SQLITE_COLUMNS, table, report);
    let pk: Vec<&str> = cols
        .iter()
        .filter(|c| c.3 > 0)
        .map(|c| c.0.as_str())
        .collect();
    if pk == ["message_id"] {
        report.ok(format!("{table}: PRIMARY KEY (message_id)"));
    } else {
        report.problem(format!(
            "{table}: primary key is {pk:?}, expected (message_id)"
        ));
    }
    let indexed: i64 = conn
        .query_row(
            "SELECT count(*) FROM pragma_index_list(?1) l \
             WHERE (SELECT name FROM pragma_index_info(l.name) WHERE seqno = 0) = 'expires_at'",
            [table],
            |r| r.get(0),
        )
        .map_err(err("reading the indexes"))?;
    if indexed > 0 {
        report.ok(format!("{table}: index on expires_at"));
    } else {
        report.problem(format!("{table}: no index on expires_at"));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let t = format!("\"{table}\"");
    let (total, expired, forever): (i64, i64, i64) = conn
        .query_row(
            &format!(
                "SELECT count(*), \
                   coalesce(sum(expires_at IS NOT NULL AND expires_at <= ?1), 0), \
                   coalesce(sum(expires_at IS NULL), 0) FROM {t}"
            ),
            [now],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(err("counting the rows"))?;
    report.ok(format!(
        "{total} row(s): {expired} expired, {forever} without expiry"
    ));
    if expired > 0 {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT message_id FROM {t} WHERE expires_at IS NOT NULL AND expires_at <= ?1 \
                 ORDER BY expires_at LIMIT {LISTED}"
            ))
            .map_err(err("listing expired rows"))?;
        let ids: Vec<String> = stmt
            .query_map([now], |r| r.get(0))
            .and_then(Iterator::collect)
            .map_err(err("listing expired rows"))?;
        report.note(format!(
            "{expired} expired row(s) (ignored; SqliteStore::purge_expired deletes them): {}",
            ids.join(", ")
        ));
    }
    if leases {
        let mut stmt = conn
            .prepare(&format!(
                "SELECT message_id, \
                   (expires_at IS NOT NULL AND lease_expires_at IS expires_at AND expires_at > ?1), \
                   coalesce(lease_expires_at <= ?1, 0) \
                 FROM {t} WHERE lease_token IS NOT NULL ORDER BY lease_expires_at LIMIT {LISTED}"
            ))
            .map_err(err("listing leases"))?;
        let rows: Vec<(String, bool, bool)> = stmt
            .query_map([now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .and_then(Iterator::collect)
            .map_err(err("listing leases"))?;
        list_leases(rows.into_iter(), report);
    }
    Ok(())
}
