//! Handlers and the [`Router`] that dispatches an envelope to the handler of its URN.
//!
//! A handler declared with `#[handler("urn:…")]` carries its URN, so registering it is
//! `router.register(charge {})` (the fn `charge` stays a plain fn; `charge {}` is the
//! handler type the attribute adds beside it); closures can be routed by hand with
//! [`Router::route_sync`] / [`Router::route_async`]. Shared state reaches handlers
//! through [`Router::state`] and their [`State<T>`](crate::extract::State) arguments.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use crate::extract::{MissingState, StateMap};
use babelqueue_core::envelope::Envelope;
use babelqueue_core::guard::{HandlerResult, Outcome, capture_outcome, capture_outcome_sync};

pub use babelqueue_core::{BoxError, BoxFuture};

/// A handler failed: its error, and the name of the error's type (written to
/// `dead_letter.exception`).
#[derive(Debug)]
pub struct HandlerError {
    error: BoxError,
    type_name: &'static str,
}

impl HandlerError {
    /// Wraps a handler's error, remembering its type name.
    pub fn new<E: Into<BoxError>>(error: E) -> Self {
        HandlerError {
            type_name: std::any::type_name::<E>(),
            error: error.into(),
        }
    }

    /// Wraps an error whose type name is given explicitly.
    pub fn with_type_name(error: BoxError, type_name: &'static str) -> Self {
        HandlerError { error, type_name }
    }

    /// The error's type name (e.g. `payments::ChargeError`).
    pub fn type_name(&self) -> &'static str {
        self.type_name
    }

    /// The underlying error.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }

    /// The underlying error, owned.
    pub fn into_error(self) -> BoxError {
        self.error
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for HandlerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

/// What a handler invocation reports: `Ok(Some(outcome))` when an idempotency guard ran
/// inside it (so a skipped duplicate is visible), `Ok(None)` for an unguarded handler.
pub type HandlerOutput = Result<Option<Outcome>, HandlerError>;

/// A message handler for one URN, ready to run: what the runtime calls with each
/// envelope. A [`Router`] hands out its handlers in this form, with the router's state
/// already attached. Implement it by hand for a handler that needs no shared state;
/// `#[handler("urn:…")]` implements [`TypedHandler`] instead.
pub trait Handler: Send + Sync + 'static {
    /// The URN this handler serves.
    fn urn(&self) -> &str;

    /// Handles one envelope.
    fn call(&self, envelope: Envelope) -> BoxFuture<'static, HandlerOutput>;

    /// Whether the shared state this handler's arguments need is there, checked before
    /// any message (a consumer calls it when it starts). The default needs none; a
    /// router's handler checks its `State<T>` arguments against the router's state.
    fn check_state(&self) -> Result<(), MissingState> {
        Ok(())
    }
}

/// A message handler for one URN that reads the router's shared state: what
/// `#[handler("urn:…")]` implements (on the type of the same name as the fn), building
/// each typed argument (`Json<T>`, `State<T>`, ...) from the envelope and the state.
///
/// Every [`Handler`] is a `TypedHandler` that ignores the state, so [`Router::register`]
/// takes both.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a message handler",
    label = "a router registers a `#[handler(\"urn:…\")]` type, written `name {{}}`",
    note = "`#[handler]` keeps your fn as it is and adds a type of the same name that the router registers: write `register(charge {{}})` for a handler fn `charge`"
)]
///
/// Its methods are named apart from [`Handler`]'s (`serves`, `call_with`,
/// `check_state_with`), so both traits can be in scope without making
/// `handler.call(envelope)` ambiguous.
pub trait TypedHandler: Send + Sync + 'static {
    /// The URN this handler serves.
    fn serves(&self) -> &str;

    /// Handles one envelope, with the router's state.
    fn call_with(&self, envelope: Envelope, state: &StateMap) -> BoxFuture<'static, HandlerOutput>;

    /// Whether `state` holds what this handler's arguments need (each `State<T>`
    /// argument, a `T`), checked before any message. The default needs none;
    /// `#[handler]` checks every argument.
    fn check_state_with(&self, state: &StateMap) -> Result<(), MissingState> {
        let _ = state;
        Ok(())
    }
}

impl<H: Handler + ?Sized> TypedHandler for H {
    fn serves(&self) -> &str {
        Handler::urn(self)
    }
    fn call_with(&self, envelope: Envelope, _: &StateMap) -> BoxFuture<'static, HandlerOutput> {
        Handler::call(self, envelope)
    }
    fn check_state_with(&self, _: &StateMap) -> Result<(), MissingState> {
        Handler::check_state(self)
    }
}

