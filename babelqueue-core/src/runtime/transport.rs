//! The [`Transport`] trait a broker binding implements, the reserved [`Delivery`], and the
//! header frame shared by the list-based transports.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::depth::QueueDepth;
use crate::envelope::Envelope;
use crate::handler::{BoxError, BoxFuture};
use crate::pipelined::PipelinedWrite;

/// Out-of-band message headers (trace context and the like), as a JSON object.
pub type Headers = Map<String, Value>;

/// The key that marks a header frame: `{"__bq_frame":1,"headers":{…},"body":"<envelope>"}`.
pub const FRAME_KEY: &str = "__bq_frame";

/// A transport operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The connection to the broker failed or was lost. The runtime backs off and
    /// reconnects; the operation may or may not have reached the broker.
    #[error("broker connection failed")]
    Connection(#[source] BoxError),
    /// The broker answered with an error, or the transport failed otherwise.
    #[error("broker error")]
    Backend(#[source] BoxError),
    /// A body given to a framing publish is not UTF-8 (a frame carries it as a string).
    #[error("a framed body must be UTF-8 (the frame carries it as a JSON string)")]
    BodyNotUtf8,
    /// The transport does not implement this operation.
    #[error("this transport does not support `{0}`")]
    Unsupported(&'static str),
}

impl TransportError {
    /// A connection failure (the runtime reconnects with backoff).
    pub fn connection(err: impl Into<BoxError>) -> Self {
        TransportError::Connection(err.into())
    }

    /// Any other broker failure.
    pub fn backend(err: impl Into<BoxError>) -> Self {
        TransportError::Backend(err.into())
    }

    /// Whether this is a lost or refused connection.
    pub fn is_connection(&self) -> bool {
        matches!(self, TransportError::Connection(_))
    }
}

/// One reserved message: the exact element the broker handed out (what [`Transport::ack`]
/// removes), the queue it came from, and — when the element is a header frame — the
/// unwrapped envelope body and headers.
///
/// ```
/// use babelqueue_core::runtime::Delivery;
/// let framed = br#"{"__bq_frame":1,"headers":{"traceparent":"00-ab"},"body":"{\"job\":\"x\"}"}"#;
/// let d = Delivery::new("orders", framed.to_vec(), 0);
/// assert_eq!(d.body(), br#"{"job":"x"}"#);
/// assert_eq!(d.headers().unwrap()["traceparent"], "00-ab");
/// assert_eq!(d.element(), framed);
///
/// let bare = Delivery::new("orders", b"{\"job\":\"x\"}".to_vec(), 0);
/// assert_eq!(bare.body(), bare.element());
/// assert!(bare.headers().is_none());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    queue: String,
    element: Arc<Vec<u8>>,
    tag: u64,
    frame: Option<(Headers, Vec<u8>)>,
}

impl Delivery {
    /// Wraps a reserved element. `tag` is a transport-specific receipt (e.g. a delivery
    /// tag); list transports that ack by element use `0`. A header frame is unwrapped.
    pub fn new(queue: impl Into<String>, element: Vec<u8>, tag: u64) -> Self {
        Self::from_shared(queue, Arc::new(element), tag)
    }

    /// Like [`new`](Self::new), sharing the element's buffer with the caller (an in-process
    /// transport keeps its in-flight copy without duplicating a large body).
    pub fn from_shared(queue: impl Into<String>, element: Arc<Vec<u8>>, tag: u64) -> Self {
        let frame = unframe(&element);
        Delivery {
            queue: queue.into(),
            element,
            tag,
            frame,
        }
    }

    /// The element's shared buffer.
    pub fn shared_element(&self) -> &Arc<Vec<u8>> {
        &self.element
    }

    /// The queue the message was reserved from.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The element exactly as the broker stored it (a bare envelope or a frame).
    pub fn element(&self) -> &[u8] {
        &self.element
    }

    /// The transport's receipt for this delivery.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The envelope bytes: the frame's `body`, or the whole element when it is not a frame.
    pub fn body(&self) -> &[u8] {
        match &self.frame {
            Some((_, body)) => body,
            None => &self.element,
        }
    }

    /// The frame's headers, when the element was a header frame.
    pub fn headers(&self) -> Option<&Headers> {
        self.frame.as_ref().map(|(h, _)| h)
    }
}

/// Encodes a list element: the body itself when `headers` is `None` or empty (the element
/// IS the envelope, byte for byte), else a header frame
/// `{"__bq_frame":1,"headers":{…},"body":"<body as a JSON string>"}`.
///
/// ```
/// use babelqueue_core::runtime::{encode_element, Headers};
/// assert_eq!(encode_element(b"{}", None)?, b"{}");
/// let mut h = Headers::new();
/// h.insert("traceparent".into(), "00-ab".into());
/// assert_eq!(
///     encode_element(b"{\"a\":1}", Some(&h))?,
///     br#"{"__bq_frame":1,"headers":{"traceparent":"00-ab"},"body":"{\"a\":1}"}"#
/// );
/// # Ok::<(), babelqueue_core::runtime::TransportError>(())
/// ```
#[doc(hidden)]
pub fn encode_element(body: &[u8], headers: Option<&Headers>) -> Result<Vec<u8>, TransportError> {
    let Some(headers) = headers.filter(|h| !h.is_empty()) else {
        return Ok(body.to_vec());
    };
    let body = std::str::from_utf8(body).map_err(|_| TransportError::BodyNotUtf8)?;
    let mut frame = Map::new();
    frame.insert(FRAME_KEY.to_owned(), Value::from(1));
    frame.insert("headers".to_owned(), Value::Object(headers.clone()));
    frame.insert("body".to_owned(), Value::String(body.to_owned()));
    serde_json::to_vec(&Value::Object(frame)).map_err(TransportError::backend)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Unwraps a header frame: `Some((headers, body))` when `element` is a JSON object whose
/// `__bq_frame` is `1` and whose `body` is a string; `None` for anything else (a bare
/// envelope, or bytes that are not a frame).
#[doc(hidden)]
pub fn unframe(element: &[u8]) -> Option<(Headers, Vec<u8>)> {
    let start = element.iter().position(|b| !b.is_ascii_whitespace())?;
    if element[start] != b'{' || !contains(element, b"\"__bq_frame\"") {
        return None;
    }
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(element) else {
        return None;
    };
    if obj.get(FRAME_KEY).and_then(Value::as_u64) != Some(1) {
        return None;
    }
    let body = match obj.shift_remove("body") {
        Some(Value::String(s)) => s.into_bytes(),
        _ => return None,
    };
    let headers = match obj.shift_remove("headers") {
        Some(Value::Object(h)) => h,
        _ => Headers::new(),
    };
    Some((headers, body))
}

/// What [`Transport::recover`] did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Recovered {
    /// Messages of dead consumers put back on the queue.
    pub requeued: usize,
    /// Messages recovered too many times: moved into this consumer's in-flight state, for
    /// the runtime to dead-letter (and ack).
    pub exhausted: Vec<Delivery>,
}

impl Recovered {
    /// A result (the struct is `#[non_exhaustive]`, so other crates build it here).
    pub fn new(requeued: usize, exhausted: Vec<Delivery>) -> Self {
        Recovered {
            requeued,
            exhausted,
        }
    }
}

/// A message broker binding: publish elements to a queue, reserve them into an in-flight
/// state that survives a worker crash, and ack the exact reserved message.
///
/// Implemented by [`InMemoryTransport`](super::InMemoryTransport) and by
/// `babelqueue_redis::RedisTransport` (the reliable-queue list pattern). The methods return
/// boxed futures so the trait is object safe: the [`App`](super::App) holds an
/// `Arc<dyn Transport>` and another broker can be plugged in without generics.
///
/// Contract for an implementation:
/// - [`publish_raw`](Self::publish_raw) stores `element` as is (no wrapping, no added
///   fields): what a consumer reserves is byte-identical;
/// - [`reserve`](Self::reserve) waits up to `timeout` (a zero timeout must not block) and
///   moves the message into an in-flight state from which only [`ack`](Self::ack) removes
///   it (so a crashed worker never loses it);
/// - connection failures are reported as [`TransportError::Connection`] and the next call
///   reconnects.
///
/// ```
/// use std::time::Duration;
/// use babelqueue_core::runtime::{InMemoryTransport, Transport};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let t = InMemoryTransport::new();
/// t.publish_raw("jobs", b"hello".to_vec()).await?;
/// let d = t.reserve("jobs", Duration::ZERO).await?.expect("one message");
/// assert_eq!(d.element(), b"hello");
/// assert_eq!(t.processing_len("jobs"), 1);
/// t.ack(&d).await?;
/// assert_eq!(t.processing_len("jobs"), 0);
/// # Ok::<(), babelqueue_core::runtime::TransportError>(())
/// # }).unwrap();
/// ```
pub trait Transport: Send + Sync + 'static {
    /// Appends `element` to `queue`, byte for byte.
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Reserves the next message of `queue`, waiting up to `timeout` (zero: do not wait).
    /// `Ok(None)` when none arrived in time.
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>>;

    /// Acknowledges a reserved message: removes exactly that message from the in-flight
    /// state.
    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Moves every message left in flight on `queue` (e.g. by a crashed worker) back to
    /// the head of the queue, returning how many. Only safe when no live worker is
    /// consuming `queue` (a live worker's in-flight message would be delivered twice; the
    /// idempotency guard absorbs that). Default: unsupported.
    fn requeue_processing<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        let _ = queue;
        Box::pin(async { Err(TransportError::Unsupported("requeue_processing")) })
    }

    /// Settles a reserved message by putting it back: atomically where the broker allows,
    /// removes `delivery` from the in-flight state AND schedules `element` (the updated or
    /// unchanged envelope or header frame) on [`delivery.queue()`](Delivery::queue) after
    /// `delay`. [`Duration::ZERO`] means ready now, appended at the tail of the queue.
    ///
    /// The runtime uses it for retries (the envelope with `attempts + 1`), deferrals of an
    /// id in flight elsewhere, dedupe-store outages and unknown URNs under
    /// [`Release`](super::UnknownUrnStrategy::Release).
    ///
    /// A transport with a delayed set overrides it: Redis runs one script (`LREM` of its
    /// own processing list + `ZADD {<queue>}:delayed` scored by the due time in Unix ms, or
    /// `RPUSH` when the delay is zero). The default publishes `element` with
    /// [`publish_raw`](Self::publish_raw) **after sleeping `delay`** (so the caller's task
    /// waits; a crash in between leaves the message in flight for recovery, never lost),
    /// then [`ack`](Self::ack)s the delivery; a crash between the two delivers it twice.
    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        element: Vec<u8>,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            self.publish_raw(delivery.queue(), element).await?;
            self.ack(delivery).await
        })
    }

    /// Moves up to `limit` delayed messages of `queue` whose due time has passed back to the
    /// tail of `queue`, atomically: safe when every consumer of the queue runs it at once
    /// (nothing moved twice, nothing lost). Returns how many moved.
    ///
    /// Default (no delayed set: [`requeue`](Self::requeue) waits in the caller): `Ok(0)`.
    fn promote_due<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        let _ = (queue, limit);
        Box::pin(std::future::ready(Ok(0)))
    }

    /// The time until the earliest delayed message of `queue` is due ([`Duration::ZERO`]
    /// if one is overdue); `None` when none is delayed. [`App::drain`](super::App::drain)
    /// uses it to end only when the queue, its delayed messages and its own in-flight
    /// messages are all empty.
    ///
    /// Default: `Ok(None)`.
    fn next_due<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Option<Duration>, TransportError>> {
        let _ = queue;
        Box::pin(std::future::ready(Ok(None)))
    }

    /// Liveness of this consumer on `queue` (one transport instance is one consumer):
    /// renews a heartbeat valid for `ttl`. The runtime calls it well within `ttl`, beside
    /// the message loop (never per message). Default: `Ok(())` (nothing to recover).
    fn heartbeat<'a>(
        &'a self,
        queue: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = (queue, ttl);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Recovers the in-flight messages of consumers of `queue` whose heartbeat expired
    /// (never those of a live consumer): each is put back on the queue, except one already
    /// recovered `max_recoveries` times, which is not requeued but moved into **this**
    /// consumer's in-flight state and returned in [`Recovered::exhausted`] for the runtime
    /// to dead-letter (reason `failed`, the error saying how many times it was recovered
    /// from consumers that died handling it). Safe when several consumers recover at once.
    ///
    /// Default: `Ok(Recovered::default())` (nothing to recover).
    fn recover<'a>(
        &'a self,
        queue: &'a str,
        max_recoveries: u32,
    ) -> BoxFuture<'a, Result<Recovered, TransportError>> {
        let _ = (queue, max_recoveries);
        Box::pin(std::future::ready(Ok(Recovered::default())))
    }

    /// Graceful stop: deregisters this consumer's heartbeat on `queue`. In-flight messages
    /// it still holds (if any) stay where they are, for [`recover`](Self::recover).
    /// Default: `Ok(())`.
    fn leave<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = queue;
        Box::pin(std::future::ready(Ok(())))
    }

    /// How many messages `queue` holds: ready, delayed and in flight (every consumer).
    /// The runtime samples it for the `babelqueue_queue_depth` gauge (feature `metrics`).
    /// Default: [`TransportError::Unsupported`] (the gauge is then not reported).
    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueDepth, TransportError>> {
        let _ = queue;
        Box::pin(std::future::ready(Err(TransportError::Unsupported(
            "depth",
        ))))
    }

    /// The server this transport's acks go to, as an identity a store on the same server
    /// produces too (Redis: `host:port/db`): a guard's `remember` for a store there is
    /// then handed to [`ack_and_reserve`](Self::ack_and_reserve) and sent with the ack
    /// (see [`pipelined`](crate::pipelined)). Default: `None` (stores write themselves).
    fn pipeline_server(&self) -> Option<&str> {
        None
    }

    /// Whether [`ack_and_reserve`](Self::ack_and_reserve) does the ack and the reserve in
    /// one round trip: the runtime then sends a worker's ack with its next reserve.
    /// Default: `false` (acks are sent at once).
    fn combines_ack_and_reserve(&self) -> bool {
        false
    }

    /// Sends `writes` (store commands for [`pipeline_server`](Self::pipeline_server), in
    /// order), then acks `delivery`, then — when `next` names a queue — reserves its next
    /// message without waiting; in one round trip where the broker allows. The writes
    /// reach the server before the ack: a message never leaves the in-flight state
    /// before its id is remembered.
    ///
    /// An error leaves it unknown which parts were done: the caller retries the writes and
    /// the ack (each is idempotent) with `next: None`. A transport that reserves here must
    /// also make sure a message it moved without the reply arriving is not stranded (the
    /// Redis transport returns such orphans to the queue on its next reserve).
    ///
    /// Default: [`TransportError::Unsupported`] if `writes` is not empty, else
    /// [`ack`](Self::ack) then [`reserve`](Self::reserve) with a zero timeout.
    fn ack_and_reserve<'a>(
        &'a self,
        delivery: &'a Delivery,
        writes: &'a [PipelinedWrite],
        next: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        Box::pin(async move {
            if !writes.is_empty() {
                return Err(TransportError::Unsupported("pipelined writes"));
            }
            self.ack(delivery).await?;
            match next {
                Some(queue) => self.reserve(queue, Duration::ZERO).await,
                None => Ok(None),
            }
        })
    }

    /// Sends `writes` (store commands for [`pipeline_server`](Self::pipeline_server), in
    /// order) on their own: a delivery settled otherwise than by an ack (a handler that
    /// failed after a guard inside it succeeded). Default: [`TransportError::Unsupported`]
    /// if `writes` is not empty.
    fn apply_writes<'a>(
        &'a self,
        writes: &'a [PipelinedWrite],
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if writes.is_empty() {
                Ok(())
            } else {
                Err(TransportError::Unsupported("pipelined writes"))
            }
        })
    }

    /// Publishes an envelope body with out-of-band headers. The default writes a header
    /// frame when `headers` is non-empty (the list transports' convention); a broker with
    /// native headers overrides it.
    fn publish_with_headers<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: Option<&'a Headers>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let element = encode_element(body, headers)?;
            self.publish_raw(queue, element).await
        })
    }

    /// Publishes an envelope (its canonical encoding) to `queue`.
    fn publish<'a>(
        &'a self,
        queue: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move { self.publish_raw(queue, envelope.encode()).await })
    }
}

