//! A dedupe store of your own, checked with the generic store suite.
//!
//! ```text
//! cargo run --example custom_store          # the store guarding a handler
//! cargo test --example custom_store         # the store suite against it
//! ```
//!
//! Any type that implements [`AsyncStore`] (and/or the blocking [`Store`]) can guard
//! handlers: `#[idempotent(store = ...)]`, `guard_async`, the runtime. This one keeps ids
//! in a `HashMap` behind a mutex, with per-id expiry on tokio's clock; a real one would talk
//! to your database. `babelqueue::store_suite!` (feature `testing`) turns the project's
//! own store tests — the cross-SDK conformance sequences, TTL, isolation, odd ids,
//! concurrency — into `#[test]`s for your type, so it behaves like the built-in stores.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Mutex;
use std::time::Duration;

use babelqueue::key::id_is_storable;
use babelqueue::prelude::*;
use tokio::time::Instant;

/// Remembered ids, each with its expiry (`None`: kept until forgotten). Ids no store can
/// hold are never remembered.
#[derive(Debug, Default)]
pub struct MapStore {
    ids: Mutex<HashMap<String, Option<Instant>>>,
    ttl: Option<Duration>,
}

impl MapStore {
    /// An empty store whose ids expire after `ttl` (`None`: never).
    pub fn new(ttl: Option<Duration>) -> Self {
        MapStore {
            ids: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<Instant>>> {
        // A panic while holding the lock cannot leave the map half-written.
        self.ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl AsyncStore for MapStore {
    type Error = Infallible;

    async fn seen(&self, id: &str) -> Result<bool, Infallible> {
        let now = Instant::now();
        Ok(self
            .ids()
            .get(id)
            .is_some_and(|expires| expires.is_none_or(|at| at > now)))
    }

    async fn remember(&self, id: &str) -> Result<(), Infallible> {
        self.remember_for(id, None).await
    }

    async fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), Infallible> {
        // The rule every store applies (over `key::MAX_ID_LEN` bytes, or a NUL): a store
        // that cannot fail never holds such an id, so the guard fails open for it; a
        // fallible store returns `key::UnstorableId` instead. The suite checks this.
        if id_is_storable(id).is_err() {
            return Ok(());
        }
        let expires = ttl.or(self.ttl).map(|ttl| Instant::now() + ttl);
        self.ids().insert(id.to_owned(), expires);
        Ok(())
    }

    async fn forget(&self, id: &str) -> Result<(), Infallible> {
        self.ids().remove(id);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MapStore::new(Some(Duration::from_secs(3600)));
    let env = Envelope::new(
        "urn:babel:payments:charge",
        serde_json::json!({"payment_id": "pay_7f3a", "amount": 4200}),
    )?;
    let mut charged = 0;
    for _ in 0..2 {
        // The same envelope twice: a redelivery. The guard charges once.
        let outcome = Guard::new(&store)
            .run_async(&env, async {
                charged += 1;
                Ok::<(), Infallible>(())
            })
            .await?;
        println!("[rust] {outcome:?} meta.id={}", env.meta.id);
    }
    println!("[rust] custom store: charged {charged} time(s) for 2 deliveries");
    if charged != 1 {
        return Err("the custom store let a duplicate through".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::MapStore;
    use babelqueue::testing::{StoreFactory, StoreSpec};

    /// One fresh store per test namespace: an in-process store's namespace is the
    /// instance itself.
    struct Maps;

    impl StoreFactory for Maps {
        type Store = MapStore;

        async fn create(&self, spec: &StoreSpec) -> MapStore {
            MapStore::new(spec.ttl)
        }
    }

    babelqueue::store_suite! {
        mod map_store = Maps;
        kinds = [async_store];
    }
}
