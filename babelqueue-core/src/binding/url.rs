//! `BROKER_URL` parsing, as the family's SDKs write the URLs.

use std::fmt;

/// The schemes [`BrokerUrl::parse`] knows, for error messages.
pub const SCHEMES: &str = "redis://, rediss://, amqp://, amqps://, sqs://, kafka://";

/// A parsed `BROKER_URL`: the scheme decides the broker, as in the other SDKs.
///
/// | URL | variant |
/// | --- | --- |
/// | `redis://…`, `rediss://…` | [`BrokerUrl::Redis`] (the URL is handed to the Redis client whole) |
/// | `amqp://user:pass@host:port/vhost`, `amqps://…` | [`BrokerUrl::Amqp`] |
/// | `sqs://<region>?endpoint=<url>&…` | [`BrokerUrl::Sqs`] |
/// | `kafka://host:port[,host:port]` | [`BrokerUrl::Kafka`] (group `babelqueue` unless `?group=`) |
///
/// Parsing never panics; an unknown scheme is an error that names the known ones. The
/// `Display` form hides passwords.
///
/// ```
/// use babelqueue_core::binding::BrokerUrl;
///
/// let url = BrokerUrl::parse("amqp://guest:guest@127.0.0.1:5672/%2f")?;
/// let BrokerUrl::Amqp(amqp) = &url else { unreachable!() };
/// assert_eq!((amqp.host.as_str(), amqp.port, amqp.vhost.as_str()), ("127.0.0.1", 5672, "/"));
/// assert_eq!(url.to_string(), "amqp://guest:***@127.0.0.1:5672/%2F");
///
/// let err = BrokerUrl::parse("nats://x").unwrap_err();
/// assert!(err.to_string().contains("amqp://"));
/// # Ok::<(), babelqueue_core::binding::BrokerUrlError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BrokerUrl {
    /// Redis (`redis://`, `rediss://` for TLS).
    Redis {
        /// The URL as given (the Redis client parses it).
        url: String,
        /// `rediss://`.
        tls: bool,
    },
    /// RabbitMQ over AMQP 0-9-1.
    Amqp(AmqpUrl),
    /// Amazon SQS.
    Sqs(SqsUrl),
    /// Apache Kafka.
    Kafka(KafkaUrl),
}

/// The parts of an `amqp://` / `amqps://` URL, with the defaults of the Python SDK's pika:
/// user and password `guest`, host `localhost`, port 5672 (5671 for `amqps`), vhost `/`
/// (also for an empty path). User, password and vhost are percent-decoded (`%2f` is `/`).
///
/// ```
/// use babelqueue_core::binding::{AmqpUrl, BrokerUrl};
/// let BrokerUrl::Amqp(u) = BrokerUrl::parse("amqps://rabbit")? else { unreachable!() };
/// assert_eq!((u.user.as_str(), u.port, u.vhost.as_str(), u.tls), ("guest", 5671, "/", true));
/// # Ok::<(), babelqueue_core::binding::BrokerUrlError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpUrl {
    /// `amqps://`.
    pub tls: bool,
    /// The user name (decoded).
    pub user: String,
    /// The password (decoded).
    pub password: String,
    /// The host (an IPv6 address without its brackets).
    pub host: String,
    /// The port.
    pub port: u16,
    /// The virtual host (decoded).
    pub vhost: String,
    /// The query parameters (decoded), e.g. `heartbeat`, in order.
    pub query: Vec<(String, String)>,
}

impl AmqpUrl {
    /// The URL again, in the normal form an AMQP client parses (user, password, host and
    /// vhost percent-encoded, an IPv6 host in brackets, query dropped); parsing it gives
    /// this `AmqpUrl` back (without its query).
    ///
    /// ```
    /// use babelqueue_core::binding::BrokerUrl;
    /// let BrokerUrl::Amqp(u) = BrokerUrl::parse("amqp://a%40b:p@h/")? else { unreachable!() };
    /// assert_eq!(u.to_url(), "amqp://a%40b:p@h:5672/%2F");
    /// # Ok::<(), babelqueue_core::binding::BrokerUrlError>(())
    /// ```
    pub fn to_url(&self) -> String {
        self.render(&encode(&self.password))
    }

    fn render(&self, password: &str) -> String {
        let ipv6 = self.host.contains(':')
            && self
                .host
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        let host = if ipv6 {
            format!("[{}]", self.host)
        } else {
            encode(&self.host)
        };
        format!(
            "{}://{}:{}@{}:{}/{}",
            if self.tls { "amqps" } else { "amqp" },
            encode(&self.user),
            password,
            host,
            self.port,
            encode(&self.vhost)
        )
    }
}

