//! The names and arguments of the queues this transport declares beside `<queue>`: the
//! dead-letter queue and the delay queues of retries.

use std::time::Duration;

/// The longest delay a delay queue holds: a requeue asking for more waits this long.
pub const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// How long an unused delay queue lives beyond its TTL (`x-expires` = 2 × TTL + this).
pub const DELAY_QUEUE_GRACE: Duration = Duration::from_secs(60);

/// Mantissas of the delay buckets, in hundredths: every decade of milliseconds has the
/// buckets 1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6 and 8 (rounded up to whole milliseconds).
const MANTISSAS: [u64; 10] = [100, 125, 150, 200, 250, 300, 400, 500, 600, 800];

/// The dead-letter queue of `queue` as every SDK of the family names it: `<queue>.dlq`.
///
/// ```
/// assert_eq!(babelqueue_amqp::dead_letter_queue("payments"), "payments.dlq");
/// ```
pub fn dead_letter_queue(queue: &str) -> String {
    format!("{queue}.dlq")
}

/// The delay bucket a requeue after `delay` goes to: `delay` rounded **up** to the next
/// bucket of the series 1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10ⁿ ms (rounded up to whole
/// milliseconds; at most a third longer than asked, about ten buckets a decade, so a
/// queue has few delay queues whatever the jitter), at least 1 ms and at most [`MAX_DELAY`].
///
/// ```
/// use std::time::Duration;
/// use babelqueue_amqp::delay_bucket;
/// assert_eq!(delay_bucket(Duration::from_millis(1000)), Duration::from_millis(1000));
/// assert_eq!(delay_bucket(Duration::from_millis(1001)), Duration::from_millis(1250));
/// assert_eq!(delay_bucket(Duration::from_micros(10)), Duration::from_millis(1));
/// assert_eq!(delay_bucket(Duration::from_secs(7 * 24 * 3600)), Duration::from_secs(24 * 3600));
/// ```
pub fn delay_bucket(delay: Duration) -> Duration {
    let max_ms = MAX_DELAY.as_millis() as u64;
    let ms = u64::try_from(delay.as_micros().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .clamp(1, max_ms);
    let mut decade: u64 = 1;
    loop {
        for m in MANTISSAS {
            let bucket = (m * decade).div_ceil(100);
            if bucket >= ms {
                return Duration::from_millis(bucket.min(max_ms));
            }
        }
        decade *= 10;
    }
}

/// The delay queue of `queue` for a bucket of `ttl` (see [`delay_bucket`]):
/// `<queue>.delay.<ttl in ms>`. It is declared durable with a queue-level
/// `x-message-ttl` = `ttl`, `x-dead-letter-exchange` = `""` and
/// `x-dead-letter-routing-key` = `queue` (an expired message goes back to `queue` through
/// the default exchange), and `x-expires` = 2 × `ttl` + [`DELAY_QUEUE_GRACE`] (an unused
/// delay queue deletes itself). Every message of a delay queue has the same TTL, so the
/// head always expires first and none waits behind a longer one.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(
///     babelqueue_amqp::delay_queue("payments", Duration::from_millis(1250)),
///     "payments.delay.1250"
/// );
/// ```
pub fn delay_queue(queue: &str, ttl: Duration) -> String {
    format!("{queue}.delay.{}", ttl.as_millis())
}

/// `x-expires` of a delay queue of `ttl`.
pub(crate) fn delay_queue_expires(ttl: Duration) -> Duration {
    ttl * 2 + DELAY_QUEUE_GRACE
}

/// How long a declaration of a delay queue of `ttl` is trusted before it is declared again
/// (a declaration renews `x-expires`): a message published within this time of the
/// declaration expires before the queue can.
pub(crate) fn delay_queue_redeclare_after(ttl: Duration) -> Duration {
    (delay_queue_expires(ttl) - ttl) / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn buckets_round_up_by_at_most_a_third() {
        for n in 1..200_000u64 {
            let b = delay_bucket(ms(n)).as_millis() as u64;
            assert!(b >= n, "{n} -> {b}");
            // 3 -> 4 and 6 -> 8 are the widest steps of the series.
            let limit = n + n.div_ceil(3);
            assert!(b <= limit, "{n} -> {b}");
        }
    }

    #[test]
    fn few_buckets_per_decade() {
        let mut all: Vec<u64> = (1..100_000u64)
            .map(|n| delay_bucket(ms(n)).as_millis() as u64)
            .collect();
        all.dedup();
        // 1..=10 ms: 1,2,3,4,5,6,8,10; then ten a decade up to 100 s.
        assert_eq!(all.len(), 48, "{} buckets: {all:?}", all.len());
        assert_eq!(&all[..8], &[1, 2, 3, 4, 5, 6, 8, 10]);
        assert!(all.contains(&125) && all.contains(&1250) && all.contains(&30_000));
    }

    #[test]
    fn bounds() {
        assert_eq!(delay_bucket(Duration::ZERO), ms(1));
        assert_eq!(delay_bucket(Duration::MAX), MAX_DELAY);
        assert_eq!(delay_bucket(MAX_DELAY), MAX_DELAY);
        assert_eq!(delay_bucket(MAX_DELAY - ms(1)), MAX_DELAY);
    }

    #[test]
    fn a_message_expires_before_its_delay_queue() {
        for ttl in [ms(1), ms(1250), ms(60_000), MAX_DELAY] {
            let expires = delay_queue_expires(ttl);
            let renew = delay_queue_redeclare_after(ttl);
            // Published at most `renew` after a declaration, it expires at most
            // `renew + ttl` after it: before the queue's own expiry.
            assert!(renew + ttl < expires, "{ttl:?}");
            assert!(expires.as_millis() < u32::MAX as u128);
        }
    }
}
