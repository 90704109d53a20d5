//! The seen-set Store traits: [`Store`] (blocking) and [`AsyncStore`] (async).
//!
//! A store answers one question: "was this id processed?". It has three operations,
//! `seen`, `remember` and `forget`, each fallible with the store's own error type. A store
//! that cannot fail (the [`InMemoryStore`](crate::InMemoryStore)) uses
//! [`Infallible`], which is what lets a handler returning `()` use
//! it.
//!
//! # Why two traits
//!
//! A sync handler must not need an async runtime, and an async handler must never block a
//! tokio worker thread on a network or disk call. So a backend implements the trait that
//! matches how it does I/O: Redis and PostgreSQL implement [`AsyncStore`] only; the
//! in-memory store implements both (its calls never block); the embedded SQLite store
//! implements [`Store`] and also [`AsyncStore`] by moving its calls onto tokio's blocking
//! pool. The guard picks the trait from the handler: [`Guard::run`](crate::Guard::run)
//! needs a [`Store`], [`Guard::run_async`](crate::Guard::run_async) an [`AsyncStore`].
//!
//! Both traits are implemented for `&S`, `Box<S>`, `Arc<S>`, `std::sync::LazyLock<S>` and
//! `once_cell::sync::Lazy<S>`, so a store can live in a `static` and be passed as is.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// A blocking seen-set store.
///
/// ```
/// use babelqueue_core::{InMemoryStore, Store};
/// let store = InMemoryStore::new();
/// assert!(!Store::seen(&store, "id-A").unwrap());
/// Store::remember(&store, "id-A").unwrap();
/// assert!(Store::seen(&store, "id-A").unwrap());
/// Store::forget(&store, "id-A").unwrap();
/// assert!(!Store::seen(&store, "id-A").unwrap());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a blocking seen-set store: it does not implement `babelqueue::Store`",
    label = "expected a `babelqueue::Store` here",
    note = "a sync handler needs a blocking `Store`: `InMemoryStore`, the SQLite store, or your own `impl babelqueue::Store`; a store implementing only `AsyncStore` (Redis, PostgreSQL) needs an `async fn` handler",
    note = "a reference, `Box`, `Arc`, `LazyLock` or `State` of a store is a store; a `Mutex` or `RwLock` of one is not (a store's methods take `&self`: share the store itself)"
)]
pub trait Store {
    /// The store's error (use [`std::convert::Infallible`] for a store that cannot fail).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Whether `id` was remembered (and has not expired or been forgotten).
    fn seen(&self, id: &str) -> Result<bool, Self::Error>;

    /// Remembers `id` as processed, with the store's default TTL (if any).
    fn remember(&self, id: &str) -> Result<(), Self::Error>;

    /// Remembers `id` for `ttl` (`None`: the store's default). A store without
    /// per-entry expiry ignores `ttl` and behaves like [`remember`](Self::remember).
    fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), Self::Error> {
        let _ = ttl;
        self.remember(id)
    }

    /// Evicts `id`, so a later delivery runs again (manual replay).
    fn forget(&self, id: &str) -> Result<(), Self::Error>;
}

/// An async seen-set store (network or disk backends, used by `async fn` handlers).
///
/// The futures are `Send`, so a guarded handler can run on a multi-threaded runtime.
///
/// ```
/// use babelqueue_core::{AsyncStore, InMemoryStore};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// AsyncStore::remember(&store, "id-A").await.unwrap();
/// assert!(AsyncStore::seen(&store, "id-A").await.unwrap());
/// # });
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an async seen-set store: it does not implement `babelqueue::AsyncStore`",
    label = "expected a `babelqueue::AsyncStore` here",
    note = "an `async fn` handler needs an `AsyncStore`: `InMemoryStore`, the Redis, PostgreSQL or SQLite stores, or your own `impl babelqueue::AsyncStore`; a store implementing only the blocking `Store` needs a sync fn",
    note = "a reference, `Box`, `Arc`, `LazyLock` or `State` of a store is a store; a `Mutex` or `RwLock` of one is not (a store's methods take `&self`: share the store itself)"
)]
pub trait AsyncStore: Send + Sync {
    /// The store's error (use [`std::convert::Infallible`] for a store that cannot fail).
    type Error: std::error::Error + Send + Sync + 'static;

