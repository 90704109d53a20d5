//! The clock an [`InMemoryStore`](super::InMemoryStore) measures TTLs and leases on.
//!
//! Times are whole milliseconds since the store was built, plus one (so that no deadline
//! is ever `NEVER`, 0). Two sources:
//!
//! * **System**: the monotonic clock (`CLOCK_MONOTONIC` on Linux, what
//!   `std::time::Instant` reads). A duplicate's TTL check first reads the kernel's
//!   *coarse* monotonic clock (`CLOCK_MONOTONIC_COARSE`: about 5 ns against about 27 ns
//!   here, a value at most a few ticks behind the exact one, never ahead); only a deadline
//!   within [`COARSE_MARGIN_MS`] of that reading takes an exact read. On other targets
//!   every check reads `std::time::Instant`.
//! * **Tokio**: `tokio::time::Instant`, which follows a paused clock (`tokio::time::pause`,
//!   `advance`, `#[tokio::test(start_paused = true)]`). Every check is an exact read.

use std::time::Duration;

/// A deadline further than this past the coarse clock's reading is not yet reached,
/// without an exact read. The coarse clock is updated at each kernel tick (1–10 ms, 4 ms
/// on a default kernel) and was seen up to 4.7 ms behind the exact clock on a busy
/// two-core VM; 50 ms leaves room for a timekeeping CPU that was not scheduled for a
/// while. Were the coarse clock ever further behind, an id would be seen (a duplicate
/// skipped) for that much longer than its TTL: never the other way round.
pub(crate) const COARSE_MARGIN_MS: u64 = 50;

/// Which clock an [`InMemoryStore`](super::InMemoryStore) measures TTLs and leases on;
/// set with [`InMemoryStoreBuilder::clock`](super::InMemoryStoreBuilder::clock), read
/// back (as the one chosen) with [`InMemoryStore::clock`](super::InMemoryStore::clock).
///
/// Both are monotonic and exact to the millisecond: a remembered id stops being seen once
/// its TTL has passed on the chosen clock. They differ in speed and in what moves them:
///
/// * [`System`](Self::System) reads the operating system's monotonic clock, the one
///   `std::time::Instant` and (outside paused time) tokio read. A duplicate whose TTL
///   ends more than 50 ms later is confirmed from the kernel's coarse clock (on Linux;
///   a few nanoseconds) instead of an exact read (a few tens), which is most of the
///   guard's cost on this store.
/// * [`Tokio`](Self::Tokio) reads `tokio::time::Instant`, so paused time in tests
///   (`tokio::time::pause`, `tokio::time::advance`, `#[tokio::test(start_paused =
///   true)]`) moves TTLs and leases. Every check is an exact read.
/// * [`Auto`](Self::Auto), the default, chooses when the store is built: `Tokio` when it
///   is built on a tokio runtime whose clock is paused (or was advanced ahead of the
///   system clock), `System` otherwise. A store built before `tokio::time::pause()` is
///   called, or outside the runtime it is used on, needs `Tokio` set explicitly to follow
///   paused time.
///
/// ```
/// use std::time::Duration;
/// use babelqueue_core::{InMemoryStore, memory::StoreClock};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// // Built before time is paused: ask for tokio's clock.
/// let store = InMemoryStore::builder()
///     .ttl(Duration::from_secs(60))
///     .clock(StoreClock::Tokio)
///     .build();
/// assert_eq!(store.clock(), StoreClock::Tokio);
/// # });
/// // Not on a paused runtime, `Auto` is the system clock.
/// assert_eq!(InMemoryStore::new().clock(), StoreClock::System);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum StoreClock {
    /// `Tokio` on a paused (or advanced) tokio clock when the store is built, else
    /// `System`. The default.
    #[default]
    Auto,
    /// The operating system's monotonic clock, with a coarse check for a duplicate.
    System,
    /// tokio's clock (`tokio::time::Instant`), which paused time moves.
    Tokio,
}

/// The resolved clock of one store, with its epoch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Clock {
    /// Nanoseconds of the monotonic clock at the epoch.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    System {
        epoch_ns: u64,
    },
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    System {
        epoch: std::time::Instant,
    },
    Tokio {
        epoch: tokio::time::Instant,
    },
}

impl Clock {
    pub(crate) fn new(choice: StoreClock) -> Clock {
        match choice {
            StoreClock::Tokio => Clock::tokio(),
            StoreClock::System => Clock::system(),
            StoreClock::Auto if tokio_time_is_not_the_system_clock() => Clock::tokio(),
            StoreClock::Auto => Clock::system(),
        }
    }

    fn tokio() -> Clock {
        Clock::Tokio {
            epoch: tokio::time::Instant::now(),
        }
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn system() -> Clock {
        Clock::System {
            epoch_ns: monotonic_ns(libc::CLOCK_MONOTONIC),
        }
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn system() -> Clock {
        Clock::System {
            epoch: std::time::Instant::now(),
        }
    }

    pub(crate) fn kind(&self) -> StoreClock {
        match self {
            Clock::System { .. } => StoreClock::System,
            Clock::Tokio { .. } => StoreClock::Tokio,
        }
    }

    /// Milliseconds since the epoch, plus one, read exactly.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match *self {
            #[cfg(any(target_os = "linux", target_os = "android"))]
            Clock::System { epoch_ns } => since(epoch_ns, monotonic_ns(libc::CLOCK_MONOTONIC)),
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            Clock::System { epoch } => millis_plus_one(epoch.elapsed()),
            Clock::Tokio { epoch } => millis_plus_one(epoch.elapsed()),
        }
    }