/// A [`TypedHandler`] with the state of its router: the [`Handler`] a router hands out.
struct Bound {
    handler: Arc<dyn TypedHandler>,
    state: Arc<StateMap>,
}

impl Handler for Bound {
    fn urn(&self) -> &str {
        self.handler.serves()
    }
    fn call(&self, envelope: Envelope) -> BoxFuture<'static, HandlerOutput> {
        self.handler.call_with(envelope, &self.state)
    }
    fn check_state(&self) -> Result<(), MissingState> {
        self.handler.check_state_with(&self.state)
    }
}

impl<H: Handler + ?Sized> Handler for Arc<H> {
    fn urn(&self) -> &str {
        H::urn(self)
    }
    fn call(&self, envelope: Envelope) -> BoxFuture<'static, HandlerOutput> {
        H::call(self, envelope)
    }
    fn check_state(&self) -> Result<(), MissingState> {
        H::check_state(self)
    }
}

fn into_output<R>(result: R, outcome: Option<Outcome>) -> HandlerOutput
where
    R: HandlerResult,
    R::Error: Into<BoxError>,
{
    match result.into_result() {
        Ok(()) => Ok(outcome),
        Err(e) => Err(HandlerError::new(e)),
    }
}

/// Runs a blocking handler: on tokio's blocking pool when a runtime is present (so a
/// sync store never blocks a worker thread), inline otherwise. A panic becomes a
/// [`HandlerError`].
#[doc(hidden)]
pub fn run_sync<F, R>(f: F) -> BoxFuture<'static, HandlerOutput>
where
    F: FnOnce() -> R + Send + 'static,
    R: HandlerResult + 'static,
    R::Error: Into<BoxError>,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            // The handler's own spans and events belong to the message span, under the
            // caller's subscriber.
            let span = tracing::Span::current();
            let dispatch = tracing::dispatcher::get_default(Clone::clone);
            // Task-locals are not visible on the blocking pool: the replay flag of the
            // delivery is carried into the closure.
            let replay = crate::replay::is_replay();
            // The delivery's probe too, for a guard's owed write (retried until it lands).
            let probe = babelqueue_core::hooks::current();
            let task = handle.spawn_blocking(move || {
                tracing::dispatcher::with_default(&dispatch, || {
                    let _entered = span.enter();
                    babelqueue_core::hooks::sync_scope(probe, || {
                        let (r, o) = crate::replay::sync_scope(replay, || capture_outcome_sync(f));
                        into_output(r, o)
                    })
                })
            });
            Box::pin(async move {
                match task.await {
                    Ok(out) => out,
                    Err(e) => Err(HandlerError::with_type_name(
                        format!("handler panicked: {e}").into(),
                        "panic",
                    )),
                }
            })
        }
        Err(_) => {
            let (r, o) = capture_outcome_sync(f);
            Box::pin(std::future::ready(into_output(r, o)))
        }
    }
}

/// Runs an async handler's future, capturing the guard's outcome.
#[doc(hidden)]
pub fn run_async<Fut, R>(fut: Fut) -> BoxFuture<'static, HandlerOutput>
where
    Fut: Future<Output = R> + Send + 'static,
    R: HandlerResult,
    R::Error: Into<BoxError>,
{
    // The handler's future is moved to the heap once, by itself: the wrapper around it
    // stays small (a large future moved into the wrapper would be copied twice).
    let fut = Box::pin(fut);
    Box::pin(async move {
        let (r, o) = capture_outcome(fut).await;
        into_output(r, o)
    })
}

struct SyncFn<F> {
    urn: String,
    f: Arc<F>,
}

impl<F, R> Handler for SyncFn<F>
where
    F: Fn(&Envelope) -> R + Send + Sync + 'static,
    R: HandlerResult + 'static,
    R::Error: Into<BoxError>,
{
    fn urn(&self) -> &str {
        &self.urn
    }
    fn call(&self, envelope: Envelope) -> BoxFuture<'static, HandlerOutput> {
        let f = Arc::clone(&self.f);
        run_sync(move || f(&envelope))
    }
}

struct AsyncFn<F> {
    urn: String,
    f: F,
}

impl<F, Fut, R> Handler for AsyncFn<F>
where
    F: Fn(Envelope) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: HandlerResult,
    R::Error: Into<BoxError>,
{
    fn urn(&self) -> &str {
        &self.urn
    }
    fn call(&self, envelope: Envelope) -> BoxFuture<'static, HandlerOutput> {
        run_async((self.f)(envelope))
    }
}

