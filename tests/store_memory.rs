//! The generic store suite against the in-memory store (every trait it implements).

use babelqueue::InMemoryStore;
use babelqueue::testing::{StoreFactory, StoreSpec};

/// One fresh `InMemoryStore` per namespace: the namespace of an in-memory store is the
/// instance itself.
struct Memory;

impl StoreFactory for Memory {
    type Store = InMemoryStore;

    async fn create(&self, spec: &StoreSpec) -> InMemoryStore {
        match spec.ttl {
            Some(ttl) => InMemoryStore::with_ttl(ttl),
            None => InMemoryStore::new(),
        }
    }

    fn claim_once<'a>(
        &'a self,
        store: &'a InMemoryStore,
        id: &'a str,
    ) -> Option<babelqueue::BoxFuture<'a, bool>> {
        Some(Box::pin(async move { store.claim(id) }))
    }
}

babelqueue::store_suite! {
    mod memory = Memory;
    kinds = [async_store, async_lease, sync_store, sync_lease];
}
