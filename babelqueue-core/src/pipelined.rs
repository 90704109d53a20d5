//! Store writes sent with the runtime's ack, in one round trip.
//!
//! When a dedupe store and the transport live on the same server (a Redis store and the
//! Redis transport on one Redis, say), the guard's `remember` after a successful handler
//! need not be a round trip of its own: under the consume runtime, the guard hands it over
//! as a [`PipelinedWrite`], and the runtime sends it **before** the message's ack, on the
//! transport's connection, in the same round trip (Redis: one pipeline, `SET … NX` then
//! `LREM`). The id is remembered before the message leaves the in-flight list, exactly as
//! when the guard remembers it itself, and the in-process turn on the key is held until
//! both are done, so a duplicate reserved meanwhile by another worker of the same consumer
//! waits and is then skipped.
//!
//! A store offers it with [`AsyncStore::pipelined_remember`](crate::AsyncStore::pipelined_remember)
//! and a transport accepts it when its `pipeline_server`
//! names the same server. Anything else (no runtime, another server, a wrapper that does
//! not forward it) keeps the plain `remember` call: nothing changes for a guard called by
//! hand.
//!
//! ```
//! use babelqueue_core::pipelined::PipelinedWrite;
//! let w = PipelinedWrite::new("127.0.0.1:6379/0", ["SET", "bq:idemp:id-A", "1", "NX"]);
//! assert_eq!(w.server(), "127.0.0.1:6379/0");
//! assert_eq!(w.args()[1], b"bq:idemp:id-A");
//! ```

use std::sync::Arc;

/// One store command (its arguments, the command name first) for the server named by
/// [`server`](Self::server), to be sent by the transport before an ack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelinedWrite {
    server: Arc<str>,
    args: Vec<Vec<u8>>,
}

impl PipelinedWrite {
    /// A command for `server` (an identity both sides agree on, e.g. Redis's
    /// `host:port/db`): `args[0]` is the command name.
    pub fn new<A: AsRef<[u8]>>(
        server: impl Into<Arc<str>>,
        args: impl IntoIterator<Item = A>,
    ) -> Self {
        PipelinedWrite {
            server: server.into(),
            args: args.into_iter().map(|a| a.as_ref().to_vec()).collect(),
        }
    }

    /// The server this command must run on.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The command and its arguments.
    pub fn args(&self) -> &[Vec<u8>] {
        &self.args
    }
}
