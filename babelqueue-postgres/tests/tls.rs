//! `sslmode` against the local PostgreSQL, which has TLS on (CI's server uses Debian's
//! self-signed "snakeoil" certificate: `CN=localhost`, `subjectAltName=DNS:localhost`,
//! found with `SHOW ssl_cert_file`). Each test checks `pg_stat_ssl` for its own backend.
#![cfg(feature = "rustls")]

use babelqueue_postgres::{PostgresStore, PostgresStoreError, SslMode, TlsError};

const NEEDS: &str = "needs PostgreSQL with TLS at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored";

/// A second self-signed `CN=localhost` certificate that did not sign the server's.
const WRONG_ROOT: &[u8] = include_bytes!("data/wrong-root.pem");

fn base_url() -> String {
    std::env::var("BABELQUEUE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// `base_url()` with its host replaced (the certificate names `localhost`) and `query`.
fn url_with(host: &str, query: &str) -> String {
    let base = base_url();
    let (scheme, rest) = base.split_once("://").expect("a postgres:// URL");
    let (auth, rest) = rest.rsplit_once('@').map_or(("", rest), |(a, r)| (a, r));
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let path = path.split('?').next().unwrap_or(path);
    let port = rest
        .split('/')
        .next()
        .and_then(|hp| hp.rsplit_once(':'))
        .map_or("5432", |(_, p)| p);
    let auth = if auth.is_empty() {
        String::new()
    } else {
        format!("{auth}@")
    };
    format!("{scheme}://{auth}{host}:{port}{path}?{query}")
}

/// Whether this session's backend is on TLS.
async fn on_tls(store: &PostgresStore) -> Result<bool, PostgresStoreError> {
    let client = store.pool().get().await?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// The server certificate's file (PEM), as the server reports it.
async fn server_cert_pem() -> Vec<u8> {
    let store = PostgresStore::connect(&url_with("127.0.0.1", "sslmode=disable"))
        .await
        .unwrap();
    let client = store.pool().get().await.unwrap();
    let path: String = client
        .query_one("SHOW ssl_cert_file", &[])
        .await
        .unwrap()
        .get(0);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading the server certificate {path}: {e}"))
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[tokio::test]
#[ignore = "needs PostgreSQL with TLS at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn require_connects_over_tls() {
    let _ = NEEDS;
    let store = PostgresStore::connect(&url_with("127.0.0.1", "sslmode=require"))
        .await
        .unwrap();
    assert!(on_tls(&store).await.unwrap());
}

#[tokio::test]
#[ignore = "needs PostgreSQL with TLS at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn prefer_and_the_default_use_tls_disable_does_not() {
    for (query, tls) in [
        ("sslmode=prefer", true),
        ("application_name=bq-default-mode", true),
        ("sslmode=disable", false),
    ] {
        let store = PostgresStore::connect(&url_with("127.0.0.1", query))
            .await
            .unwrap();
        assert_eq!(on_tls(&store).await.unwrap(), tls, "{query}");
    }
}

#[tokio::test]
#[ignore = "needs PostgreSQL with TLS at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn verify_full_with_the_server_certificate_as_root() {
    let pem = server_cert_pem().await;
    // As a builder root.
    let store = PostgresStore::builder(url_with("localhost", "sslmode=verify-full"))
        .root_certificates_pem(pem.clone())
        .connect()
        .await
        .unwrap();
    assert!(on_tls(&store).await.unwrap());

    // As an sslrootcert file.
    let dir = std::env::temp_dir().join(format!("bq-tls-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("root.pem");
    std::fs::write(&file, &pem).unwrap();
    let url = url_with(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", file.display()),
    );
    let store = PostgresStore::connect(&url).await.unwrap();
    assert!(on_tls(&store).await.unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
#[ignore = "needs PostgreSQL with TLS at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn verify_full_checks_the_host_name_verify_ca_does_not() {
    let pem = server_cert_pem().await;
    // The certificate names `localhost`, not `127.0.0.1`.
    let store = PostgresStore::builder(url_with("127.0.0.1", ""))
        .ssl_mode(SslMode::VerifyFull)
        .root_certificates_pem(pem.clone())
        .connect()
        .await
        .unwrap();
    let err = on_tls(&store).await.unwrap_err();
    let text = chain(&err);
    assert!(text.contains("not valid for name"), "{text}");

    let store = PostgresStore::builder(url_with("127.0.0.1", ""))
        .ssl_mode(SslMode::VerifyCa)
        .root_certificates_pem(pem)
        .connect()
        .await
        .unwrap();
    assert!(on_tls(&store).await.unwrap());
}

#[tokio::test]
#[ignore = "needs PostgreSQL with TLS at 127.0.0.1:5432 (BABELQUEUE_POSTGRES_URL); CI runs it with --include-ignored"]
async fn a_wrong_root_fails_every_verifying_mode_clearly() {
    for mode in [SslMode::VerifyFull, SslMode::VerifyCa, SslMode::Require] {
        let store = PostgresStore::builder(url_with("localhost", ""))
            .ssl_mode(mode)
            .root_certificates_pem(WRONG_ROOT)
            .connect()
            .await
            .unwrap();
        let err = on_tls(&store).await.unwrap_err();
        let text = chain(&err);
        assert!(
            text.contains("TLS handshake") && text.contains("invalid peer certificate"),
            "{mode}: {text}"
        );
    }
}

#[tokio::test]
async fn verify_modes_need_a_readable_root() {
    let err = PostgresStore::connect(
        "postgres://postgres@localhost:1/test?sslmode=verify-full&sslrootcert=/nonexistent/bq/root.pem",
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, PostgresStoreError::Tls(TlsError::ReadRootCert { .. })),
        "{err:?}"
    );
    assert!(chain(&err).contains("/nonexistent/bq/root.pem"));
}
