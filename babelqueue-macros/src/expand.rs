//! Code generation. The user's fn keeps its attributes, visibility and signature exactly as
//! written; only the body changes. On any error the user's fn is emitted unchanged next
//! to the errors, so one mistake does not cascade into errors at every call site.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::{AttrStyle, Attribute, Expr, Ident, ItemFn, ReturnType};

use crate::attr::{self, Errors, IdempotentArgs};
use crate::krate;
use crate::validate::{self, EnvRef, HandlerArg, Return};

/// `#[idempotent(...)]`.
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let (args, mut errors) = attr::parse_idempotent(args);
    let f = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            errors.push(validate::not_a_fn("idempotent", &item));
            return with_errors(errors, item);
        }
    };
    let mut args = args;
    // Under `#[handler("urn:...")]` (written below this attribute, so still on the fn), a
    // custom key of a fn without an envelope parameter is namespaced by that URN: the
    // `job` of every envelope the router gives the fn.
    if args.key.is_some()
        && args.namespace.is_none()
        && !validate::has_named_envelope(&f.sig)
        && let Some(urn) = handler_urn(&f.attrs)
    {
        let span = urn.span();
        args.namespace = Some((attr::NamespaceArg::Explicit(urn), span));
    }
    let shape = validate::idempotent(&f, &args, &mut errors);
    if let Err(e) = errors.into_result() {
        let mut f = f;
        if validate::idempotent_rejects_return(&f.sig.output) {
            mark_return_reported(&mut f.attrs);
        }
        return with_errors_fn(e, &f);
    }
    let Some(store) = &args.store else {
        // Unreachable: a missing store is an error above.
        return f.into_token_stream();
    };
    guarded_fn(&args, store, &shape, f)
}

/// Adds the hidden argument [`attr::RETURN_REPORTED`] to a `#[handler(...)]` attribute
/// among `attrs` (written below `#[idempotent]`, so expanded after it): the return type
/// `#[idempotent]` rejected is not reported a second time by `#[handler]`.
fn mark_return_reported(attrs: &mut [Attribute]) {
    for a in attrs {
        let is_handler = a
            .path()
            .segments
            .last()
            .is_some_and(|s| s.ident == "handler");
        let syn::Meta::List(list) = &mut a.meta else {
            continue;
        };
        if is_handler {
            let tokens = &list.tokens;
            let flag = Ident::new(attr::RETURN_REPORTED, Span::call_site());
            list.tokens = quote!(#tokens, #flag);
        }
    }
}

/// Whether `attrs` hold an `#[idempotent(...)]` attribute (written below `#[handler]`, so
/// expanded after it).
fn has_idempotent(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path()
            .segments
            .last()
            .is_some_and(|s| s.ident == "idempotent")
    })
}

/// The URN of a `#[handler("urn:...")]` attribute among `attrs`.
fn handler_urn(attrs: &[Attribute]) -> Option<syn::LitStr> {
    attrs.iter().find_map(|a| {
        let last = a.path().segments.last()?;
        if last.ident != "handler" {
            return None;
        }
        let syn::Meta::List(list) = &a.meta else {
            return None;
        };
        attr::parse_handler(list.tokens.clone()).0.urn
    })
}