    /// Whether `id` was remembered (and has not expired or been forgotten).
    fn seen(&self, id: &str) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Remembers `id` as processed, with the store's default TTL (if any).
    fn remember(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Remembers `id` for `ttl` (`None`: the store's default). A store without
    /// per-entry expiry ignores `ttl` and behaves like [`remember`](Self::remember).
    fn remember_for(
        &self,
        id: &str,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = ttl;
        self.remember(id)
    }

    /// Evicts `id`, so a later delivery runs again (manual replay).
    fn forget(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// `remember_for(id, ttl)` as one command for `server`, when this store lives on that
    /// server: the consume runtime then sends it just before the message's ack, in the
    /// same round trip (see [`pipelined`](crate::pipelined)). `None` (the default): the
    /// guard calls [`remember_for`](Self::remember_for) itself.
    ///
    /// Only offer it when the command has exactly `remember_for`'s effect.
    fn pipelined_remember(
        &self,
        id: &str,
        ttl: Option<Duration>,
        server: &str,
    ) -> Option<crate::pipelined::PipelinedWrite> {
        let _ = (id, ttl, server);
        None
    }
}

macro_rules! forward_store {
    ($(impl[$($g:tt)*] for $ty:ty;)*) => {$(
        impl<$($g)*> Store for $ty {
            type Error = S::Error;
            fn seen(&self, id: &str) -> Result<bool, Self::Error> { S::seen(self, id) }
            fn remember(&self, id: &str) -> Result<(), Self::Error> { S::remember(self, id) }
            fn remember_for(&self, id: &str, ttl: Option<Duration>) -> Result<(), Self::Error> {
                S::remember_for(self, id, ttl)
            }
            fn forget(&self, id: &str) -> Result<(), Self::Error> { S::forget(self, id) }
        }
    )*};
}

macro_rules! forward_async_store {
    ($(impl[$($g:tt)*] for $ty:ty;)*) => {$(
        impl<$($g)*> AsyncStore for $ty {
            type Error = S::Error;
            fn seen(&self, id: &str) -> impl Future<Output = Result<bool, Self::Error>> + Send {
                S::seen(self, id)
            }
            fn remember(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
                S::remember(self, id)
            }
            fn remember_for(
                &self,
                id: &str,
                ttl: Option<Duration>,
            ) -> impl Future<Output = Result<(), Self::Error>> + Send {
                S::remember_for(self, id, ttl)
            }
            fn forget(&self, id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
                S::forget(self, id)
            }
            fn pipelined_remember(
                &self,
                id: &str,
                ttl: Option<Duration>,
                server: &str,
            ) -> Option<crate::pipelined::PipelinedWrite> {
                S::pipelined_remember(self, id, ttl, server)
            }
        }
    )*};
}

forward_store! {
    impl[S: Store + ?Sized] for &S;
    impl[S: Store + ?Sized] for Box<S>;
    impl[S: Store + ?Sized] for Arc<S>;
    impl[S: Store, F: FnOnce() -> S] for LazyLock<S, F>;
    impl[S: Store, F: FnOnce() -> S] for once_cell::sync::Lazy<S, F>;
}

forward_async_store! {
    impl[S: AsyncStore + ?Sized] for &S;
    impl[S: AsyncStore + ?Sized] for Box<S>;
    impl[S: AsyncStore + ?Sized] for Arc<S>;
    impl[S: AsyncStore, F: FnOnce() -> S + Send] for LazyLock<S, F>;
    impl[S: AsyncStore, F: FnOnce() -> S + Send] for once_cell::sync::Lazy<S, F>;
}

/// Converts a store's error into a handler's error type: what the guard needs to return a
/// failing `seen` through the handler's own `Result`.
///
/// Implemented for [`Infallible`] into *any* type (so an [`InMemoryStore`](crate::InMemoryStore)
/// works with every handler error, with no `From` impl to write), and for each backend's
/// error type into every `E: From<ThatError>`. A store of your own declares the same with
/// [`handler_error_from!`](crate::handler_error_from).
///
/// ```
/// use babelqueue_core::store::IntoHandlerError;
/// #[derive(Debug)]
/// struct ChargeError;
/// fn convert(e: std::convert::Infallible) -> ChargeError { e.into_handler_error() }
/// ```
#[diagnostic::on_unimplemented(
    message = "the store's error `{Self}` cannot be returned as the handler's error `{E}`",
    label = "the store's error must convert into `{E}`",
    note = "implement `From<{Self}> for {E}`, or return `Result<(), Box<dyn std::error::Error + Send + Sync>>`"
)]
pub trait IntoHandlerError<E> {
    /// Converts the error.
    fn into_handler_error(self) -> E;
}

impl<E> IntoHandlerError<E> for Infallible {
    fn into_handler_error(self) -> E {
        match self {}
    }
}

/// Declares that a store error type converts into every handler error `E: From<It>`.
///
/// ```
/// #[derive(Debug, thiserror::Error)]
/// #[error("my store is down")]
/// pub struct MyStoreError;
/// babelqueue_core::handler_error_from!(MyStoreError);
///
/// #[derive(Debug)]
/// struct HandlerError(MyStoreError);
/// impl From<MyStoreError> for HandlerError { fn from(e: MyStoreError) -> Self { HandlerError(e) } }
///
/// use babelqueue_core::store::IntoHandlerError;
/// let e: HandlerError = MyStoreError.into_handler_error();
/// ```
#[macro_export]
macro_rules! handler_error_from {
    ($($ty:ty),+ $(,)?) => {$(
        impl<E: ::core::convert::From<$ty>> $crate::store::IntoHandlerError<E> for $ty {
            fn into_handler_error(self) -> E {
                E::from(self)
            }
        }
    )+};
}

handler_error_from!(std::io::Error, crate::outcome::BoxError);