impl fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpUrl")
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("password", &"***")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("vhost", &self.vhost)
            .field("query", &self.query)
            .finish()
    }
}

/// The parts of an `sqs://[region][?endpoint=…&prefix=…&fifo=1&group_id=…&wait_time=20&visibility_timeout=…&content_dedup=1]`
/// URL, as the Python SDK reads them (credentials come from the AWS default chain). A
/// boolean is true for `1`, `true`, `yes`, `on` (any case).
///
/// ```
/// use babelqueue_core::binding::BrokerUrl;
/// let BrokerUrl::Sqs(u) = BrokerUrl::parse("sqs://us-east-1?endpoint=http://localhost:4566&fifo=true")? else {
///     unreachable!()
/// };
/// assert_eq!(u.region.as_deref(), Some("us-east-1"));
/// assert_eq!(u.endpoint.as_deref(), Some("http://localhost:4566"));
/// assert!(u.fifo);
/// # Ok::<(), babelqueue_core::binding::BrokerUrlError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SqsUrl {
    /// The AWS region (the URL's host), if any.
    pub region: Option<String>,
    /// `endpoint`: a custom endpoint (LocalStack, …).
    pub endpoint: Option<String>,
    /// `prefix`: a queue URL prefix (no `GetQueueUrl` call).
    pub prefix: Option<String>,
    /// `fifo`: FIFO queues.
    pub fifo: bool,
    /// `group_id`: the FIFO message group (default: the queue name).
    pub group_id: Option<String>,
    /// `wait_time`: the long-poll wait in seconds.
    pub wait_time: Option<u32>,
    /// `visibility_timeout`: seconds.
    pub visibility_timeout: Option<u32>,
    /// `content_dedup`: content-based deduplication on FIFO queues.
    pub content_dedup: bool,
}

/// The parts of a `kafka://host:port[,host:port][?group=…]` URL: the bootstrap brokers
/// (port 9092 when left out, `localhost:9092` when none) and the consumer group
/// (`babelqueue` by default).
///
/// ```
/// use babelqueue_core::binding::BrokerUrl;
/// let BrokerUrl::Kafka(k) = BrokerUrl::parse("kafka://k1:9092,k2")? else { unreachable!() };
/// assert_eq!(k.bootstrap_servers(), "k1:9092,k2:9092");
/// assert_eq!(k.group, "babelqueue");
/// # Ok::<(), babelqueue_core::binding::BrokerUrlError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaUrl {
    /// The bootstrap brokers, `(host, port)`.
    pub brokers: Vec<(String, u16)>,
    /// The consumer group.
    pub group: String,
}

