//! Procedural macros of BabelQueue: [`#[idempotent]`](macro@idempotent) and
//! [`#[handler]`](macro@handler).
//!
//! Use them through the `babelqueue` facade (`babelqueue::idempotent`,
//! `babelqueue::handler`). This crate only turns tokens into one call of the runtime's
//! hidden `__private` module: all behaviour lives (and is tested) in `babelqueue-core` (the guard)
//! and `babelqueue-runtime` (the router).
//!
//! Layout: `attr` parses the arguments (each with its span), `validate` checks the
//! shape of the fn, `expand` generates the code, `krate` finds the runtime crate.
#![warn(missing_docs)]

mod attr;
mod duration;
mod expand;
mod krate;
mod validate;

use proc_macro::TokenStream;

/// Makes a message handler idempotent: a delivery whose key (by default the envelope's
/// `meta.id`) was already handled is skipped.
///
/// ```
/// use std::sync::LazyLock;
/// use babelqueue::{Envelope, InMemoryStore, idempotent};
///
/// static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("card declined")]
/// pub struct ChargeError;
///
/// #[idempotent(store = STORE)]
/// fn charge(env: &Envelope) -> Result<(), ChargeError> {
///     println!("charging {}", env.data["amount"]);
///     Ok(())
/// }
///
/// let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
/// charge(&env)?; // charges
/// charge(&env)?; // the same meta.id again (a redelivery): skipped, returns Ok(())
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// An `async fn` works the same way, with an [`AsyncStore`] (the Redis and PostgreSQL
/// stores are async only; `InMemoryStore` is both):
///
/// ```
/// use std::sync::LazyLock;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use babelqueue::{Envelope, InMemoryStore, idempotent};
///
/// static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
/// static CHARGES: AtomicU32 = AtomicU32::new(0);
///
/// #[idempotent(store = STORE, ttl = "24h")]
/// async fn charge(env: &Envelope) -> Result<(), std::io::Error> {
///     CHARGES.fetch_add(1, Ordering::SeqCst);
///     Ok(())
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
/// charge(&env).await?;
/// charge(&env).await?;
/// assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # What the expansion does
///
/// The fn keeps its attributes, visibility, generics, where-clause, receiver and
/// signature exactly as written; only its body is replaced. In plain words, the new body:
///
/// 1. computes the key first, as an owned value (kept inline up to 62 bytes, so a UUID
///    `meta.id` costs no heap allocation): `key = ...` if given, else the `meta.id` of the
///    fn's `Envelope` / `&Envelope` parameter;
/// 2. hands the store, the key, the `ttl` and your original body (wrapped in a closure,
///    or an async closure for an `async fn`, so `return` and `?` mean what they meant) to
///    the guard of `babelqueue-core` ([`Guard`]: its `run` for a sync fn, `run_async` for
///    an `async fn`; in lease mode with `lease = ...`);
/// 3. returns what the guard decided: your body's own result when it ran, `Ok(())` (or
///    `()`) when the key had been seen, the store's error (converted into yours) when the
///    store could not answer.
///
/// For the sync `charge` above it is, give or take paths:
///
/// ```text
/// fn charge(env: &Envelope) -> Result<(), ChargeError> {
///     let key = KeySource::guard_key(&*env);                  // env.meta.id
///     SyncGuard::<<Result<(), ChargeError> as IdempotentReturn>::Kind>::guard(
///         &STORE, key, None,
///         || -> Result<(), ChargeError> {
///             println!("charging {}", env.data["amount"]);     // your body
///             Ok(())
///         },
///         || store_error_into,                                // at the return type
///     )
/// }
/// ```
///
/// The last argument converts the store's error into yours; it is spanned at your return
/// type, so a store error that does not convert is reported there.
///
/// Generated locals are mixed-site (hygienic): a parameter of yours named like one is
/// never shadowed. The body of an `async fn` starts with a "fake return" at the
/// declared return type (as `tracing`'s `#[instrument]` does), so `return
/// Err(Box::new(io_error))` into `Box<dyn Error + Send + Sync>`, or a tail `Err(&string)`
/// into `&str`, coerce exactly as without the attribute.
///
/// The guard is the contract every BabelQueue SDK shares: no usable key → the body runs
/// and nothing is remembered (fail open); key seen → skip; otherwise run, and remember
/// the key only if the body succeeded (a failure leaves it open for the retry); a failing
/// `seen` returns the store's error so the message is retried. It is post-success
/// dedupe, not a lock: two workers may run the same id at the same moment, unless you use
/// `lease = ...`.
///
/// # Arguments
///
/// | argument | meaning |
/// | --- | --- |
/// | `store = <expr>` | **Required.** The seen-set store: any expression, evaluated on every call and borrowed for it: a parameter (in a `#[handler]`, `store: State<S>` from the router's state, so a store picked at start-up needs no `static`), a `static` (`std::sync::LazyLock` or `once_cell::sync::Lazy`), a path (`stores::PAYMENTS`), `&*STORE`, a field (`self.store`), a function call, an `Arc`. A sync fn needs a [`Store`], an `async fn` an [`AsyncStore`]. |
/// | `key = <expr>` | The dedupe key instead of `meta.id`, with the fn's parameters in scope: a business id such as `key = env.data.get("payment_id")`, because a client that retries publishes a *new* message with a new `meta.id`. Any [`DedupeKey`]: strings, integers, `Uuid`, JSON values, `Option`s of them. An absent or empty key fails open (the body runs). The key is **namespaced per handler**: stored as `<the envelope's job>#<key>`, so two handlers keyed on the same business id (`charge`, `refund`) do not skip each other; the fn therefore needs an `Envelope` parameter, unless `namespace = ...` is given. |
/// | `namespace = "billing"` / `namespace = none` | With `key`: the namespace of the key instead of the handler's URN (a literal checked at compile time: non-empty, no `#`), shared on purpose by handlers that must dedupe each other, or usable without an `Envelope` parameter; `none` stores the key bare, as other SDKs write it. `meta.id` keys are never namespaced. |
/// | `ttl = "24h"` | How long the key stays remembered, where the store supports expiry (default: the store's own). A literal checked at compile time: a number and a unit (`ms`, `s`, `m`, `h`, `d`), or several, largest first: `"500ms"`, `"30s"`, `"15m"`, `"7d"`, `"1h30m"`. |
/// | `lease = "30s"` | Lease mode: claim the key atomically before running, so two workers never run it at the same moment; the claim expires by itself after the lease (a crashed worker does not block the id forever). A key in flight elsewhere returns [`InFlight`] (converted into your error, so it must implement `From<InFlight>`): do not ack, retry later. Needs a [`LeaseStore`] / [`AsyncLeaseStore`] and a `Result<(), E>` return. |
/// | `fingerprint` | A flag: the store keeps a digest (SHA-256 of the canonical JSON of `data`) with the key, and a later delivery of the key with another payload is refused with [`PayloadMismatch`] (converted into your error, so it must implement `From<PayloadMismatch>`; the runtime dead-letters it as `failed`) instead of being skipped. Needs a store keeping fingerprints (`InMemoryStore`, SQLite for a sync fn; Redis, PostgreSQL, SQLite, `InMemoryStore` for an `async fn`), an `Envelope` parameter and a `Result<(), E>` return; not with `lease`. |
/// | `transactional = tx` | The body runs in the store's transaction, given to it under the name `tx` (any name): its writes through `tx` and the id's row commit together, or neither does. A sync fn needs the SQLite store (`tx` is a `rusqlite::Transaction`), an `async fn` the PostgreSQL store (`tx` is a `tokio_postgres::Transaction`). Combines with `key`, `namespace`, `ttl`, `fingerprint`; not with `lease`. |
/// | `crate = <path>` | Where the runtime is, for crates that re-export babelqueue (`crate = my_platform::queue`). By default the macro reads your `Cargo.toml`: `::babelqueue` (or its renamed name), else `::babelqueue_runtime` when you depend on the runtime crate without the facade (`crate = ::babelqueue_core` for `#[idempotent]` alone over the core crate). |
///
/// # Supported forms
///
/// - sync `fn` and `async fn` (the async store is awaited, never blocking the executor);
/// - the envelope as `Envelope`, `&Envelope` or `&mut Envelope`, at any position among
///   other parameters (any type path ending in `Envelope`);
/// - free fns, and methods with `&self`, `&mut self` or `self` in `impl` blocks; generic
///   fns, `impl Trait` arguments, where-clauses, lifetimes (a store generic over `S`
///   needs the bound `S::Error: IntoHandlerError<E>`: `E: From<S::Error>` alone does not
///   cover the stores that cannot fail, whose error converts into any `E`);
/// - return type `()` (only with a store that cannot fail, such as `InMemoryStore`) or
///   `Result<(), E>` where the store's error converts into `E` (any `E` with an
///   infallible store); `?` and early `return` behave exactly as before;
/// - any other attributes, above or below: doc comments, `#[cfg]`, `#[allow]`, inner
///   attributes, `#[tracing::instrument]`, `#[handler]`; any visibility.
///
/// A `const fn`, an `unsafe fn` or an `extern` fn is rejected (the guard calls the store at run time; the
/// runtime cannot uphold an unsafe fn's contract). A skipped duplicate has no value to
/// return, so `Result<T, E>` with `T` other than `()` is rejected too.
///
/// # Costs and limits
///
/// - An `async fn` allocates one box per call for the guard's future; this is what lets a
///   store that does not fit be reported once, at `store = ...`. The future stays `Send`
///   when your body's is.
/// - The store expression is borrowed for the whole call. With `&mut self`, a body that
///   mutates other fields of `self` is fine (`store = self.store` borrows only that
///   field), but a body calling a `&mut self` method while `store = self.store` is a
///   borrow conflict: keep the store outside `self`, or in an `Arc` (`store =
///   self.store.clone()`).
///
/// # Compile-time errors
///
/// Each error points at the offending tokens and says what to write instead: a missing
/// `store`; a bare `#[idempotent(STORE)]`; an unknown argument (with the valid ones and
/// a "did you mean"); an argument given twice; a malformed `ttl`/`lease` literal or a
/// non-literal one; the attribute on something that is not a fn with a body; no
/// `Envelope` parameter and no `key`; two `Envelope` parameters and no `key`; an unnamed
/// envelope parameter (`_: &Envelope`); `const fn`; `unsafe fn`; a return type other
/// than `()` / `Result<(), E>`; `lease` with a `()` return; a
/// `namespace` that is empty, contains `#`, is not a literal, or comes without `key`; a
/// namespaced `key` or `fingerprint` without an `Envelope` parameter; `fingerprint = ...`,
/// `fingerprint` twice, with `lease` or with a `()` return; `transactional` with `lease`,
/// or `transactional = ` something other than a name; and, from the type checker,
/// with the message naming your expression: a `store` that is not a store, a sync-only
/// store on an `async fn` or an async-only store on a sync fn, a `()` return with a store
/// that can fail, a store error that does not convert into your error, a store without
/// claims in lease mode, an error without `From<InFlight>` in lease mode, a `key` that is
/// not a [`DedupeKey`], an error without `From<PayloadMismatch>` with `fingerprint`, a
/// store that keeps no fingerprints or has no transactions.
///
/// [`Store`]: https://docs.rs/babelqueue/latest/babelqueue/trait.Store.html
/// [`AsyncStore`]: https://docs.rs/babelqueue/latest/babelqueue/trait.AsyncStore.html
/// [`LeaseStore`]: https://docs.rs/babelqueue/latest/babelqueue/trait.LeaseStore.html
/// [`AsyncLeaseStore`]: https://docs.rs/babelqueue/latest/babelqueue/trait.AsyncLeaseStore.html
/// [`DedupeKey`]: https://docs.rs/babelqueue/latest/babelqueue/trait.DedupeKey.html
/// [`InFlight`]: https://docs.rs/babelqueue/latest/babelqueue/struct.InFlight.html
/// [`PayloadMismatch`]: https://docs.rs/babelqueue/latest/babelqueue/struct.PayloadMismatch.html
/// [`Guard`]: https://docs.rs/babelqueue/latest/babelqueue/struct.Guard.html
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}

