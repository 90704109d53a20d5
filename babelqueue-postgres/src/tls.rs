//! TLS for the PostgreSQL connections: libpq's `sslmode` and `sslrootcert`, with
//! rustls (feature `rustls`).
//!
//! # `sslmode`, exactly as libpq reads it
//!
//! | `sslmode` | TLS | server certificate chain | host name checked |
//! | --- | --- | --- | --- |
//! | `disable` | never | – | – |
//! | `allow` | tried; plaintext when the server declines it | verified only when a root certificate is configured | no |
//! | `prefer` (the default) | tried; plaintext when the server declines it | verified only when a root certificate is configured | no |
//! | `require` | required | verified only when a root certificate is configured | no |
//! | `verify-ca` | required | verified | no |
//! | `verify-full` | required | verified | yes |
//!
//! A root certificate is *configured* when `sslrootcert=<file>` is in the URL, when
//! [`PostgresStoreBuilder::root_certificates_pem`](crate::PostgresStoreBuilder::root_certificates_pem)
//! was called, or when libpq's default file `~/.postgresql/root.crt` exists. `verify-ca`
//! and `verify-full` without one are an error ([`TlsError::RootCertMissing`]), as with
//! libpq. `sslrootcert=system` trusts the operating system's roots and, as with libpq,
//! makes `verify-full` the default and any weaker mode an error.
//!
//! Differences from libpq: `allow` tries TLS first (libpq tries plaintext first; both
//! accept either); under `allow`/`prefer`, a server that accepts TLS but whose handshake
//! then fails (for example a certificate that does not verify against the configured
//! root) is an error, where libpq would retry in plaintext. The `PGSSLMODE` and
//! `PGSSLROOTCERT` environment variables are not read.
//!
//! Without the `rustls` feature there is no TLS: `disable`, `allow` and `prefer` connect
//! in plaintext (an explicit `allow`/`prefer` logs a warning), and `require`,
//! `verify-ca` and `verify-full` are refused with [`TlsError::NotEnabled`] instead of
//! silently connecting in plaintext.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// How a connection uses TLS: libpq's `sslmode` (see the [module](self) for the exact
/// meaning of each mode).
///
/// ```
/// use babelqueue_postgres::SslMode;
///
/// assert_eq!("verify-full".parse::<SslMode>().unwrap(), SslMode::VerifyFull);
/// assert_eq!(SslMode::Require.to_string(), "require");
/// assert!("required".parse::<SslMode>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, else plaintext (tried in TLS first).
    Allow,
    /// TLS when the server offers it, else plaintext. The default.
    Prefer,
    /// TLS or fail; the chain is verified only when a root certificate is configured.
    Require,
    /// TLS or fail, with a server certificate chain that verifies against the root
    /// certificates; the host name is not checked.
    VerifyCa,
    /// TLS or fail, with a verified chain whose certificate names the host connected to.
    VerifyFull,
}

impl SslMode {
    /// The libpq spelling (`verify-full`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether the connection fails rather than fall back to plaintext.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = TlsError;

    fn from_str(s: &str) -> Result<Self, TlsError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => return Err(TlsError::InvalidSslMode(other.to_owned())),
        })
    }
}