impl KafkaUrl {
    /// The brokers as a `bootstrap.servers` list.
    ///
    /// ```
    /// use babelqueue_core::binding::BrokerUrl;
    /// let BrokerUrl::Kafka(k) = BrokerUrl::parse("kafka://")? else { unreachable!() };
    /// assert_eq!(k.bootstrap_servers(), "localhost:9092");
    /// # Ok::<(), babelqueue_core::binding::BrokerUrlError>(())
    /// ```
    pub fn bootstrap_servers(&self) -> String {
        self.brokers
            .iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("[{h}]:{p}")
                } else {
                    format!("{h}:{p}")
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Why a `BROKER_URL` was refused.
///
/// ```
/// use babelqueue_core::binding::{BrokerUrl, BrokerUrlError};
/// assert!(matches!(BrokerUrl::parse("localhost:6379"), Err(BrokerUrlError::NoScheme(_))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerUrlError {
    /// No `scheme://`.
    #[error("BROKER_URL {0:?} has no scheme; use one of {SCHEMES}")]
    NoScheme(String),
    /// A scheme this SDK has no broker for.
    #[error("BROKER_URL scheme {0:?} is not supported; use one of {SCHEMES}")]
    UnknownScheme(String),
    /// A known scheme with a malformed rest.
    #[error("BROKER_URL ({scheme}://): {reason}")]
    Invalid {
        /// The scheme.
        scheme: String,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(scheme: &str, reason: impl Into<String>) -> BrokerUrlError {
    BrokerUrlError::Invalid {
        scheme: scheme.to_owned(),
        reason: reason.into(),
    }
}

impl BrokerUrl {
    /// Parses a `BROKER_URL` (see the type's table). The scheme is case-insensitive.
    ///
    /// ```
    /// use babelqueue_core::binding::BrokerUrl;
    /// assert!(matches!(BrokerUrl::parse("rediss://:pw@cache:6380/0")?, BrokerUrl::Redis { tls: true, .. }));
    /// assert!(BrokerUrl::parse("amqp://h:99999").is_err());
    /// # Ok::<(), babelqueue_core::binding::BrokerUrlError>(())
    /// ```
    pub fn parse(url: &str) -> Result<Self, BrokerUrlError> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(BrokerUrlError::NoScheme(redact(url)));
        };
        let scheme = scheme.to_ascii_lowercase();
        match scheme.as_str() {
            "redis" | "rediss" => Ok(BrokerUrl::Redis {
                url: format!("{scheme}://{rest}"),
                tls: scheme == "rediss",
            }),
            "amqp" | "amqps" => parse_amqp(&scheme, rest).map(BrokerUrl::Amqp),
            "sqs" => parse_sqs(rest).map(BrokerUrl::Sqs),
            "kafka" => parse_kafka(rest).map(BrokerUrl::Kafka),
            _ => Err(BrokerUrlError::UnknownScheme(scheme)),
        }
    }

    /// The scheme's broker name: `redis`, `amqp`, `sqs` or `kafka`.
    ///
    /// ```
    /// use babelqueue_core::binding::BrokerUrl;
    /// assert_eq!(BrokerUrl::parse("amqps://h")?.broker(), "amqp");
    /// # Ok::<(), babelqueue_core::binding::BrokerUrlError>(())
    /// ```
    pub fn broker(&self) -> &'static str {
        match self {
            BrokerUrl::Redis { .. } => "redis",
            BrokerUrl::Amqp(_) => "amqp",
            BrokerUrl::Sqs(_) => "sqs",
            BrokerUrl::Kafka(_) => "kafka",
        }
    }
}

impl std::str::FromStr for BrokerUrl {
    type Err = BrokerUrlError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BrokerUrl::parse(s)
    }
}

impl fmt::Display for BrokerUrl {
    /// The URL with any password replaced by `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrokerUrl::Redis { url, .. } => f.write_str(&redact(url)),
            BrokerUrl::Amqp(a) => f.write_str(&a.render("***")),
            BrokerUrl::Sqs(s) => {
                write!(f, "sqs://{}", s.region.as_deref().unwrap_or(""))?;
                if let Some(e) = &s.endpoint {
                    write!(f, "?endpoint={}", encode(e))?;
                }
                Ok(())
            }
            BrokerUrl::Kafka(k) => write!(f, "kafka://{}", k.bootstrap_servers()),
        }
    }
}

impl fmt::Debug for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrokerUrl::Redis { url, tls } => f
                .debug_struct("Redis")
                .field("url", &redact(url))
                .field("tls", tls)
                .finish(),
            BrokerUrl::Amqp(a) => f.debug_tuple("Amqp").field(a).finish(),
            BrokerUrl::Sqs(s) => f.debug_tuple("Sqs").field(s).finish(),
            BrokerUrl::Kafka(k) => f.debug_tuple("Kafka").field(k).finish(),
        }
    }
}

/// `url` with the password of its user info replaced by `***`.
fn redact(url: &str) -> String {
    let (head, rest) = match url.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{head}{user}:***@{host}{}", &rest[end..]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Percent-decodes `s` (`+` stays `+`); `None` for a bad escape or bytes that are not UTF-8.
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes everything but unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Splits `rest` into (authority, path, query) at the first `/` and `?` (a `#…` dropped).
fn split_rest(rest: &str) -> (&str, Option<&str>, &str) {
    let rest = rest.split('#').next().unwrap_or_default();
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    match before_query.split_once('/') {
        Some((auth, path)) => (auth, Some(path), query),
        None => (before_query, None, query),
    }
}

fn query_pairs(scheme: &str, query: &str) -> Result<Vec<(String, String)>, BrokerUrlError> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let dec = |s: &str| {
                decode(&s.replace('+', " ")).ok_or_else(|| {
                    invalid(scheme, format!("bad percent-encoding in query {pair:?}"))
                })
            };
            Ok((dec(k)?, dec(v)?))
        })
        .collect()
}

/// `host[:port]`, `[v6][:port]`.
fn host_port(scheme: &str, s: &str, default_port: u16) -> Result<(String, u16), BrokerUrlError> {
    let (host, port) = if let Some(v6) = s.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| invalid(scheme, format!("unclosed '[' in host {s:?}")))?;
        match after {
            "" => (host, None),
            p => (
                host,
                Some(p.strip_prefix(':').ok_or_else(|| {
                    invalid(scheme, format!("unexpected {p:?} after the IPv6 host"))
                })?),
            ),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port =
        match port {
            None | Some("") => default_port,
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                invalid(scheme, format!("port {p:?} is not a number in 1..=65535"))
            })?,
        };
    Ok((host.to_owned(), port))
}

