use std::convert::Infallible;

use babelqueue::{Envelope, InFlight, Store, idempotent};

/// A seen-set store without atomic claims (no `LeaseStore` impl).
pub struct PlainStore;

impl Store for PlainStore {
    type Error = Infallible;
    fn seen(&self, _id: &str) -> Result<bool, Infallible> {
        Ok(false)
    }
    fn remember(&self, _id: &str) -> Result<(), Infallible> {
        Ok(())
    }
    fn forget(&self, _id: &str) -> Result<(), Infallible> {
        Ok(())
    }
}

static STORE: PlainStore = PlainStore;

#[derive(Debug)]
pub enum ChargeError {
    Busy(InFlight),
}

impl From<InFlight> for ChargeError {
    fn from(e: InFlight) -> Self {
        ChargeError::Busy(e)
    }
}

#[idempotent(store = STORE, lease = "30s")]
fn charge(env: &Envelope) -> Result<(), ChargeError> {
    let _ = env;
    Ok(())
}

fn main() {}