impl<T: Transport + ?Sized> Transport for std::sync::Arc<T> {
    fn publish_raw<'a>(
        &'a self,
        queue: &'a str,
        element: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::publish_raw(self, queue, element)
    }
    fn reserve<'a>(
        &'a self,
        queue: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        T::reserve(self, queue, timeout)
    }
    fn ack<'a>(&'a self, delivery: &'a Delivery) -> BoxFuture<'a, Result<(), TransportError>> {
        T::ack(self, delivery)
    }
    fn requeue_processing<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        T::requeue_processing(self, queue)
    }
    fn requeue<'a>(
        &'a self,
        delivery: &'a Delivery,
        element: Vec<u8>,
        delay: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::requeue(self, delivery, element, delay)
    }
    fn promote_due<'a>(
        &'a self,
        queue: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<usize, TransportError>> {
        T::promote_due(self, queue, limit)
    }
    fn next_due<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<Option<Duration>, TransportError>> {
        T::next_due(self, queue)
    }
    fn heartbeat<'a>(
        &'a self,
        queue: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::heartbeat(self, queue, ttl)
    }
    fn recover<'a>(
        &'a self,
        queue: &'a str,
        max_recoveries: u32,
    ) -> BoxFuture<'a, Result<Recovered, TransportError>> {
        T::recover(self, queue, max_recoveries)
    }
    fn leave<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<(), TransportError>> {
        T::leave(self, queue)
    }
    fn depth<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueDepth, TransportError>> {
        T::depth(self, queue)
    }
    fn publish_with_headers<'a>(
        &'a self,
        queue: &'a str,
        body: &'a [u8],
        headers: Option<&'a Headers>,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::publish_with_headers(self, queue, body, headers)
    }
    fn pipeline_server(&self) -> Option<&str> {
        T::pipeline_server(self)
    }
    fn combines_ack_and_reserve(&self) -> bool {
        T::combines_ack_and_reserve(self)
    }
    fn ack_and_reserve<'a>(
        &'a self,
        delivery: &'a Delivery,
        writes: &'a [PipelinedWrite],
        next: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Delivery>, TransportError>> {
        T::ack_and_reserve(self, delivery, writes, next)
    }
    fn apply_writes<'a>(
        &'a self,
        writes: &'a [PipelinedWrite],
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::apply_writes(self, writes)
    }
    fn publish<'a>(
        &'a self,
        queue: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<(), TransportError>> {
        T::publish(self, queue, envelope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_keeps_body_bytes() {
        let body = "{\"job\":\"urn:x\",\"data\":{\"t\":\"Café \\\"q\\\" \\n ☕\"}}";
        let mut h = Headers::new();
        h.insert("traceparent".into(), "00-abc-01".into());
        let element = encode_element(body.as_bytes(), Some(&h)).unwrap();
        let (headers, got) = unframe(&element).unwrap();
        assert_eq!(headers, h);
        assert_eq!(got, body.as_bytes());
    }

    #[test]
    fn empty_headers_write_no_frame() {
        let h = Headers::new();
        assert_eq!(encode_element(b"{}", Some(&h)).unwrap(), b"{}");
    }

    #[test]
    fn non_frames_are_not_unwrapped() {
        for bytes in [
            &b""[..],
            b"not json",
            b"[1]",
            b"{\"job\":\"x\",\"data\":{\"s\":\"\\\"__bq_frame\\\"\"}}",
            b"{\"__bq_frame\":2,\"body\":\"{}\"}",
            b"{\"__bq_frame\":1,\"body\":{}}",
            b"{\"__bq_frame\":1}",
            b"\xff\xfe",
        ] {
            assert!(
                unframe(bytes).is_none(),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn frame_without_headers_is_accepted() {
        let (h, body) = unframe(br#" {"body":"{}","__bq_frame":1}"#).unwrap();
        assert!(h.is_empty());
        assert_eq!(body, b"{}");
    }

    #[test]
    fn non_utf8_body_cannot_be_framed() {
        let mut h = Headers::new();
        h.insert("a".into(), "b".into());
        assert!(matches!(
            encode_element(b"\xff", Some(&h)),
            Err(TransportError::BodyNotUtf8)
        ));
    }
}