fn parse_amqp(scheme: &str, rest: &str) -> Result<AmqpUrl, BrokerUrlError> {
    let tls = scheme == "amqps";
    let (authority, path, query) = split_rest(rest);
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let dec = |what: &str, s: &str| {
        decode(s).ok_or_else(|| invalid(scheme, format!("bad percent-encoding in the {what}")))
    };
    let (user, password) = match userinfo {
        None => ("guest".to_owned(), "guest".to_owned()),
        Some(u) => match u.split_once(':') {
            Some((user, pass)) => (dec("user", user)?, dec("password", pass)?),
            None => (dec("user", u)?, "guest".to_owned()),
        },
    };
    let (host, port) = host_port(scheme, hostport, if tls { 5671 } else { 5672 })?;
    let host = if host.is_empty() {
        "localhost".to_owned()
    } else {
        dec("host", &host)?
    };
    let vhost = match path {
        None | Some("") => "/".to_owned(),
        Some(p) => dec("vhost", p)?,
    };
    Ok(AmqpUrl {
        tls,
        user,
        password,
        host,
        port,
        vhost,
        query: query_pairs(scheme, query)?,
    })
}

fn parse_sqs(rest: &str) -> Result<SqsUrl, BrokerUrlError> {
    let (authority, _path, query) = split_rest(rest);
    let mut url = SqsUrl {
        region: (!authority.is_empty()).then(|| authority.to_owned()),
        ..SqsUrl::default()
    };
    let truthy = |v: &str| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on");
    let number = |k: &str, v: &str| {
        v.parse::<u32>()
            .map_err(|_| invalid("sqs", format!("{k}={v:?} is not a whole number of seconds")))
    };
    let mut seen = std::collections::HashSet::new();
    for (k, v) in query_pairs("sqs", query)? {
        // The first value of a key wins (Python's `parse_qs(...)[key][0]`).
        if !seen.insert(k.clone()) {
            continue;
        }
        let some = |v: String| (!v.is_empty()).then_some(v);
        match k.as_str() {
            "endpoint" => url.endpoint = some(v),
            "prefix" => url.prefix = some(v),
            "group_id" => url.group_id = some(v),
            "fifo" => url.fifo = truthy(&v),
            "content_dedup" => url.content_dedup = truthy(&v),
            "wait_time" => url.wait_time = Some(number(&k, &v)?),
            "visibility_timeout" => url.visibility_timeout = Some(number(&k, &v)?),
            _ => {}
        }
    }
    Ok(url)
}

