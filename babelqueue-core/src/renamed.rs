//! The guard functions' names before the `guard[_variant][_ttl][_report]_async` scheme,
//! kept as deprecated wrappers at the crate root for one release.

use std::future::Future;
use std::time::Duration;

use crate::fingerprint::{AsyncFingerprintStore, Fingerprint, PayloadMismatch};
use crate::guard::{HandlerResult, Outcome};
use crate::key::DedupeKey;
use crate::lease::{AsyncLeaseStore, InFlight, LeasedOutcome};
use crate::store::{AsyncStore, IntoHandlerError};

/// Renamed [`guard_ttl_async`](crate::guard_ttl_async) (async is always the last suffix).
#[deprecated(since = "0.1.0", note = "renamed `guard_ttl_async`")]
pub async fn guard_async_ttl<S, K, Fut, R>(
    store: &S,
    key: K,
    ttl: Option<Duration>,
    handler: Fut,
) -> Result<Outcome, R::Error>
where
    S: AsyncStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
{
    crate::guard::guard_ttl_async(store, key, ttl, handler).await
}

/// Renamed [`guard_lease_report_async`](crate::guard::guard_lease_report_async).
#[deprecated(since = "0.1.0", note = "renamed `guard::guard_lease_report_async`")]
pub async fn guard_lease_async_report<S, K, Fut, R>(
    store: &S,
    key: K,
    lease: Duration,
    ttl: Option<Duration>,
    handler: Fut,
) -> Result<LeasedOutcome, R::Error>
where
    S: AsyncLeaseStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
    R::Error: From<InFlight>,
{
    crate::guard::guard_lease_report_async(store, key, lease, ttl, handler).await
}

/// Renamed [`guard_fingerprint_async`](crate::guard_fingerprint_async).
#[deprecated(since = "0.1.0", note = "renamed `guard_fingerprint_async`")]
pub async fn guard_async_fingerprint<S, K, Fut, R>(
    store: &S,
    key: K,
    fingerprint: Fingerprint,
    ttl: Option<Duration>,
    handler: Fut,
) -> Result<Outcome, R::Error>
where
    S: AsyncFingerprintStore + ?Sized,
    K: DedupeKey,
    Fut: Future<Output = R>,
    R: HandlerResult,
    S::Error: IntoHandlerError<R::Error>,
    R::Error: From<PayloadMismatch>,
{
    crate::fingerprint::guard_fingerprint_async(store, key, fingerprint, ttl, handler).await
}

#[cfg(test)]
#[allow(deprecated)]
mod tests {
    use std::time::Duration;

    use crate::fingerprint::Fingerprint;
    use crate::guard::Outcome;
    use crate::lease::InFlight;
    use crate::memory::InMemoryStore;

    #[derive(Debug)]
    enum Error {
        Busy,
        Mismatch,
    }
    impl From<InFlight> for Error {
        fn from(_: InFlight) -> Self {
            Error::Busy
        }
    }
    impl From<crate::fingerprint::PayloadMismatch> for Error {
        fn from(_: crate::fingerprint::PayloadMismatch) -> Self {
            Error::Mismatch
        }
    }

    /// The deprecated names still guard: the second call of each is a skip.
    #[tokio::test]
    async fn the_old_names_forward_to_the_new_ones() {
        let store = InMemoryStore::new();
        let ok = || async { Ok::<(), Error>(()) };
        let first = crate::guard_async_ttl(&store, "ttl", None, ok())
            .await
            .unwrap();
        let again = crate::guard_async_ttl(&store, "ttl", None, ok())
            .await
            .unwrap();
        assert_eq!((first, again), (Outcome::Ran, Outcome::Skipped));
        let r =
            crate::guard_lease_async_report(&store, "lease", Duration::from_secs(5), None, ok())
                .await
                .unwrap();
        assert_eq!(r.outcome, Outcome::Ran);
        let fp = Fingerprint::of_bytes(b"a");
        let out = crate::guard_async_fingerprint(&store, "fp", fp, None, ok())
            .await
            .unwrap();
        assert_eq!(out, Outcome::Ran);
        let other = Fingerprint::of_bytes(b"b");
        let err = crate::guard_async_fingerprint(&store, "fp", other, None, ok()).await;
        assert!(matches!(err, Err(Error::Mismatch)), "{err:?}");
        let _ = Error::Busy;
    }
}
