//! The commit rule of one partition: an offset is committed only when every earlier
//! message of that partition handed out by this consumer is settled.

use std::collections::BTreeMap;

/// The messages of one partition handed out and not yet passed by the commit position.
///
/// Messages are [`received`](Self::received) in offset order (a Kafka partition is read in
/// order) and [`settle`](Self::settle)d in any order; the position to commit advances only
/// over a settled prefix.
///
/// ```
/// use babelqueue_kafka::PartitionOffsets;
/// let mut p = PartitionOffsets::default();
/// for offset in [10, 11, 12] {
///     p.received(offset);
/// }
/// assert_eq!(p.settle(11), None, "10 is still running: nothing to commit");
/// assert_eq!(p.settle(12), None);
/// assert_eq!(p.settle(10), Some(13), "10, 11 and 12 settled: commit 13 (the next to read)");
/// assert_eq!(p.in_flight(), 0);
/// ```
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PartitionOffsets {
    /// Offset → settled.
    pending: BTreeMap<i64, bool>,
}

impl PartitionOffsets {
    /// A message at `offset` was handed out.
    pub fn received(&mut self, offset: i64) {
        self.pending.entry(offset).or_insert(false);
    }

    /// The message at `offset` is settled (acked, retried, dead-lettered). Returns the
    /// offset to commit (the first offset not yet settled-and-passed, i.e. the last offset
    /// of the settled prefix + 1) when the prefix grew; `None` when an earlier message is
    /// still unsettled or `offset` is not pending here.
    pub fn settle(&mut self, offset: i64) -> Option<i64> {
        match self.pending.get_mut(&offset) {
            Some(settled) => *settled = true,
            None => return None,
        }
        let mut next = None;
        while let Some(entry) = self.pending.first_entry() {
            if !*entry.get() {
                break;
            }
            next = Some(*entry.key() + 1);
            entry.remove();
        }
        next
    }

    /// Messages handed out and not yet passed by the commit position (settled ones after an
    /// unsettled one count too).
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The lowest offset not yet passed, if any.
    pub fn first_pending(&self) -> Option<i64> {
        self.pending.keys().next().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_only_over_a_settled_prefix() {
        let mut p = PartitionOffsets::default();
        for o in 0..5 {
            p.received(o);
        }
        assert_eq!(p.settle(1), None);
        assert_eq!(p.settle(0), Some(2));
        assert_eq!(p.settle(4), None);
        assert_eq!(p.first_pending(), Some(2));
        assert_eq!(p.settle(3), None);
        assert_eq!(p.settle(2), Some(5));
        assert_eq!(p.in_flight(), 0);
    }

    #[test]
    fn unknown_and_repeated_settles_commit_nothing() {
        let mut p = PartitionOffsets::default();
        p.received(7);
        assert_eq!(p.settle(6), None);
        assert_eq!(p.settle(7), Some(8));
        assert_eq!(p.settle(7), None, "a second settle of a passed offset");
    }

    #[test]
    fn gaps_in_offsets_are_fine() {
        // Compacted topics and transaction markers leave gaps: the commit is the last
        // settled offset + 1, and the broker serves the next existing record from there.
        let mut p = PartitionOffsets::default();
        p.received(3);
        p.received(9);
        assert_eq!(p.settle(9), None);
        assert_eq!(p.settle(3), Some(10));
    }
}
