//! The acks of one consumer channel, coalesced: `basic.ack` with `multiple = true` where
//! the delivery tags allow it.
//!
//! RabbitMQ spends most of a delivery's cost on the broker side per frame: one
//! `basic.ack(tag, multiple = true)` settles every outstanding delivery up to `tag` for
//! the cost of one. On a channel, the broker numbers deliveries 1, 2, 3, … and the
//! transport hands them to the runtime in that order, so every tag below the highest one
//! handed out has been handed out. The book keeps the **floor**: every tag at or below it
//! is settled with the broker. An ack the runtime asks for is **owed**; whenever the tags
//! just above the floor are all owed or settled, one multiple ack of the highest owed tag
//! among them moves the floor past them.
//!
//! An owed ack above a gap (an earlier delivery still in a handler) may wait for the gap
//! to close, but only while at most the book's `hold` acks wait: each waiting ack keeps a
//! message of the prefetch window unacked, so the hold is the window's spare part
//! (prefetch − concurrency), and past it every waiting ack is sent on its own at once. A
//! slow handler therefore never stops the broker from feeding the other workers.
//!
//! A tag settled by its own frame (a reject, an ack sent singly) is **sent**: the floor
//! moves over it, and a multiple ack is never given a tag the broker has settled already
//! (that would be `PRECONDITION_FAILED - unknown delivery tag`). A multiple ack covers only
//! tags that are owed or sent, never one still in a handler or not handed out.

use std::collections::BTreeSet;

/// One frame to send for the book.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frame {
    /// `basic.ack(tag, multiple = true)`: every outstanding delivery up to `tag`.
    UpTo(u64),
    /// `basic.ack(tag, multiple = false)`.
    One(u64),
}

/// The acks of one channel (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct AckBook {
    /// Every tag at or below it is settled with the broker (or covered by a frame handed
    /// out by [`plan`](Self::plan)).
    floor: u64,
    /// Acked by the runtime, no frame yet.
    owed: BTreeSet<u64>,
    /// Above the floor and settled by a frame of its own.
    sent: BTreeSet<u64>,
    /// How many owed acks above a gap may wait.
    hold: usize,
}

impl AckBook {
    /// A book whose owed acks above a gap wait while at most `hold` of them do.
    pub(crate) fn new(hold: usize) -> Self {
        AckBook {
            hold,
            ..AckBook::default()
        }
    }

    /// Changes `hold` (the channel's prefetch changed).
    pub(crate) fn set_hold(&mut self, hold: usize) {
        self.hold = hold;
    }

    /// The runtime acked `tag`.
    pub(crate) fn owe(&mut self, tag: u64) {
        if tag > self.floor && !self.sent.contains(&tag) {
            self.owed.insert(tag);
        }
    }

    /// `tag` was settled by a frame of its own (a reject), already on its way.
    pub(crate) fn settled(&mut self, tag: u64) {
        if tag > self.floor {
            self.owed.remove(&tag);
            self.sent.insert(tag);
        }
    }

    /// Acks owed and not sent.
    #[cfg(test)]
    pub(crate) fn owed(&self) -> usize {
        self.owed.len()
    }

    /// Whether [`plan`](Self::plan) would hand out a frame now.
    pub(crate) fn ready(&self, all: bool) -> bool {
        if self.owed.is_empty() {
            return false;
        }
        if all || self.owed.len() > self.hold {
            return true;
        }
        let mut next = self.floor + 1;
        while self.sent.contains(&next) {
            next += 1;
        }
        self.owed.contains(&next)
    }

    /// The frames to send now, in order, counted as sent from here on: a multiple ack
    /// for the owed tags just above the floor, then, when more than
    /// `hold` are left owed (or `all`: the consumer stops), one ack per
    /// owed tag.
    pub(crate) fn plan(&mut self, all: bool) -> Vec<Frame> {
        let mut frames = Vec::new();
        let mut top = None;
        loop {
            let next = self.floor + 1;
            if self.owed.remove(&next) {
                top = Some(next);
            } else if !self.sent.remove(&next) {
                break;
            }
            self.floor = next;
        }
        if let Some(tag) = top {
            frames.push(Frame::UpTo(tag));
        }
        if !self.owed.is_empty() && (all || self.owed.len() > self.hold) {
            for tag in std::mem::take(&mut self.owed) {
                frames.push(Frame::One(tag));
                self.sent.insert(tag);
            }
        }
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_in_order_go_as_one_multiple_ack() {
        let mut b = AckBook::new(4);
        b.owe(1);
        assert!(b.ready(false));
        assert_eq!(b.plan(false), vec![Frame::UpTo(1)]);
        b.owe(3);
        b.owe(4);
        assert!(!b.ready(false), "2 is still in a handler");
        assert_eq!(b.plan(false), vec![]);
        b.owe(2);
        assert_eq!(b.plan(false), vec![Frame::UpTo(4)]);
        assert_eq!(b.owed(), 0);
        assert!(!b.ready(true));
    }

    #[test]
    fn past_the_hold_waiting_acks_are_sent_on_their_own() {
        let mut b = AckBook::new(2);
        // 1 is slow; 2, 3 wait, 4 is one too many.
        b.owe(2);
        b.owe(3);
        assert_eq!(b.plan(false), vec![]);
        b.owe(4);
        assert!(b.ready(false));
        assert_eq!(
            b.plan(false),
            vec![Frame::One(2), Frame::One(3), Frame::One(4)]
        );
        // 5 waits again; when 1 is done, one multiple ack of 5 covers 1 and 5 (2..=4 are
        // settled already, never named again).
        b.owe(5);
        assert_eq!(b.plan(false), vec![]);
        b.owe(1);
        assert_eq!(b.plan(false), vec![Frame::UpTo(5)]);
        assert!(!b.ready(true));
    }

    #[test]
    fn a_multiple_ack_never_names_a_settled_tag() {
        let mut b = AckBook::new(8);
        // 2 was rejected (requeued) on its own: a multiple ack must not name it, and must
        // not cover 3 before 3 is acked.
        b.settled(2);
        b.owe(1);
        assert_eq!(b.plan(false), vec![Frame::UpTo(1)]);
        assert!(!b.ready(false));
        b.owe(3);
        assert_eq!(b.plan(false), vec![Frame::UpTo(3)]);
        // Only settled tags above the floor: nothing to send.
        b.settled(4);
        assert!(!b.ready(true));
        assert_eq!(b.plan(true), vec![]);
    }

    #[test]
    fn a_gap_never_closes_on_its_own_but_all_sends_what_waits() {
        let mut b = AckBook::new(8);
        b.owe(2);
        b.owe(5);
        assert!(!b.ready(false));
        assert!(b.ready(true));
        assert_eq!(b.plan(true), vec![Frame::One(2), Frame::One(5)]);
        assert_eq!(b.plan(true), vec![]);
        // An ack asked again for a tag already sent is not sent twice.
        b.owe(2);
        assert_eq!(b.plan(true), vec![]);
    }

    #[test]
    fn no_hold_sends_what_has_a_gap_below_at_once() {
        let mut b = AckBook::new(0);
        b.owe(2);
        assert_eq!(b.plan(false), vec![Frame::One(2)]);
        b.owe(1);
        b.owe(3);
        assert_eq!(b.plan(false), vec![Frame::UpTo(3)]);
    }
}