/// A TLS setting that cannot be honoured. Returned by
/// [`PostgresStoreBuilder::connect`](crate::PostgresStoreBuilder::connect) before any
/// connection is attempted (a handshake that fails later, such as a certificate that
/// does not verify, is a connection error of the pool).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// `sslmode` is not one of libpq's six values.
    #[error(
        "invalid sslmode {0:?}: expected disable, allow, prefer, require, verify-ca or verify-full"
    )]
    InvalidSslMode(String),
    /// The mode needs TLS and this build has none.
    #[error(
        "sslmode={0} needs TLS, which this build does not have: enable the `rustls` feature \
         of babelqueue (or babelqueue-postgres), or use sslmode=disable"
    )]
    NotEnabled(SslMode),
    /// `verify-ca`/`verify-full` without any root certificate.
    #[error(
        "sslmode={mode} verifies the server certificate, but no root certificate is configured \
         and {default} does not exist: set sslrootcert=<PEM file> (or sslrootcert=system), \
         pass the roots to root_certificates_pem, or use sslmode=require"
    )]
    RootCertMissing {
        /// The requested mode.
        mode: SslMode,
        /// libpq's default root file that was looked for.
        default: String,
    },
    /// `sslrootcert=system` with a mode weaker than `verify-full`.
    #[error("sslrootcert=system requires sslmode=verify-full (got sslmode={0})")]
    SystemRootsNeedVerifyFull(SslMode),
    /// The root certificate file could not be read.
    #[error("cannot read the root certificate file {}", path.display())]
    ReadRootCert {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No usable certificate in the PEM given.
    #[error("no usable PEM certificate in {0}")]
    NoCertificate(String),
    /// The operating system's root store could not be loaded.
    #[error("no root certificate could be loaded from the operating system's store")]
    SystemRoots,
    /// rustls refused the configuration.
    #[error("the TLS configuration was refused")]
    Config(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The `sslmode` and `sslrootcert` parameters, taken out of a connection string that
/// `tokio_postgres` then parses (it knows neither `verify-*` nor `sslrootcert`).
#[derive(Debug, Default)]
pub(crate) struct TlsParams {
    pub mode: Option<SslMode>,
    pub root_cert: Option<String>,
}

/// Splits `sslmode`/`sslrootcert` off a `postgres://` URL or a `key=value` string.
pub(crate) fn split_params(conn: &str) -> Result<(String, TlsParams), TlsError> {
    let mut params = TlsParams::default();
    let mut take = |key: &str, value: String| -> Result<bool, TlsError> {
        match key {
            "sslmode" => params.mode = Some(value.parse()?),
            "sslrootcert" => params.root_cert = Some(value),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        match conn.split_once('?') {
            None => conn.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&') {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    if !take(&percent_decode(k), percent_decode(v))? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for (raw, key, value) in key_values(conn) {
            if !take(key, value)? {
                kept.push(raw);
            }
        }
        kept.join(" ")
    };
    Ok((rest, params))
}

/// `%XX` decoding of a URL query component (`+` is kept: libpq does not read it as a
/// space either).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `key=value` pairs of a libpq keyword string: (raw text, key, unquoted value).
/// Values may be single-quoted with backslash escapes; a malformed rest is kept raw
/// for `tokio_postgres` to report.
fn key_values(s: &str) -> Vec<(&str, &str, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    let b = s.as_bytes();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= b.len() {
            return out;
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &s[start..i];
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= b.len() || b[i] != b'=' {
            out.push((&s[start..], "", String::new()));
            return out;
        }
        i += 1;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = Vec::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                value.push(b[i]);
                i += 1;
            }
            i += 1; // closing quote (or past the end)
        } else {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                value.push(b[i]);
                i += 1;
            }
        }
        let end = i.min(b.len());
        out.push((
            &s[start..end],
            key,
            String::from_utf8_lossy(&value).into_owned(),
        ));
    }
}

/// libpq's default root certificate file, `~/.postgresql/root.crt`.
#[cfg(feature = "rustls")]
fn default_root_file() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".postgresql").join("root.crt"))
}

/// What the pool connects with.
pub(crate) enum Connector {
    /// No TLS at all (`disable`, or no `rustls` feature).
    Plain,
    /// rustls.
    #[cfg(feature = "rustls")]
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

/// The TLS inputs of the builder.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    pub mode: Option<SslMode>,
    #[cfg(feature = "rustls")]
    pub root_pem: Vec<Vec<u8>>,
    #[cfg(feature = "rustls")]
    pub client_config: Option<std::sync::Arc<rustls::ClientConfig>>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TlsSettings");
        d.field("mode", &self.mode);
        #[cfg(feature = "rustls")]
        d.field("root_pem", &self.root_pem.len())
            .field("client_config", &self.client_config.is_some());
        d.finish()
    }
}