/// No handler is registered for an envelope's URN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no handler registered for URN `{0}`")]
pub struct UnknownUrn(pub String);

/// Routes envelopes to handlers by URN.
///
/// ```
/// use babelqueue_core::Envelope;
/// use babelqueue_runtime::Router;
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let router = Router::new()
///     .route_sync("urn:babel:orders:created", |env: &Envelope| {
///         assert_eq!(env.data["order_id"], 1042);
///     })
///     .route_async("urn:babel:payments:charge", |_env: Envelope| async {
///         Ok::<(), std::io::Error>(())
///     });
/// let env = Envelope::new("urn:babel:orders:created", serde_json::json!({"order_id": 1042}))?;
/// router.dispatch(env).await?.unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// Shared state is registered once, by type, and reaches every handler taking a
/// [`State<T>`](crate::extract::State) argument:
///
/// ```
/// use babelqueue_core::Envelope;
/// use babelqueue_runtime::{Router, TypedHandler};
/// use babelqueue_runtime::extract::StateMap;
/// struct Pool(&'static str);
/// let router = Router::new().state(Pool("postgres://…"));
/// assert_eq!(router.state_map().get::<Pool>().map(|p| p.0), Some("postgres://…"));
/// ```
#[derive(Clone, Default)]
pub struct Router {
    /// The handlers as registered.
    handlers: HashMap<String, Arc<dyn TypedHandler>>,
    /// The same handlers bound to `state`: what [`Router::get`] hands out.
    routes: HashMap<String, Arc<dyn Handler>>,
    state: Arc<StateMap>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut urns: Vec<_> = self.routes.keys().collect();
        urns.sort();
        f.debug_struct("Router")
            .field("urns", &urns)
            .field("state", &self.state)
            .finish()
    }
}

impl Router {
    /// An empty router.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a handler under the URN it declares: a `#[handler("urn:…")]` fn
    /// `charge` is registered as `register(charge {})`; any [`Handler`] works too. A
    /// later registration for the same URN replaces the earlier one.
    pub fn register<H: TypedHandler>(mut self, handler: H) -> Self {
        self.add(handler);
        self
    }

    /// Registers a handler in place (see [`register`](Self::register)).
    pub fn add<H: TypedHandler>(&mut self, handler: H) -> &mut Self {
        let urn = handler.serves().to_owned();
        let handler: Arc<dyn TypedHandler> = Arc::new(handler);
        self.routes.insert(urn.clone(), self.bind(&handler));
        self.handlers.insert(urn, handler);
        self
    }

