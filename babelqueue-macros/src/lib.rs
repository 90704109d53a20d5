//! Procedural macros of BabelQueue: `#[idempotent]` and `#[handler]`.
//!
//! Use them through the `babelqueue` facade (`babelqueue::idempotent`,
//! `babelqueue::handler`), whose documentation describes every argument, every supported
//! form and what the expansion does. This crate only turns tokens into a call of the
//! runtime's hidden `__private` module: all behaviour lives (and is tested) in
//! `babelqueue-core`.
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

/// Guards a handler fn with the idempotency guard: a delivery whose key (by default the
/// envelope's `meta.id`) was already processed is skipped. See `babelqueue::idempotent`
/// for the full documentation.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}

/// Declares the URN a handler fn serves, so `Router::register(handler)` learns it. See
/// `babelqueue::handler` for the full documentation.
#[proc_macro_attribute]
pub fn handler(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::handler(args.into(), item.into()).into()
}
