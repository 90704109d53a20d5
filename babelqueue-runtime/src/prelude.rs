//! What a handler author needs, in one import.
//!
//! ```
//! use babelqueue_runtime::prelude::*;
//!
//! let store = InMemoryStore::new();
//! let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
//! assert_eq!(Guard::new(&store).run(&env, || ())?, Outcome::Ran);
//! assert_eq!(Guard::new(&store).run(&env, || ())?, Outcome::Skipped);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The `babelqueue` facade's prelude adds the `#[handler]` and `#[idempotent]` macros.

pub use crate::extract::{Attempts, FromEnvelope, Json, State};
pub use crate::handler::{BoxError, HandlerError, Router};
pub use crate::replay::{
    Replay, bypass_external_effects, bypass_external_effects_async, is_replay,
};
pub use crate::{App, InMemoryTransport, Permanent, RetryPolicy, Transport};
pub use babelqueue_core::envelope::{DeadLetter, DecodeError, Envelope, EnvelopeError, Meta};
pub use babelqueue_core::fingerprint::{AsyncFingerprintStore, FingerprintStore, PayloadMismatch};
pub use babelqueue_core::guard::{Guard, Guarded, Outcome};
pub use babelqueue_core::key::DedupeKey;
pub use babelqueue_core::lease::{AsyncLeaseStore, InFlight, LeaseStore};
pub use babelqueue_core::memory::InMemoryStore;
pub use babelqueue_core::store::{AsyncStore, Store};