/// Decides the `tokio_postgres` mode and the connector for `params` (from the URL) and
/// the builder's settings.
pub(crate) fn resolve(
    params: TlsParams,
    settings: &TlsSettings,
) -> Result<(tokio_postgres::config::SslMode, Connector), TlsError> {
    use tokio_postgres::config::SslMode as Pg;

    let system = params.root_cert.as_deref() == Some("system");
    let explicit = settings.mode.or(params.mode);
    let mode = match explicit {
        Some(m) => m,
        None if system => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if system && mode != SslMode::VerifyFull && mode != SslMode::Disable {
        return Err(TlsError::SystemRootsNeedVerifyFull(mode));
    }
    let pg_mode = match mode {
        SslMode::Disable => return Ok((Pg::Disable, Connector::Plain)),
        SslMode::Allow | SslMode::Prefer => Pg::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Pg::Require,
    };

    #[cfg(not(feature = "rustls"))]
    {
        let _ = settings;
        if mode.requires_tls() {
            return Err(TlsError::NotEnabled(mode));
        }
        if explicit.is_some() {
            tracing::warn!(
                sslmode = %mode,
                "babelqueue-postgres was built without the `rustls` feature: connecting in plaintext"
            );
        }
        Ok((pg_mode, Connector::Plain))
    }

    #[cfg(feature = "rustls")]
    {
        if let Some(config) = &settings.client_config {
            let config = rustls::ClientConfig::clone(config);
            return Ok((
                pg_mode,
                Connector::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(config)),
            ));
        }
        let roots = rustls_impl::roots(params.root_cert.as_deref(), &settings.root_pem)?;
        let verify = match (mode, roots.is_some()) {
            (SslMode::VerifyFull, true) => rustls_impl::Verify::Full,
            (SslMode::VerifyFull | SslMode::VerifyCa, false) => {
                return Err(TlsError::RootCertMissing {
                    mode,
                    default: default_root_file().map_or_else(
                        || "~/.postgresql/root.crt".into(),
                        |p| p.display().to_string(),
                    ),
                });
            }
            // libpq: with a root certificate, every TLS mode verifies the chain.
            (_, true) => rustls_impl::Verify::Chain,
            (_, false) => rustls_impl::Verify::Nothing,
        };
        let config = rustls_impl::client_config(verify, roots)?;
        Ok((
            pg_mode,
            Connector::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(config)),
        ))
    }
}

#[cfg(feature = "rustls")]
mod rustls_impl {
    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{
        CertificateError, ClientConfig, DigitallySignedStruct, Error, RootCertStore,
        SignatureScheme,
    };

    use super::{TlsError, default_root_file};

