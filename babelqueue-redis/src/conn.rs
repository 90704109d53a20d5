//! [`RedisConnection`]: one connection type for a single Redis server and a Redis Cluster,
//! shared by [`RedisTransport`](crate::RedisTransport) and [`RedisStore`](crate::RedisStore).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// An async Redis connection: to one server (multiplexed, or a reconnecting
/// [`ConnectionManager`]) or, with the `cluster` feature, to a Redis Cluster (commands are
/// routed by their keys' hash slot). Cheap to clone; clones share the connection.
///
/// Every key this crate writes for one queue shares the queue key's hash slot (see
/// [`hash_slot`](crate::hash_slot)), so every script runs on a Cluster unchanged.
///
/// ```no_run
/// # async fn demo() -> redis::RedisResult<()> {
/// use babelqueue_redis::{RedisConnection, RedisStore};
/// # #[cfg(feature = "cluster")] {
/// let conn = RedisConnection::cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]).await?;
/// let store = RedisStore::from_connection(conn);
/// # }
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub enum RedisConnection {
    /// A multiplexed connection to one server.
    Single(MultiplexedConnection),
    /// A reconnecting connection to one server.
    Manager(ConnectionManager),
    /// A Redis Cluster connection (feature `cluster`).
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            RedisConnection::Single(_) => "Single",
            RedisConnection::Manager(_) => "Manager",
            #[cfg(feature = "cluster")]
            RedisConnection::Cluster(_) => "Cluster",
        };
        f.debug_tuple("RedisConnection").field(&kind).finish()
    }
}

impl RedisConnection {
    /// Connects to a Redis Cluster through any of its `nodes` (`redis://host:port` URLs;
    /// the others are discovered). Feature `cluster`.
    #[cfg(feature = "cluster")]
    pub async fn cluster<I, T>(nodes: I) -> RedisResult<Self>
    where
        I: IntoIterator<Item = T>,
        T: redis::IntoConnectionInfo,
    {
        install_crypto_provider();
        let client = redis::cluster::ClusterClient::new(nodes)?;
        Ok(RedisConnection::Cluster(
            client.get_async_connection().await?,
        ))
    }

    /// Whether this is a Redis Cluster connection.
    pub fn is_cluster(&self) -> bool {
        match self {
            #[cfg(feature = "cluster")]
            RedisConnection::Cluster(_) => true,
            _ => false,
        }
    }
}

impl From<MultiplexedConnection> for RedisConnection {
    fn from(c: MultiplexedConnection) -> Self {
        RedisConnection::Single(c)
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(c: ConnectionManager) -> Self {
        RedisConnection::Manager(c)
    }
}

#[cfg(feature = "cluster")]
impl From<redis::cluster_async::ClusterConnection> for RedisConnection {
    fn from(c: redis::cluster_async::ClusterConnection) -> Self {
        RedisConnection::Cluster(c)
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Manager(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConnection::Manager(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            RedisConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Manager(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }
}

/// How the transport opens its connections: to one server, or to a Cluster.
#[derive(Clone)]
pub(crate) enum Connector {
    Single(Box<Client>),
    #[cfg(feature = "cluster")]
    Cluster(Vec<redis::ConnectionInfo>),
}

impl Connector {
    /// Opens a connection. `response: None` for the blocking-reserve connection (bounded per
    /// call instead).
    pub(crate) async fn connect(
        &self,
        connect: Duration,
        response: Option<Duration>,
    ) -> RedisResult<RedisConnection> {
        match self {
            Connector::Single(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect))
                    .set_response_timeout(response);
                Ok(RedisConnection::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ))
            }
            #[cfg(feature = "cluster")]
            Connector::Cluster(nodes) => {
                let mut builder = redis::cluster::ClusterClient::builder(nodes.clone())
                    .connection_timeout(connect)
                    .retries(2);
                if let Some(r) = response {
                    builder = builder.response_timeout(r);
                }
                let client = builder.build()?;
                Ok(RedisConnection::Cluster(
                    client.get_async_connection().await?,
                ))
            }
        }
    }

    /// The server's identity for pipelined store writes (`None` for a Cluster).
    pub(crate) fn server_identity(&self) -> Option<String> {
        match self {
            Connector::Single(client) => Some(server_identity(client.get_connection_info())),
            #[cfg(feature = "cluster")]
            Connector::Cluster(_) => None,
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Connector::Single(client) => {
                let info = client.get_connection_info();
                format!("{} db {}", info.addr(), info.redis_settings().db())
            }
            #[cfg(feature = "cluster")]
            Connector::Cluster(nodes) => format!(
                "cluster via {}",
                nodes
                    .iter()
                    .map(|n| n.addr().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

/// A [`Client`] for `url` with `TCP_NODELAY` set (or not) on its TCP connections.
pub(crate) fn client_for(url: &str, nodelay: bool) -> RedisResult<Client> {
    install_crypto_provider();
    let info = redis::IntoConnectionInfo::into_connection_info(url)?;
    Client::open(with_nodelay(info, nodelay))
}

/// `info` with `TCP_NODELAY` set to `nodelay` (its other TCP settings kept).
pub(crate) fn with_nodelay(info: redis::ConnectionInfo, nodelay: bool) -> redis::ConnectionInfo {
    let tcp = info.tcp_settings().clone().set_nodelay(nodelay);
    info.set_tcp_settings(tcp)
}

/// `host:port/db`: what a [`RedisStore`](crate::RedisStore) and a
/// [`RedisTransport`](crate::RedisTransport) compare to know they share one server and
/// database (a store there then has its `remember` sent with the transport's ack).
pub(crate) fn server_identity(info: &redis::ConnectionInfo) -> String {
    format!("{}/{}", info.addr(), info.redis_settings().db())
}

/// Makes rustls' process-wide crypto provider `ring` (the one this crate's `rustls` feature
/// brings), unless one is installed already. rustls picks a provider by itself only when
/// exactly one provider feature is enabled in the whole build; a dependency that enables
/// `aws-lc-rs` as well (the AWS SDK does, e.g. with babelqueue's `sqs` feature) makes it
/// panic at the first TLS connection instead. Every connect of this crate calls it; call it
/// yourself before building a TLS [`redis::Client`] by hand (`Client::build_with_tls`).
/// Without the `rustls` feature it does nothing.
///
/// ```
/// babelqueue_redis::install_crypto_provider();
/// ```
pub fn install_crypto_provider() {
    #[cfg(feature = "rustls")]
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: one provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