/// Declares the URN a handler serves, next to the handler, so a `Router` learns it from
/// the handler itself: `router.register(charge {})`.
///
/// ```
/// use babelqueue::{Attempts, Envelope, InMemoryStore, Json, Outcome, Router, State};
/// use babelqueue::{handler, idempotent};
///
/// #[derive(serde::Deserialize)]
/// struct Payment { amount: u64 }
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("card declined")]
/// pub struct ChargeError;
///
/// /// Charges a payment, once per `meta.id`, with the store from the router's state.
/// #[handler("urn:babel:payments:charge")]
/// #[idempotent(store = store)]
/// async fn charge(
///     Json(payment): Json<Payment>,
///     store: State<InMemoryStore>,
///     env: &Envelope,
/// ) -> Result<(), ChargeError> {
///     println!("charging {}", payment.amount);
///     Ok(())
/// }
///
/// /// Records a refund (sync handlers work too).
/// #[handler("urn:babel:payments:refund")]
/// fn refund(env: &Envelope, attempts: Attempts) {}
///
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({"amount": 4200}))?;
///
/// // The router learns both URNs from the handlers: no URN is written twice. The
/// // store is an ordinary value handed to the router, not a `static`.
/// let router = Router::new()
///     .state(InMemoryStore::new())
///     .register(charge {})
///     .register(refund {});
/// assert_eq!(router.dispatch(env.clone()).await?.map_err(|e| e.to_string())?, Some(Outcome::Ran));
/// assert_eq!(router.dispatch(env).await?.map_err(|e| e.to_string())?, Some(Outcome::Skipped));
///
/// // The fn is still a plain fn: a unit test calls it directly.
/// refund(&Envelope::new("urn:babel:payments:refund", serde_json::json!({}))?, Attempts(0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # What the expansion does
///
/// `#[handler("urn:babel:payments:charge")] async fn charge(...) -> R { ... }` keeps the
/// fn exactly as written (name, attributes, signature, body: backtraces, `tracing`
/// spans, `#[must_use]` and `#[deprecated]` behave as without the attribute) and adds,
/// in the type namespace, a handler type of the same name, like Rocket's routes:
///
/// - `charge` is a type alias of a hidden unit-like struct, so `charge {}` is the value
///   a router registers (`Router::register(charge {})`); it carries your `#[cfg]` and
///   `#[deprecated]` attributes;
/// - it implements `TypedHandler`: `serves()` returns the literal; `call_with(envelope,
///   state)` builds each argument, then runs the fn (a sync fn on tokio's blocking pool,
///   an async fn as a task's future), reporting whether a guard inside it ran or
///   skipped.
///
/// A `mod charge` beside a handler `charge` is one error at the fn's name (both live in
/// the type namespace): rename one.
///
/// # Arguments
///
/// In any order, each built before the body runs:
///
/// | argument | what it receives |
/// | --- | --- |
/// | `Json<T>` (or `Json(x): Json<T>`) | the payload (`data`) deserialized with serde into `T: DeserializeOwned` |
/// | `State<T>` | shared state of type `T`, added once with `Router::state(value)` (behind an `Arc`; `T` need not be `Clone`) |
/// | `Attempts` | how many times the message was delivered before (`0` the first time) |
/// | `Meta` | the envelope's `meta` block |
/// | `&Envelope`, `&mut Envelope`, `Envelope` | the envelope (by value at most once) |
/// | any `T: FromEnvelope` | your own extractor |
///
/// A payload that does not deserialize into `T` is a permanent failure: the body does
/// not run, and the router returns a `PayloadError` (serde's message as its source),
/// which the runtime dead-letters at once as `failed`. A `State<T>` the router does not
/// hold is a `MissingState` error (the body does not run; the message is retried like
/// any failure). The lease's fencing token is not an argument yet.
///
/// # Associated fns
///
/// Put `#[handler]` (without a URN) on the `impl` block and `#[handler("urn:...")]` on
/// each handler fn inside it; each gets a handler type named like the fn beside the
/// impl, registered the same way (`register(charge {})`):
///
/// ```
/// use babelqueue::{Envelope, Router, handler};
///
/// struct Payments;
///
/// #[handler]
/// impl Payments {
///     #[handler("urn:babel:payments:charge")]
///     fn charge(env: &Envelope) {}
/// }
///
/// let router = Router::new().register(charge {});
/// # assert_eq!(router.urns().count(), 1);
/// ```
///
/// A `#[handler("urn:...")]` fn inside an `impl` without `#[handler]` on the impl
/// cannot add its type there (rustc: "struct is not supported in `trait`s or `impl`s").
///
/// # Rules
///
/// - the argument is the URN as a string literal: non-empty, no whitespace, starting with
///   `urn:` and without an empty part (`"urn:babel:payments:charge"`); an optional
///   `crate = <path>` follows it, as for `#[idempotent]`;
/// - the handler is not generic, takes no `self`, is neither `unsafe` nor `extern`;
///   every parameter is the envelope or a type the router can build (no other
///   borrowed argument, no `impl Trait`);
/// - it returns `()` or `Result<(), E>` with `E: std::error::Error + Send + Sync +
///   'static` (what the runtime records when it retries or dead-letters); an async
///   handler's future must be `Send`.
///
/// Each rule broken is one compile error at the offending tokens.
#[proc_macro_attribute]
pub fn handler(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::handler(args.into(), item.into()).into()
}