    pub(super) enum Verify {
        Nothing,
        Chain,
        Full,
    }

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn add_pem(store: &mut RootCertStore, pem: &[u8], origin: &str) -> Result<(), TlsError> {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|_| TlsError::NoCertificate(origin.to_owned()))?;
            store.add(cert).map_err(|e| TlsError::Config(Box::new(e)))?;
            added += 1;
        }
        if added == 0 {
            return Err(TlsError::NoCertificate(origin.to_owned()));
        }
        Ok(())
    }

    /// The configured roots: `sslrootcert` (a file or `system`), the builder's PEM, else
    /// libpq's default file when it exists; `None` when there are none.
    pub(super) fn roots(
        root_cert: Option<&str>,
        pem: &[Vec<u8>],
    ) -> Result<Option<RootCertStore>, TlsError> {
        let mut store = RootCertStore::empty();
        let mut configured = false;
        match root_cert {
            Some("system") => {
                let loaded = rustls_native_certs::load_native_certs();
                let (added, _) = store.add_parsable_certificates(loaded.certs);
                if added == 0 {
                    return Err(TlsError::SystemRoots);
                }
                configured = true;
            }
            Some(path) => {
                let bytes = std::fs::read(path).map_err(|source| TlsError::ReadRootCert {
                    path: path.into(),
                    source,
                })?;
                add_pem(&mut store, &bytes, path)?;
                configured = true;
            }
            None => {}
        }
        for (i, p) in pem.iter().enumerate() {
            add_pem(&mut store, p, &format!("root_certificates_pem #{}", i + 1))?;
            configured = true;
        }
        if !configured && let Some(path) = default_root_file().filter(|p| p.is_file()) {
            let bytes = std::fs::read(&path).map_err(|source| TlsError::ReadRootCert {
                path: path.clone(),
                source,
            })?;
            add_pem(&mut store, &bytes, &path.display().to_string())?;
            configured = true;
        }
        Ok(configured.then_some(store))
    }

    pub(super) fn client_config(
        verify: Verify,
        roots: Option<RootCertStore>,
    ) -> Result<ClientConfig, TlsError> {
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(Box::new(e)))?;
        let roots = Arc::new(roots.unwrap_or_else(RootCertStore::empty));
        let config = match verify {
            Verify::Full => builder.with_root_certificates(roots).with_no_client_auth(),
            Verify::Chain => {
                let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
                    .build()
                    .map_err(|e| TlsError::Config(Box::new(e)))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
                    .with_no_client_auth()
            }
            Verify::Nothing => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoChain(provider)))
                .with_no_client_auth(),
        };
        Ok(config)
    }

    /// `verify-ca` (and a root-configured `require`/`prefer`): the chain must verify, the
    /// name is not checked.
    #[derive(Debug)]
    struct ChainOnly(Arc<WebPkiServerVerifier>);

    impl ServerCertVerifier for ChainOnly {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            match self
                .0
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            {
                Err(Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            self.0.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            self.0.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.supported_verify_schemes()
        }
    }

    /// `require`/`prefer`/`allow` without a root certificate: encrypted, any server
    /// certificate accepted (the handshake signature is still checked).
    #[derive(Debug)]
    struct NoChain(Arc<CryptoProvider>);

    impl ServerCertVerifier for NoChain {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_params_are_split_off_and_decoded() {
        let (rest, p) = split_params(
            "postgres://u@db:5432/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@db:5432/app?application_name=x");
        assert_eq!(p.mode, Some(SslMode::VerifyFull));
        assert_eq!(p.root_cert.as_deref(), Some("/etc/ca.pem"));

        let (rest, p) = split_params("postgresql://db/app?sslmode=disable").unwrap();
        assert_eq!(rest, "postgresql://db/app");
        assert_eq!(p.mode, Some(SslMode::Disable));
        assert!(p.root_cert.is_none());
    }

    #[test]
    fn key_value_params_are_split_off_with_quotes() {
        let (rest, p) = split_params(
            "host=db user=app sslmode = verify-ca sslrootcert='/my certs/ca.pem' dbname=x",
        )
        .unwrap();
        assert_eq!(rest, "host=db user=app dbname=x");
        assert_eq!(p.mode, Some(SslMode::VerifyCa));
        assert_eq!(p.root_cert.as_deref(), Some("/my certs/ca.pem"));
    }

    #[test]
    fn an_unknown_mode_is_a_clear_error() {
        let err = split_params("postgres://db/app?sslmode=required").unwrap_err();
        assert!(matches!(err, TlsError::InvalidSslMode(ref m) if m == "required"));
        assert!(err.to_string().contains("verify-full"));
    }

    #[test]
    fn system_roots_need_verify_full() {
        let params = TlsParams {
            mode: Some(SslMode::Require),
            root_cert: Some("system".into()),
        };
        let err = resolve(params, &TlsSettings::default()).err().unwrap();
        assert!(matches!(
            err,
            TlsError::SystemRootsNeedVerifyFull(SslMode::Require)
        ));
    }

    #[test]
    fn disable_is_plaintext() {
        let params = TlsParams {
            mode: Some(SslMode::Disable),
            root_cert: None,
        };
        let (mode, conn) = resolve(params, &TlsSettings::default()).unwrap();
        assert_eq!(mode, tokio_postgres::config::SslMode::Disable);
        assert!(matches!(conn, Connector::Plain));
    }

    #[cfg(not(feature = "rustls"))]
    #[test]
    fn require_without_the_feature_is_refused() {
        for m in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
            let params = TlsParams {
                mode: Some(m),
                root_cert: None,
            };
            let err = resolve(params, &TlsSettings::default()).err().unwrap();
            assert!(matches!(err, TlsError::NotEnabled(got) if got == m));
            assert!(err.to_string().contains("`rustls` feature"));
        }
    }

    #[cfg(feature = "rustls")]
    #[test]
    fn verify_without_roots_is_refused_and_a_missing_file_named() {
        // HOME points nowhere, so libpq's default file is absent.
        let params = TlsParams {
            mode: Some(SslMode::VerifyCa),
            root_cert: Some("/nonexistent/babelqueue/ca.pem".into()),
        };
        let err = resolve(params, &TlsSettings::default()).err().unwrap();
        assert!(matches!(err, TlsError::ReadRootCert { .. }), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/babelqueue/ca.pem"));

        let settings = TlsSettings {
            root_pem: vec![b"not a pem".to_vec()],
            ..TlsSettings::default()
        };
        let params = TlsParams {
            mode: Some(SslMode::VerifyFull),
            root_cert: None,
        };
        let err = resolve(params, &settings).err().unwrap();
        assert!(matches!(err, TlsError::NoCertificate(_)), "{err:?}");
    }
}