    /// Whether the clock has not yet reached `deadline` (`now() < deadline`), reading the
    /// coarse clock first where there is one: only a deadline within
    /// [`COARSE_MARGIN_MS`] of it takes an exact read.
    #[inline]
    pub(crate) fn before(&self, deadline: u64) -> bool {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Clock::System { epoch_ns } = *self {
            // The coarse reading is never ahead of the exact one, so a deadline beyond it
            // by more than the margin is beyond the exact one too.
            let coarse = since(epoch_ns, monotonic_ns(libc::CLOCK_MONOTONIC_COARSE));
            if coarse.saturating_add(COARSE_MARGIN_MS) < deadline {
                return true;
            }
        }
        self.now() < deadline
    }
}

fn millis_plus_one(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX - 1) + 1
}

/// Milliseconds from `epoch_ns` to `now_ns`, plus one (0 + 1 for a reading before the
/// epoch, as the coarse clock's can be just after the store is built).
#[cfg(any(target_os = "linux", target_os = "android"))]
#[inline]
fn since(epoch_ns: u64, now_ns: u64) -> u64 {
    now_ns.saturating_sub(epoch_ns) / 1_000_000 + 1
}

/// A monotonic clock's reading in nanoseconds.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[inline]
fn monotonic_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks exist on every Linux since
    // 2.6.32 (answered from the vDSO, no system call). On an error `ts` stays zero, which
    // reads as the epoch: a coarse check then falls through to the exact read.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Whether tokio's clock, here, may differ from the system's: on a tokio runtime whose
/// clock is paused (two readings in a row are equal: a running clock has moved by then),
/// or ahead of the system clock (advanced while paused, then resumed).
fn tokio_time_is_not_the_system_clock() -> bool {
    if tokio::runtime::Handle::try_current().is_err() {
        // Outside a runtime, tokio's clock is the system clock.
        return false;
    }
    let first = tokio::time::Instant::now();
    let second = tokio::time::Instant::now();
    let system = std::time::Instant::now();
    first == second || second.into_std() > system
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_runtime_auto_is_the_system_clock() {
        assert_eq!(Clock::new(StoreClock::Auto).kind(), StoreClock::System);
        assert_eq!(Clock::new(StoreClock::Tokio).kind(), StoreClock::Tokio);
    }

    #[tokio::test]
    async fn on_a_running_runtime_auto_is_the_system_clock() {
        assert_eq!(Clock::new(StoreClock::Auto).kind(), StoreClock::System);
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_paused_runtime_auto_is_tokio() {
        assert_eq!(Clock::new(StoreClock::Auto).kind(), StoreClock::Tokio);
        assert_eq!(Clock::new(StoreClock::System).kind(), StoreClock::System);
    }

    #[tokio::test(start_paused = true)]
    async fn on_a_runtime_advanced_then_resumed_auto_is_tokio() {
        tokio::time::advance(Duration::from_secs(3600)).await;
        tokio::time::resume();
        assert_eq!(Clock::new(StoreClock::Auto).kind(), StoreClock::Tokio);
    }

    #[test]
    fn the_system_clock_counts_milliseconds_from_one() {
        let clock = Clock::new(StoreClock::System);
        let start = clock.now();
        assert!(start >= 1);
        std::thread::sleep(Duration::from_millis(20));
        let later = clock.now();
        assert!(later >= start + 20, "{start} then {later}");
    }

    #[test]
    fn before_agrees_with_the_exact_clock_around_a_deadline() {
        let clock = Clock::new(StoreClock::System);
        let now = clock.now();
        // Far ahead: before (the coarse path on Linux).
        assert!(clock.before(now + 10 * COARSE_MARGIN_MS));
        // Reached: not before, whichever path answers.
        assert!(!clock.before(now));
        assert!(!clock.before(1));
        // Within the margin and ahead: the exact read answers, and it is before.
        let soon = clock.now() + 30;
        assert!(clock.before(soon));
        std::thread::sleep(Duration::from_millis(40));
        assert!(
            !clock.before(soon),
            "a deadline 30 ms ahead has passed after 40 ms"
        );
    }

    /// What the coarse check relies on: the coarse clock's reading is never ahead of the
    /// exact clock's, and not far behind it.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn the_coarse_clock_is_never_ahead_of_the_exact_one() {
        for _ in 0..100_000 {
            let coarse = monotonic_ns(libc::CLOCK_MONOTONIC_COARSE);
            let exact = monotonic_ns(libc::CLOCK_MONOTONIC);
            assert!(coarse > 0 && exact > 0, "a clock read failed");
            assert!(coarse <= exact, "coarse {coarse} ahead of exact {exact}");
            assert!(
                exact - coarse < 1_000_000_000,
                "coarse {coarse}, exact {exact}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_tokio_clock_follows_paused_time() {
        let clock = Clock::new(StoreClock::Tokio);
        let deadline = clock.now() + 500;
        assert!(clock.before(deadline));
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(clock.before(deadline));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!clock.before(deadline));
    }
}
