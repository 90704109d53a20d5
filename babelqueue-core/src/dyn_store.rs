//! [`DynStore`]: a type-erased [`AsyncStore`], for choosing a backend at run time.

use std::sync::Arc;
use std::time::Duration;

use crate::outcome::{BoxError, BoxFuture};
use crate::store::AsyncStore;

/// The error of a [`DynStore`]: the backend's error, boxed.
#[derive(Debug, thiserror::Error)]
#[error("the dedupe store failed")]
pub struct DynStoreError(#[source] pub BoxError);

crate::handler_error_from!(DynStoreError);

trait ErasedStore: Send + Sync {
    fn seen<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, DynStoreError>>;
    fn remember_for<'a>(
        &'a self,
        id: &'a str,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), DynStoreError>>;
    fn forget<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DynStoreError>>;
    fn pipelined_remember(
        &self,
        id: &str,
        ttl: Option<Duration>,
        server: &str,
    ) -> Option<crate::pipelined::PipelinedWrite>;
}

fn boxed<E: std::error::Error + Send + Sync + 'static>(e: E) -> DynStoreError {
    DynStoreError(Box::new(e))
}

impl<S: AsyncStore + 'static> ErasedStore for S {
    fn seen<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, DynStoreError>> {
        Box::pin(async move { AsyncStore::seen(self, id).await.map_err(boxed) })
    }
    fn remember_for<'a>(
        &'a self,
        id: &'a str,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<(), DynStoreError>> {
        Box::pin(async move { AsyncStore::remember_for(self, id, ttl).await.map_err(boxed) })
    }
    fn forget<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DynStoreError>> {
        Box::pin(async move { AsyncStore::forget(self, id).await.map_err(boxed) })
    }
    fn pipelined_remember(
        &self,
        id: &str,
        ttl: Option<Duration>,
        server: &str,
    ) -> Option<crate::pipelined::PipelinedWrite> {
        AsyncStore::pipelined_remember(self, id, ttl, server)
    }
}

/// Any [`AsyncStore`] behind one type, so a program can pick its store at run time (from
/// a flag or the environment) and still name one `static` in `#[idempotent(store = …)]`.
///
/// Cloning is cheap (an `Arc`). Each call costs one boxed future on top of the backend.
///
/// ```
/// use std::sync::OnceLock;
/// use babelqueue_core::{AsyncStore, dyn_store::DynStore, InMemoryStore};
///
/// static STORE: OnceLock<DynStore> = OnceLock::new();
/// fn store() -> &'static DynStore {
///     STORE.get_or_init(|| DynStore::new(InMemoryStore::new()))
/// }
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// store().remember("id-A").await.unwrap();
/// assert!(store().seen("id-A").await.unwrap());
/// # });
/// ```
#[derive(Clone)]
pub struct DynStore {
    inner: Arc<dyn ErasedStore>,
    name: &'static str,
}

impl std::fmt::Debug for DynStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynStore")
            .field("backend", &self.name)
            .finish()
    }
}

impl DynStore {
    /// Erases the type of `store`.
    pub fn new<S: AsyncStore + 'static>(store: S) -> Self {
        DynStore {
            inner: Arc::new(store),
            name: std::any::type_name::<S>(),
        }
    }

    /// The type name of the backend.
    pub fn backend(&self) -> &'static str {
        self.name
    }
}

impl AsyncStore for DynStore {
    type Error = DynStoreError;

    async fn seen(&self, id: &str) -> Result<bool, DynStoreError> {
        self.inner.seen(id).await
    }

    async fn remember(&self, id: &str) -> Result<(), DynStoreError> {
        self.inner.remember_for(id, None).await
    }

    async fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), DynStoreError> {
        self.inner.remember_for(id, ttl).await
    }

    async fn forget(&self, id: &str) -> Result<(), DynStoreError> {
        self.inner.forget(id).await
    }

    fn pipelined_remember(
        &self,
        id: &str,
        ttl: Option<Duration>,
        server: &str,
    ) -> Option<crate::pipelined::PipelinedWrite> {
        self.inner.pipelined_remember(id, ttl, server)
    }
}