fn parse_kafka(rest: &str) -> Result<KafkaUrl, BrokerUrlError> {
    let (authority, _path, query) = split_rest(rest);
    let mut brokers = Vec::new();
    for part in authority
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (host, port) = host_port("kafka", part, 9092)?;
        if host.is_empty() {
            return Err(invalid("kafka", format!("broker {part:?} has no host")));
        }
        brokers.push((host, port));
    }
    if brokers.is_empty() {
        brokers.push(("localhost".to_owned(), 9092));
    }
    let mut group = crate::binding::kafka::DEFAULT_GROUP.to_owned();
    if let Some((_, g)) = query_pairs("kafka", query)?
        .into_iter()
        .find(|(k, v)| k == "group" && !v.is_empty())
    {
        group = g;
    }
    Ok(KafkaUrl { brokers, group })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amqp(url: &str) -> AmqpUrl {
        match BrokerUrl::parse(url) {
            Ok(BrokerUrl::Amqp(a)) => a,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn amqp_forms() {
        let a = amqp("amqp://guest:guest@127.0.0.1:5672/%2f");
        assert_eq!(
            (
                a.user.as_str(),
                a.password.as_str(),
                a.host.as_str(),
                a.port,
                a.vhost.as_str()
            ),
            ("guest", "guest", "127.0.0.1", 5672, "/")
        );
        let a = amqp("AMQP://u%3Ax:p%40ss@[::1]:5673/prod?heartbeat=30&x");
        assert_eq!((a.user.as_str(), a.password.as_str()), ("u:x", "p@ss"));
        assert_eq!(
            (a.host.as_str(), a.port, a.vhost.as_str()),
            ("::1", 5673, "prod")
        );
        assert_eq!(
            a.query,
            [
                ("heartbeat".into(), "30".into()),
                ("x".into(), String::new())
            ]
        );
        assert_eq!(a.to_url(), "amqp://u%3Ax:p%40ss@[::1]:5673/prod");
        assert_eq!(amqp(&a.to_url()), AmqpUrl { query: vec![], ..a });
        let a = amqp("amqp://");
        assert_eq!(
            (a.host.as_str(), a.port, a.vhost.as_str()),
            ("localhost", 5672, "/")
        );
        assert_eq!(amqp("amqp://h/").vhost, "/");
        assert_eq!(amqp("amqp://onlyuser@h").password, "guest");
        assert_eq!(amqp("amqp://h:").port, 5672);
    }

    #[test]
    fn to_url_round_trips_odd_hosts() {
        for url in [
            "amqp://u:p@h%2Fx%40y%3Az:1/v",
            "amqp://[fe80::1%25eth0]:5/",
            "amqps://%3A%3A@[::ffff:1.2.3.4]/%2F%2F",
        ] {
            let a = amqp(url);
            assert_eq!(amqp(&a.to_url()), a, "{url} -> {}", a.to_url());
        }
    }

    #[test]
    fn amqp_errors() {
        for bad in [
            "amqp://h:0",
            "amqp://h:x",
            "amqp://h:70000",
            "amqp://[::1",
            "amqp://[::1]x",
            "amqp://u:%zz@h",
            "amqp://h/%ff",
            "amqp://h/%",
        ] {
            let err = BrokerUrl::parse(bad).unwrap_err();
            assert!(
                matches!(err, BrokerUrlError::Invalid { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn display_and_debug_hide_passwords() {
        let u = BrokerUrl::parse("amqp://u:secret@h/v").unwrap();
        assert!(!u.to_string().contains("secret"));
        assert!(!format!("{u:?}").contains("secret"));
        let r = BrokerUrl::parse("redis://:secret@h:6379/0").unwrap();
        assert_eq!(r.to_string(), "redis://:***@h:6379/0");
        assert!(!format!("{r:?}").contains("secret"));
        let err = BrokerUrl::parse("h:secret@x").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn sqs_forms() {
        let BrokerUrl::Sqs(s) = BrokerUrl::parse(
            "sqs://eu-west-1?endpoint=http%3A%2F%2Flocalhost%3A4566&fifo=ON&wait_time=5&fifo=0&group_id=g",
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(s.endpoint.as_deref(), Some("http://localhost:4566"));
        assert!(s.fifo);
        assert_eq!(s.wait_time, Some(5));
        assert_eq!(s.group_id.as_deref(), Some("g"));
        assert_eq!(
            BrokerUrl::parse("sqs://").unwrap(),
            BrokerUrl::Sqs(SqsUrl::default())
        );
        assert!(BrokerUrl::parse("sqs://r?wait_time=-1").is_err());
    }

    #[test]
    fn kafka_forms() {
        let BrokerUrl::Kafka(k) = BrokerUrl::parse("kafka://a:1, b ,[::1]:3/x?group=g").unwrap()
        else {
            panic!()
        };
        assert_eq!(
            k.brokers,
            [("a".into(), 1), ("b".into(), 9092), ("::1".into(), 3)]
        );
        assert_eq!(k.group, "g");
        assert_eq!(k.bootstrap_servers(), "a:1,b:9092,[::1]:3");
        assert!(BrokerUrl::parse("kafka://:9092").is_err());
    }

    #[test]
    fn unknown_and_missing_schemes() {
        assert_eq!(
            BrokerUrl::parse("pulsar://x"),
            Err(BrokerUrlError::UnknownScheme("pulsar".into()))
        );
        let msg = BrokerUrl::parse("").unwrap_err().to_string();
        for s in [
            "redis://",
            "rediss://",
            "amqp://",
            "amqps://",
            "sqs://",
            "kafka://",
        ] {
            assert!(msg.contains(s), "{msg}");
        }
    }

    #[test]
    fn never_panics_on_odd_input() {
        for s in [
            "://",
            "amqp://@",
            "amqp://:@:",
            "amqp://[]",
            "amqp://[",
            "kafka://,,,",
            "sqs://?&&=",
            "sqs://?%",
            "amqp://é:é@é/é",
            "redis://",
            "a://b://c",
            "amqp://h?%zz",
        ] {
            let _ = BrokerUrl::parse(s).map(|u| (u.to_string(), format!("{u:?}")));
        }
    }
}