/// `f` with `namespace = "<urn>"` added to an `#[idempotent(...)]` attribute below
/// `#[handler("<urn>")]` that has a custom `key`, no `namespace`, and no envelope parameter
/// to read the URN from: the handler's URN is the namespace, as the `job` of every
/// envelope the router gives the fn.
fn namespace_idempotent(f: &mut ItemFn, urn: &syn::LitStr) {
    if validate::has_named_envelope(&f.sig) {
        return;
    }
    for a in &mut f.attrs {
        let is_idempotent = a
            .path()
            .segments
            .last()
            .is_some_and(|s| s.ident == "idempotent");
        let syn::Meta::List(list) = &mut a.meta else {
            continue;
        };
        if !is_idempotent {
            continue;
        }
        let (parsed, _) = attr::parse_idempotent(list.tokens.clone());
        if parsed.key.is_some() && parsed.namespace.is_none() {
            let tokens = &list.tokens;
            let mut urn = urn.clone();
            urn.set_span(Span::call_site());
            list.tokens = quote!(#tokens, namespace = #urn);
        }
    }
}

fn with_errors(errors: Errors, item: TokenStream) -> TokenStream {
    match errors.into_result() {
        Ok(()) => item,
        Err(e) => {
            let e = e.to_compile_error();
            quote!(#e #item)
        }
    }
}

fn with_errors_fn(e: syn::Error, f: &ItemFn) -> TokenStream {
    let e = e.to_compile_error();
    quote!(#e #f)
}

/// The first and last token spans of `tokens`: rustc renders an expression from its first
/// token's start to its last token's end, so generated tokens carrying these two spans
/// make an error underline exactly the user's tokens.
fn first_last(tokens: &impl ToTokens) -> (Span, Span) {
    let mut iter = tokens.to_token_stream().into_iter();
    let first = iter.next().map_or_else(Span::call_site, |t| t.span());
    let last = iter.last().map_or(first, |t| t.span());
    (first, last)
}

/// `tokens` with every span set to `span`'s location (groups included), keeping
/// mixed-site hygiene: the generated tokens are placed at the user's tokens for
/// diagnostics, but their names still cannot meet the user's.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    let hygienic = span.resolved_at(Span::mixed_site());
    // Tokens forming one expression or pattern share one syntax context (rustc cannot
    // join spans of two contexts): with a generated local among them, all are mixed-site.
    let span = if has_local(&tokens) { hygienic } else { span };
    tokens
        .into_iter()
        .map(|mut tt| {
            match &tt {
                proc_macro2::TokenTree::Group(g) => {
                    let mut inner = Group::new(g.delimiter(), respan(g.stream(), span));
                    inner.set_span(span);
                    tt = proc_macro2::TokenTree::Group(inner);
                }
                // A generated local: moved to the user's tokens, still mixed-site.
                proc_macro2::TokenTree::Ident(i) if i.to_string().starts_with(LOCAL_PREFIX) => {
                    tt.set_span(hygienic);
                }
                _ => tt.set_span(span),
            }
            tt
        })
        .collect()
}

/// `tokens` spanned from `first` to `last`: every token at `first` but the last one, at
/// `last`, so the expression they form covers exactly the user's tokens (an error about
/// a part of it is then at the same place as one about the whole, and rustc reports it
/// once).
fn respan_range(tokens: TokenStream, first: Span, last: Span) -> TokenStream {
    let last = if has_local(&tokens) {
        last.resolved_at(Span::mixed_site())
    } else {
        last
    };
    let mut tts: Vec<proc_macro2::TokenTree> = respan(tokens, first).into_iter().collect();
    if let Some(tt) = tts.last_mut() {
        match tt {
            proc_macro2::TokenTree::Group(g) => g.set_span(last),
            proc_macro2::TokenTree::Ident(i) if i.to_string().starts_with(LOCAL_PREFIX) => {
                i.set_span(last.resolved_at(Span::mixed_site()));
            }
            other => other.set_span(last),
        }
    }
    tts.into_iter().collect()
}

/// Whether `tokens` mention a generated local.
fn has_local(tokens: &TokenStream) -> bool {
    tokens.clone().into_iter().any(|tt| match tt {
        proc_macro2::TokenTree::Ident(i) => i.to_string().starts_with(LOCAL_PREFIX),
        proc_macro2::TokenTree::Group(g) => has_local(&g.stream()),
        _ => false,
    })
}

/// The prefix of every local the expansion declares (always with a mixed-site span).
const LOCAL_PREFIX: &str = "__babelqueue_";

/// `<Ret as RoutableReturn>::` with the user's own tokens for `Ret`, so an error about
/// the return type underlines all of it.
fn routable(ret_ty: &TokenStream, private: &TokenStream, first: Span, last: Span) -> TokenStream {
    let open = quote_spanned!(first=> <);
    let rest = respan(quote!(as #private::RoutableReturn>::), last);
    quote!(#open #ret_ty #rest)
}

/// `path(args)` spanning from `path`'s first token to `last`.
fn spanned_call(path: TokenStream, args: TokenStream, last: Span) -> TokenStream {
    let mut group = Group::new(Delimiter::Parenthesis, args);
    group.set_span(last);
    quote!(#path #group)
}

/// `&expr` whose span is exactly the user's `expr`: rustc underlines all of it, from
/// the `&` (spanned at its first token) to its last token. Parentheses are added only
/// where precedence needs them (`&(a + b)`); they carry the last token's span.
fn borrow_spanned(expr: &Expr) -> TokenStream {
    let (first, last) = first_last(expr);
    let amp = quote_spanned!(first=> &);
    if binds_tighter_than_borrow(expr) {
        return quote!(#amp #expr);
    }
    let mut group = Group::new(Delimiter::Parenthesis, expr.to_token_stream());
    group.set_span(last);
    quote!(#amp #group)
}

/// Whether `&expr` borrows all of `expr` without parentheses.
fn binds_tighter_than_borrow(expr: &Expr) -> bool {
    matches!(
        expr,
        Expr::Path(_)
            | Expr::Field(_)
            | Expr::Call(_)
            | Expr::MethodCall(_)
            | Expr::Index(_)
            | Expr::Paren(_)
            | Expr::Macro(_)
            | Expr::Lit(_)
            | Expr::Reference(_)
            | Expr::Unary(_)
            | Expr::Block(_)
            | Expr::Tuple(_)
            | Expr::Array(_)
            | Expr::Struct(_)
    )
}

fn duration(d: &attr::DurationArg) -> TokenStream {
    let ms = u64::try_from(d.value.as_millis()).unwrap_or(u64::MAX);
    quote_spanned!(d.lit.span()=> ::core::time::Duration::from_millis(#ms))
}

/// Splits a fn's attributes into outer (`#[...]`) and inner (`#![...]`, written at the top
/// of the body) ones.
fn split_attrs(attrs: Vec<Attribute>) -> (Vec<Attribute>, Vec<Attribute>) {
    attrs
        .into_iter()
        .partition(|a| matches!(a.style, AttrStyle::Outer))
}

/// `if false { let r: R = loop {}; return r; }` at the declared return type (nothing
/// for `()`), spanned at the return type.
fn fake_return(ret: &Return, output: &ReturnType) -> TokenStream {
    let (Return::Typed(ty), ReturnType::Type(_, _)) = (ret, output) else {
        return TokenStream::new();
    };
    let (first, last) = first_last(ty);
    let local = Ident::new("__babelqueue_fake_return", Span::mixed_site());
    let colon = quote_spanned!(first=> :);
    let tail = quote_spanned!(last=> = loop {};);
    quote! {
        #[allow(
            unreachable_code,
            clippy::diverging_sub_expression,
            clippy::empty_loop,
            clippy::let_unit_value,
            clippy::needless_return,
            clippy::unreachable
        )]
        if false {
            let #local #colon #ty #tail
            return #local;
        }
    }
}

fn guarded_fn(
    args: &IdempotentArgs,
    store: &Expr,
    shape: &validate::IdempotentShape,
    f: ItemFn,
) -> TokenStream {
    let rt = krate::runtime(args.krate.as_ref());
    let private = quote!(#rt::__private);
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = f;
    let (outer, inner) = split_attrs(attrs);

    let key_source = match (&args.key, &shape.env) {
        (Some(key), _) => borrow_spanned(key),
        (None, Some(env)) => {
            let ident = &env.ident;
            let (first, _) = first_last(&env.ident);
            match env.by {
                EnvRef::Owned => quote_spanned!(first=> &#ident),
                EnvRef::Shared | EnvRef::Mut => quote_spanned!(first=> &*#ident),
                EnvRef::Smart => {
                    let path = respan(quote!(#private::EnvelopeParam::envelope), first);
                    quote_spanned!(first=> #path(&#ident))
                }
            }
        }
        // Unreachable: validation requires a key or an envelope parameter.
        (None, None) => quote!(&::core::option::Option::None::<&str>),
    };
    // Spanned at `key = ...` (or the envelope parameter), so a key that is not a
    // `DedupeKey` is reported there.
    let (key_first, key_last) = match (&args.key, &shape.env) {
        (Some(key), _) => first_last(key),
        (None, Some(env)) => first_last(&env.ident),
        (None, None) => (Span::call_site(), Span::call_site()),
    };
    let mut key_args = Group::new(Delimiter::Parenthesis, key_source);
    key_args.set_span(key_last);
    // `guard_ext`'s guards (fingerprint, transactional) take an owned `String`; the others
    // a `GuardKey`, inline up to 62 bytes (no heap allocation for a UUID `meta.id`).
    let by_return_type = args.fingerprint.is_some() || args.transactional.is_some();
    let (key_fn, scoped_fn) = if by_return_type {
        (quote!(owned_key), quote!(scoped_key))
    } else {
        (quote!(guard_key), quote!(scoped_guard_key))
    };
    let key_path = respan_range(quote!(#private::KeySource::#key_fn), key_first, key_last);
    let key_call = quote!(#key_path #key_args);
    // The `meta.id` of an `env: &Envelope` parameter is keyed on through (a copy of) the
    // reference, as a hand-written `Guard::new(&STORE).run_async(env, ...)` does: the body cannot
    // move or change the envelope behind it, so the key need not be copied out first.
    let key_call = match (&args.key, &shape.env) {
        (None, Some(env)) if env.by == EnvRef::Shared && !by_return_type => {
            let ident = &env.ident;
            quote_spanned!(key_first=> #ident)
        }
        _ => key_call,
    };
    // A custom key is stored as `<namespace>#<key>`: by default the handler's URN (the
    // envelope's `job`), or the checked literal of `namespace = "..."`; `namespace = none`
    // keeps it bare. `meta.id` stays bare.
    let key_call = match (&args.key, &args.namespace, &shape.env) {
        (Some(_), Some((attr::NamespaceArg::Explicit(lit), _)), _) => {
            quote!(#private::#scoped_fn(#lit, #key_call))
        }
        (Some(_), Some((attr::NamespaceArg::None, _)), _) | (None, _, _) => key_call,
        (Some(_), None, Some(env)) => {
            let ident = &env.ident;
            quote!(#private::#scoped_fn(&#ident.job, #key_call))
        }
        // Unreachable: validation requires an envelope for a namespaced key.
        (Some(_), None, None) => key_call,
    };
    // `fingerprint`: the digest of the envelope's `data`, computed (like the key) before
    // the body takes the parameters.
    let fp_ident = Ident::new("__babelqueue_fingerprint", Span::mixed_site());
    let fp_let = match (&args.fingerprint, &shape.env) {
        (Some(fp), Some(env)) => {
            let ident = &env.ident;
            let env_ref = match env.by {
                EnvRef::Owned => quote!(&#ident),
                EnvRef::Shared | EnvRef::Mut => quote!(&*#ident),
                EnvRef::Smart => quote!(#private::EnvelopeParam::envelope(&#ident)),
            };
            let path = respan(quote!(#private::Fingerprint::of_envelope), *fp);
            quote!(let #fp_ident = #path(#env_ref);)
        }
        _ => TokenStream::new(),
    };

    let store_ref = borrow_spanned(store);
    let ttl = match &args.ttl {
        Some(d) => {
            let d = duration(d);
            quote!(::core::option::Option::Some(#d))
        }
        None => quote!(::core::option::Option::None),
    };
    let ret_ty = shape.ret.ty();
    let ret_annotation = match &shape.ret {
        Return::Unit => TokenStream::new(),
        Return::Typed(t) => quote!(-> #t),
    };
    let is_async = sig.asyncness.is_some();
    // Generated locals are mixed-site: no user identifier can meet them.
    let key_ident = Ident::new("__babelqueue_key", Span::mixed_site());
    let (trait_name, lease) = match (is_async, &args.lease) {
        (false, None) => (quote!(SyncGuard), None),
        (true, None) => (quote!(AsyncGuard), None),
        (false, Some(l)) => (quote!(SyncLeaseGuard), Some(duration(l))),
        (true, Some(l)) => (quote!(AsyncLeaseGuard), Some(duration(l))),
    };
    // `fingerprint` and `transactional` use the guards of `guard_ext`, generic over the
    // return type itself; validation rules out their combinations with `lease`.
    let fingerprint = args.fingerprint.is_some();
    let tx = args.transactional.as_ref().map(|(ident, _)| ident);
    let (trait_name, method) = match (is_async, fingerprint, tx.is_some()) {
        (_, false, false) => (trait_name, quote!(guard)),
        (false, true, false) => (quote!(SyncFingerprintGuard), quote!(guard)),
        (true, true, false) => (quote!(AsyncFingerprintGuard), quote!(guard)),
        (false, false, true) => (quote!(SyncTxGuard), quote!(guard)),
        (true, false, true) => (quote!(AsyncTxGuard), quote!(guard)),
        (false, true, true) => (quote!(SyncTxGuard), quote!(guard_fingerprint)),
        (true, true, true) => (quote!(AsyncTxGuard), quote!(guard_fingerprint)),
    };
    let fp_arg = fingerprint.then(|| quote!(#fp_ident,));
    // The body runs in a closure, so `return` and `?` keep their meaning. For an async fn
    // it is an async closure called at once: unlike an `async move` block, it captures
    // precisely (field by field), so `store = self.store` and a body mutating another
    // field of `&mut self` do not conflict.
    //
    // An async closure's `-> R` annotation does not make its body's `return`s coerce
    // (`Box<io::Error>` to `Box<dyn Error>`, `&String` to `&str`), so, as
    // tracing-attributes does, the body starts with a "fake return" at the declared type:
    // the first `return` an async body's type is inferred from is typed `R`, and every
    // later `return` and the tail coerce to it. The fake return is spanned at the return
    // type, so a type error it causes points there.
    let body_arg = if is_async {
        let fake = fake_return(&shape.ret, &sig.output);
        let stmts = &block.stmts;
        let mut inner_block = Group::new(Delimiter::Brace, quote!(#fake #(#stmts)*));
        inner_block.set_span(block.brace_token.span.join());
        match tx {
            // The body receives the store's transaction under the user's name.
            Some(tx) => quote!(async |#tx| #ret_annotation #inner_block),
            None => quote!((async || #inner_block)()),
        }
    } else {
        match tx {
            Some(tx) => quote!(|#tx| #ret_annotation #block),
            None => quote!(|| #ret_annotation #block),
        }
    };
    // Every generated token of the call is spanned at the user's store expression, so
    // whatever part of the call rustc blames (the receiver, the call, the `.await`), the
    // error lands on `store = ...`, once (rustc drops implied errors at one span).
    let (first, last) = first_last(store);
    let lease_arg = lease.as_ref().map(|l| quote!(#l,));
    // Lease mode: an error type that cannot hold `InFlight` is reported at the return
    // type, once, not at the store.
    // - sync fn: a `PhantomData` of the handler's error type, spanned at the return type
    //   (a bound on the guard method's `E`, inferred from this argument alone);
    // - async fn: the conversion itself, `|| in_flight_error` with the fn spanned at the
    //   return type (the async guard's `impl Future` would repeat a bound of its method,
    //   checked at the call, so its method has none on the error type; a closure
    //   returning the fn as a fn pointer, not the fn item, whose `FnOnce` impl would
    //   carry the fn's bound to the call, nor `|e| in_flight_error(e)`, which clippy's
    //   `redundant_closure` would flag in the user's crate).
    let error_arg = match (&lease, &sig.output) {
        (Some(_), ReturnType::Type(_, t)) => {
            let (rf, rl) = first_last(t);
            if is_async {
                let bars = quote_spanned!(rf=> ||);
                let convert = respan_range(quote!(#private::in_flight_error), rf, rl);
                quote!(, #bars #convert)
            } else {
                let phantom = respan_range(quote!(::core::marker::PhantomData), rf, rl);
                quote!(, #phantom)
            }
        }
        // The seen-set guards: the store's error is turned into the handler's error by a
        // closure `|| store_error_into` spanned at the return type (`store_error_unit` for
        // `()`), so a store error that does not convert is reported there, once: the
        // bound is checked in the closure's body, where the fn item becomes the fn
        // pointer the guard's method takes; the method itself only requires the store
        // trait. Without a return type, at the store.
        (None, output) if !by_return_type => {
            let (rf, rl, convert) = match (output, &shape.ret) {
                (ReturnType::Type(_, t), Return::Unit) => {
                    let (rf, rl) = first_last(t);
                    (rf, rl, quote!(store_error_unit))
                }
                (ReturnType::Type(_, t), Return::Typed(_)) => {
                    let (rf, rl) = first_last(t);
                    (rf, rl, quote!(store_error_into))
                }
                (ReturnType::Default, _) => (first, last, quote!(store_error_unit)),
            };
            let bars = quote_spanned!(rf=> ||);
            let convert = respan_range(quote!(#private::#convert), rf, rl);
            quote!(, #bars #convert)
        }
        _ => TokenStream::new(),
    };
    let args_group = Group::new(
        Delimiter::Parenthesis,
        quote!(#store_ref, #key_ident, #lease_arg #fp_arg #ttl, #body_arg #error_arg),
    );
    let mut args_group = args_group;
    args_group.set_span(last);
    // The guard is generic over the return *kind*, named as a projection spanned at the
    // user's return type: an unsupported return type (e.g. an alias of `u32`) is
    // reported there, once, not at the store.
    let (check_trait, kind_name) = (quote!(IdempotentReturn), quote!(Kind));
    let kind = match &sig.output {
        // `guard_ext`'s guards take the return type itself.
        _ if by_return_type => ret_ty.clone(),
        ReturnType::Type(_, t) => {
            let (rf, rl) = first_last(t);
            let open = quote_spanned!(rf=> <);
            let rest = respan(quote!(as #private::#check_trait>::#kind_name), rl);
            quote!(#open #ret_ty #rest)
        }
        ReturnType::Default => quote!(#private::UnitKind),
    };
    let path = respan_range(quote!(#private::#trait_name::<), first, last);
    let path_end = respan_range(quote!(>::#method), last, last);
    let path = quote!(#path #kind #path_end);
    let call = quote!(#path #args_group);
    let call = if is_async {
        // Awaited through `guard_future`, all spanned at the store: the guard's future is
        // held by value, pinned in place (no box), in a type that names it only through
        // a never-called closure `|| never(())`, so the `.await` does not check the
        // guard's bounds again: a store that does not fit is reported once, at all of
        // `store = ...` (an `.await` on the guard's future itself, or `pin!`, would
        // repeat the error at the `await`, or at a desugared span). Being part of the
        // awaited expression, `store = ...`'s temporaries (e.g. `&*STORE`) live until the
        // guard's future completes.
        let wrap = respan_range(quote!(#private::guard_future), first, last);
        // The closure's body `never(())`, a call of a generic fn, is itself typed with the
        // guard's future: its path, too, runs from `first` to `last`.
        let bars = respan(quote!(||), first);
        let never = respan_range(quote!(#private::never), first, last);
        let mut unit = Group::new(Delimiter::Parenthesis, quote_spanned!(last=> ()));
        unit.set_span(last);
        let names = quote!(#bars #never #unit);
        let mut wrap_args = Group::new(Delimiter::Parenthesis, quote!(#call, #names));
        wrap_args.set_span(last);
        let await_ = quote_spanned!(last=> .await);
        quote!(#wrap #wrap_args #await_)
    } else {
        call
    };
    // A `()` body ends with a statement, sync or async, so lints such as clippy's
    // `semicolon_if_nothing_returned` stay quiet on the expansion.
    let call = match &shape.ret {
        Return::Unit => {
            let semi = quote_spanned!(last=> ;);
            quote!(#call #semi)
        }
        _ => call,
    };
    let body = quote! {
        #(#inner)*
        let #key_ident = #key_call;
        #fp_let
        #call
    };
    let mut body = Group::new(Delimiter::Brace, body);
    body.set_span(block.brace_token.span.join());
    quote! {
        #(#outer)*
        #vis #sig #body
    }
}

/// `#[handler("urn:...")]`: the fn as written, plus a type of the same name (in the type
/// namespace, like Rocket's routes) implementing `TypedHandler`.
pub fn handler(args: TokenStream, item: TokenStream) -> TokenStream {
    let (args, mut errors) = attr::parse_handler(args);
    let f = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            if let Ok(block) = syn::parse2::<syn::ItemImpl>(item.clone()) {
                return handler_impl(args, errors, block);
            }
            errors.push(validate::not_a_fn("handler", &item));
            return with_errors(errors, item);
        }
    };
    let shape = validate::handler(&f, &mut errors);
    if let Err(e) = errors.into_result() {
        return with_errors_fn(e, &f);
    }
    let (Some(shape), Some(urn)) = (shape, &args.urn) else {
        // Unreachable: both are errors above.
        return f.into_token_stream();
    };
    let mut f = f;
    namespace_idempotent(&mut f, urn);
    let rt = krate::runtime(args.krate.as_ref());
    let private = quote!(#rt::__private);
    let callee = f.sig.ident.to_token_stream();
    let return_reported = return_reported(&args, &f);
    let items = handler_type(&f, &shape, urn, &private, &callee, return_reported);
    quote! {
        #f
        #items
    }
}

/// `#[handler] impl Payments { #[handler("urn:...")] fn charge(...) ... }`: the impl as
/// written (without the inner attributes), plus, beside it, a handler type per marked
/// associated fn, named like the fn and calling `<Payments>::charge`.
fn handler_impl(
    args: attr::HandlerArgs,
    mut errors: Errors,
    mut block: syn::ItemImpl,
) -> TokenStream {
    // On the impl, the attribute takes no URN: the URNs are on the fns.
    if let Some(urn) = &args.urn {
        errors.error(
            urn.span(),
            "on an `impl` block, #[handler] takes no URN: write `#[handler]` on the impl and \
             `#[handler(\"urn:...\")]` on each handler fn inside it",
        );
    } else if errors.0.is_some() {
        // "needs the URN": not an error on an impl.
        errors = Errors::default();
    }
    if !block.generics.params.is_empty() {
        errors.push(syn::Error::new_spanned(
            &block.generics,
            "#[handler] cannot go on a generic `impl`: the router calls one concrete fn; \
             write the handlers in an impl of a concrete type",
        ));
    }
    let self_ty = &block.self_ty;
    let callee_base = match &block.trait_ {
        Some((_, path, _)) => quote!(<#self_ty as #path>),
        None => quote!(<#self_ty>),
    };
    let mut items = Vec::new();
    let mut found = false;
    for item in &mut block.items {
        let syn::ImplItem::Fn(func) = item else {
            continue;
        };
        let Some(pos) = func.attrs.iter().position(|a| {
            a.path()
                .segments
                .last()
                .is_some_and(|s| s.ident == "handler")
        }) else {
            continue;
        };
        found = true;
        let attr = func.attrs.remove(pos);
        let tokens = match &attr.meta {
            syn::Meta::List(list) => list.tokens.clone(),
            _ => TokenStream::new(),
        };
        let (fn_args, mut fn_errors) = attr::parse_handler(tokens);
        let f = ItemFn {
            attrs: func.attrs.clone(),
            vis: func.vis.clone(),
            sig: func.sig.clone(),
            block: Box::new(func.block.clone()),
        };
        let shape = validate::handler(&f, &mut fn_errors);
        if let Err(e) = fn_errors.into_result() {
            errors.push(e);
            continue;
        }
        let (Some(shape), Some(urn)) = (shape, &fn_args.urn) else {
            continue;
        };
        let krate = fn_args.krate.as_ref().or(args.krate.as_ref());
        let rt = krate::runtime(krate);
        let private = quote!(#rt::__private);
        let name = &f.sig.ident;
        let callee = quote!(#callee_base::#name);
        let return_reported = return_reported(&fn_args, &f);
        items.push(handler_type(
            &f,
            &shape,
            urn,
            &private,
            &callee,
            return_reported,
        ));
    }
    if !found && errors.0.is_none() {
        errors.error(
            block.impl_token.span,
            "#[handler] on an `impl` registers its associated fns marked \
             `#[handler(\"urn:...\")]`, but none is marked",
        );
    }
    let errors = match errors.into_result() {
        Ok(()) => TokenStream::new(),
        Err(e) => e.to_compile_error(),
    };
    quote! {
        #errors
        #block
        #(#items)*
    }
}

/// Whether `#[idempotent]`, stacked with `#[handler]` on `f`, reports `f`'s return type
/// (expanded before it and said so, or still to expand): `#[handler]` then leaves it
/// alone, so the mistake gets one error.
fn return_reported(args: &attr::HandlerArgs, f: &ItemFn) -> bool {
    args.return_reported
        || (has_idempotent(&f.attrs) && validate::idempotent_rejects_return(&f.sig.output))
}

/// The handler type named like the fn `f`, calling it through `callee`. With
/// `return_reported` (a return type `#[idempotent]` reports), its `call_with` does not
/// name the return type.
fn handler_type(
    f: &ItemFn,
    shape: &validate::HandlerShape,
    urn: &syn::LitStr,
    private: &TokenStream,
    callee: &TokenStream,
    return_reported: bool,
) -> TokenStream {
    let vis = &f.vis;
    let sig = &f.sig;
    let name = &sig.ident;
    let cfgs: Vec<_> = f
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("cfg"))
        .collect();
    let deprecated: Vec<_> = f
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("deprecated"))
        .collect();
    let struct_doc = format!(
        "The handler `{name}` for a router: `#[handler({:?})]` added this type beside the \
         fn, so `router.register({name} {{}})` runs the fn `{name}` for each message with \
         that URN.",
        urn.value()
    );

    let envelope = Ident::new("__babelqueue_envelope", Span::mixed_site());
    let state = Ident::new("__babelqueue_state", Span::mixed_site());
    let error = Ident::new("__babelqueue_error", Span::mixed_site());
    let owned_needs_clone = shape
        .args
        .iter()
        .filter(|a| matches!(a, HandlerArg::Envelope(_)))
        .count()
        > 1;
    let mut lets = Vec::new();
    let mut checks = Vec::new();
    let fn_name = name.unraw().to_string();
    let mut call_args = Vec::new();
    let mut needs_mut = false;
    for (i, arg) in shape.args.iter().enumerate() {
        match arg {
            HandlerArg::Envelope(EnvRef::Shared) => call_args.push(quote!(&#envelope)),
            HandlerArg::Envelope(EnvRef::Mut) => {
                needs_mut = true;
                call_args.push(quote!(&mut #envelope));
            }
            HandlerArg::Envelope(EnvRef::Owned) if owned_needs_clone => {
                call_args.push(quote!(::core::clone::Clone::clone(&#envelope)));
            }
            HandlerArg::Envelope(EnvRef::Owned) => call_args.push(quote!(#envelope)),
            // `Arc<Envelope>`, `Box<Envelope>`, or a type alias: built with `From`.
            HandlerArg::Envelope(EnvRef::Smart) if owned_needs_clone => call_args
                .push(quote!(::core::convert::From::from(::core::clone::Clone::clone(&#envelope)))),
            HandlerArg::Envelope(EnvRef::Smart) => {
                call_args.push(quote!(::core::convert::From::from(#envelope)));
            }
            HandlerArg::Extract(ty) => {
                let local = Ident::new(&format!("__babelqueue_arg{i}"), Span::mixed_site());
                // Spanned at the argument's type: a type the router cannot build is
                // reported there, once.
                let (first, last) = first_last(ty);
                let path = respan(quote!(#private::extract::<), first);
                let close = respan(quote!(>), last);
                let mut args_group = Group::new(Delimiter::Parenthesis, quote!(&#envelope, #state));
                args_group.set_span(last);
                lets.push(quote! {
                    let #local = match #path #ty #close #args_group {
                        ::core::result::Result::Ok(v) => v,
                        ::core::result::Result::Err(#error) => return #private::rejected(#error),
                    };
                });
                // Autoref dispatch, no bound: a type that is not an argument is
                // reported once, by the extraction above.
                checks.push(quote! {
                    (&#private::StateProbe::<#ty>::new()).probe_state(#state, #fn_name, #urn)?;
                });
                call_args.push(quote!(#local));
            }
        }
    }
    if checks.is_empty() {
        checks.push(quote!(let _ = #state;));
    }
    if return_reported {
        lets.clear();
    }
    let binding = if needs_mut && !return_reported {
        quote!(mut #envelope)
    } else {
        quote!(#envelope)
    };
    let ret_ty = shape.ret.ty();
    let (ret_first, ret_last) = match &sig.output {
        ReturnType::Type(_, t) => first_last(t),
        ReturnType::Default => first_last(name),
    };
    let (name_first, name_last) = first_last(name);
    // The call of the fn, spanned at its name: a future that is not `Send` is reported
    // at the fn, naming it.
    let mut call_group = Group::new(Delimiter::Parenthesis, quote!(#(#call_args),*));
    call_group.set_span(name_last);
    let call = quote!(#callee #call_group);
    let routable_path = routable(&ret_ty, private, ret_first, ret_last);
    let route = if return_reported {
        // Never built into a program: `#[idempotent]` reports the return type.
        quote! {
            let _ = (&#envelope, #state, #callee);
            #private::return_rejected()
        }
    } else if sig.asyncness.is_some() {
        let method = quote_spanned!(ret_last=> route_async);
        let body = respan(quote!(async move), name_first);
        let mut block = Group::new(Delimiter::Brace, quote!(#call.await));
        block.set_span(name_last);
        spanned_call(
            quote!(#routable_path #method),
            quote!(#body #block),
            ret_last,
        )
    } else {
        let method = quote_spanned!(ret_last=> route_sync);
        let closure = respan(quote!(move ||), name_first);
        spanned_call(
            quote!(#routable_path #method),
            quote!(#closure #call),
            ret_last,
        )
    };
    // The type lives under a name of its own, and `charge` is an alias of it: if the
    // name `charge` is taken in the type namespace (a `mod charge`), only the alias
    // conflicts, so the user gets one error, at the fn's name.
    let hidden = Ident::new(
        &format!("{LOCAL_PREFIX}handler_{}", name.unraw()),
        name.span(),
    );
    let alias = respan(quote!(#vis type), name_first);
    let semi = quote_spanned!(name_last=> ;);
    quote! {
        // `dead_code` allowed: a fn called directly and not (yet) registered leaves the
        // type unused, which is no mistake of the user's.
        #[doc = #struct_doc]
        #(#cfgs)*
        #(#deprecated)*
        #[allow(non_camel_case_types, dead_code)]
        #alias #name = #hidden #semi

        #[doc(hidden)]
        #(#cfgs)*
        #[allow(non_camel_case_types, dead_code)]
        #[derive(Debug, Clone, Copy, Default)]
        #vis struct #hidden {}

        // No `#[diagnostic::do_not_recommend]` here: rustc cannot resolve a `diagnostic`
        // attribute in a module with `#![no_implicit_prelude]`.
        #(#cfgs)*
        #[allow(deprecated)]
        impl #private::TypedHandler for #hidden {
            fn serves(&self) -> &str {
                #urn
            }
            fn call_with(
                &self,
                #binding: #private::Envelope,
                #state: &#private::StateMap,
            ) -> #private::BoxFuture<'static, #private::HandlerOutput> {
                #(#lets)*
                #route
            }
            #[allow(clippy::needless_borrow)]
            fn check_state_with(
                &self,
                #state: &#private::StateMap,
            ) -> ::core::result::Result<(), #private::MissingState> {
                #[allow(unused_imports)]
                use #private::{ProbeNoState as _, ProbeState as _};
                #(#checks)*
                ::core::result::Result::Ok(())
            }
        }
    }
}
