//! Handlers written with `#[handler]` and `#[idempotent]` the way a user's crate writes
//! them, compiled by plain `cargo build` (not trybuild, which compiles every case with
//! `-A dead_code`) under `#![deny(warnings)]` and `#![deny(clippy::pedantic)]`:
//!
//! * [`called`]: handlers called directly, registered, and both, each private to its
//!   module (so an unused item would warn `dead_code`);
//! * [`envelopes`]: the envelope parameter as `Arc<Envelope>` and as a type alias, and
//!   the typed form keyed on a payload field under `#[handler("urn:...")]`, namespaced by
//!   that URN;
//! * [`no_prelude`]: the same in a module with `#![no_implicit_prelude]`.
//!
//! The tests in `tests/` run them.
#![deny(warnings)]
#![deny(clippy::pedantic)]
#![forbid(unsafe_code)]

pub mod called;
pub mod envelopes;
pub mod no_prelude;

use std::sync::atomic::{AtomicU32, Ordering};

/// How many times a handler body ran (one counter per handler).
#[derive(Debug, Default)]
pub struct Runs(AtomicU32);

impl Runs {
    /// A counter at zero.
    #[must_use]
    pub const fn new() -> Self {
        Runs(AtomicU32::new(0))
    }

    /// Counts one run.
    pub fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// The runs so far.
    #[must_use]
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}