    /// Adds shared state: every handler taking a [`State<T>`](crate::extract::State)
    /// argument gets `value` (shared behind an `Arc`; `T` need not be `Clone`). One
    /// value per type; a second value of the same type replaces the
    /// first. Order does not matter: state added after a handler reaches it too.
    ///
    /// ```
    /// use babelqueue_core::{Envelope, InMemoryStore};
    /// use babelqueue_runtime::Router;
    /// let store = InMemoryStore::new(); // chosen at start-up: no `static` needed
    /// let router = Router::new().state(store);
    /// # let _ = router;
    /// ```
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.add_state(value);
        self
    }

    /// Adds shared state you already hold in an `Arc`: handlers taking a
    /// [`State<T>`](crate::extract::State) get a clone of `value` (the same `T`, not a
    /// copy), and you keep your handle. [`state(arc)`](Self::state) would register an
    /// `Arc<T>`, read by `State<Arc<T>>`; this registers the `T`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use babelqueue_runtime::Router;
    /// struct Ledger { fee: u32 }
    /// let ledger = Arc::new(Ledger { fee: 30 }); // also used outside the handlers
    /// let router = Router::new().state_arc(Arc::clone(&ledger));
    /// // What a `State<Ledger>` argument receives: your `Arc`.
    /// let shared: Arc<Ledger> = router.state_map().get_shared::<Ledger>().unwrap();
    /// assert!(Arc::ptr_eq(&shared, &ledger));
    /// assert_eq!(shared.fee, 30);
    /// ```
    pub fn state_arc<T: Send + Sync + 'static>(mut self, value: Arc<T>) -> Self {
        self.add_state_arc(value);
        self
    }

    /// Adds shared state in place (see [`state`](Self::state)).
    pub fn add_state<T: Send + Sync + 'static>(&mut self, value: T) -> &mut Self {
        self.add_state_arc(Arc::new(value))
    }

    /// Adds shared state from your own `Arc` in place (see [`state_arc`](Self::state_arc)).
    pub fn add_state_arc<T: Send + Sync + 'static>(&mut self, value: Arc<T>) -> &mut Self {
        Arc::make_mut(&mut self.state).insert_arc(value);
        let handlers: Vec<_> = self.handlers.values().cloned().collect();
        for handler in handlers {
            let bound = self.bind(&handler);
            self.routes.insert(handler.serves().to_owned(), bound);
        }
        self
    }

    /// Checks, before any message, that the router holds the shared state every
    /// handler needs (each `State<T>` argument of a `#[handler]` fn, a `T`); the first
    /// one missing (by URN order) names its type and the handler. A consumer
    /// ([`App::drain`](crate::App::drain),
    /// [`App::run_until`](crate::App::run_until)) calls it when it starts.
    ///
    /// With `babelqueue`'s `#[handler("urn:babel:payments:charge")] async fn charge(pool:
    /// State<Pool>)`, `Router::new().register(charge {}).check_state()` fails with "the
    /// handler `charge` (`urn:babel:payments:charge`) takes `State<Pool>` but the router
    /// has no `Pool`; ...". A handler written by hand says what it needs:
    ///
    /// ```
    /// use babelqueue_runtime::extract::{MissingState, StateMap};
    /// use babelqueue_core::{BoxFuture, Envelope};
    /// use babelqueue_runtime::{FromEnvelope, Router, State, TypedHandler};
    /// use babelqueue_runtime::handler::HandlerOutput;
    /// struct Pool;
    /// struct Charge;
    /// impl TypedHandler for Charge {
    ///     fn serves(&self) -> &str { "urn:babel:payments:charge" }
    ///     fn call_with(&self, _: Envelope, _: &StateMap) -> BoxFuture<'static, HandlerOutput> {
    ///         Box::pin(async { Ok(None) })
    ///     }
    ///     fn check_state_with(&self, state: &StateMap) -> Result<(), MissingState> {
    ///         State::<Pool>::check_state(state)
    ///     }
    /// }
    /// let router = Router::new().register(Charge);
    /// let missing = router.check_state().unwrap_err();
    /// assert!(missing.type_name().ends_with("Pool"));
    /// assert!(router.state(Pool).check_state().is_ok());
    /// ```
    pub fn check_state(&self) -> Result<(), MissingState> {
        let mut urns: Vec<&String> = self.routes.keys().collect();
        urns.sort();
        for urn in urns {
            if let Some(handler) = self.routes.get(urn) {
                Handler::check_state(&**handler)?;
            }
        }
        Ok(())
    }

    /// The shared state handlers receive.
    pub fn state_map(&self) -> &StateMap {
        &self.state
    }

    fn bind(&self, handler: &Arc<dyn TypedHandler>) -> Arc<dyn Handler> {
        Arc::new(Bound {
            handler: Arc::clone(handler),
            state: Arc::clone(&self.state),
        })
    }

    /// Routes `urn` to a blocking closure taking `&Envelope` and returning `()` or
    /// `Result<(), E>`.
    pub fn route_sync<F, R>(self, urn: impl Into<String>, f: F) -> Self
    where
        F: Fn(&Envelope) -> R + Send + Sync + 'static,
        R: HandlerResult + 'static,
        R::Error: Into<BoxError>,
    {
        self.register(SyncFn {
            urn: urn.into(),
            f: Arc::new(f),
        })
    }

    /// Routes `urn` to an async closure taking the `Envelope` by value.
    pub fn route_async<F, Fut, R>(self, urn: impl Into<String>, f: F) -> Self
    where
        F: Fn(Envelope) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: HandlerResult,
        R::Error: Into<BoxError>,
    {
        self.register(AsyncFn { urn: urn.into(), f })
    }

    /// The handler for `urn`, if any, with the router's state attached: call it with
    /// the envelope alone.
    pub fn get(&self, urn: &str) -> Option<&Arc<dyn Handler>> {
        self.routes.get(urn)
    }

    /// The registered URNs (unordered).
    pub fn urns(&self) -> impl Iterator<Item = &str> {
        self.routes.keys().map(String::as_str)
    }

    /// Dispatches an envelope to the handler of its URN.
    ///
    /// `Err(UnknownUrn)` when none is registered; otherwise the handler's output.
    pub async fn dispatch(&self, envelope: Envelope) -> Result<HandlerOutput, UnknownUrn> {
        match self.routes.get(envelope.urn()) {
            Some(h) => Ok(h.call(envelope).await),
            None => Err(UnknownUrn(envelope.job)),
        }
    }
}
