//! Code generation. The user's fn keeps its attributes, visibility and signature exactly as
//! written; only the body changes. On any error the user's fn is emitted unchanged next
//! to the errors, so one mistake does not cascade into errors at every call site.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::{AttrStyle, Attribute, Expr, ItemFn};

use crate::attr::{self, Errors, IdempotentArgs};
use crate::krate;
use crate::validate::{self, EnvRef, Return};

/// The prefix of the fn `#[handler]` renames the user's fn to.
pub const HANDLER_FN_PREFIX: &str = "__babelqueue_handler_";

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
    let shape = validate::idempotent(&f, &args, &mut errors);
    if let Err(e) = errors.into_result() {
        return with_errors_fn(e, &f);
    }
    let Some(store) = &args.store else {
        // Unreachable: a missing store is an error above.
        return f.into_token_stream();
    };
    guarded_fn(&args, store, &shape, f)
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

/// `tokens` with every span set to `span` (groups included).
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut inner = Group::new(g.delimiter(), respan(g.stream(), span));
                inner.set_span(span);
                tt = proc_macro2::TokenTree::Group(inner);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

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
    let key_path = respan(quote!(#private::KeySource::owned_key), key_first);
    let key_call = quote!(#key_path #key_args);

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
    let (trait_name, lease) = match (is_async, &args.lease) {
        (false, None) => (quote!(SyncGuard), None),
        (true, None) => (quote!(AsyncGuard), None),
        (false, Some(l)) => (quote!(SyncLeaseGuard), Some(duration(l))),
        (true, Some(l)) => (quote!(AsyncLeaseGuard), Some(duration(l))),
    };
    // The body runs in a closure, so `return` and `?` keep their meaning. For an async fn
    // it is an async closure called at once: unlike an `async move` block, it captures
    // precisely (field by field), so `store = self.store` and a body mutating another
    // field of `&mut self` do not conflict.
    let body_arg = if is_async {
        quote!((async || #ret_annotation #block)())
    } else {
        quote!(|| #ret_annotation #block)
    };
    // Every generated token of the call is spanned at the user's store expression, so
    // whatever part of the call rustc blames (the receiver, the call, the `.await`), the
    // error lands on `store = ...`, once (rustc drops implied errors at one span).
    let (first, last) = first_last(store);
    let lease_arg = lease.map(|l| quote!(#l,));
    let args_group = Group::new(
        Delimiter::Parenthesis,
        quote!(#store_ref, __babelqueue_key, #lease_arg #ttl, #body_arg),
    );
    let mut args_group = args_group;
    args_group.set_span(last);
    let path = respan(quote!(#private::#trait_name::<#ret_ty>::guard), first);
    let call = quote!(#path #args_group);
    let call = if is_async {
        // Awaited through `poll_fn`, all spanned at the store: the guard's future is
        // boxed and polled in a closure whose obligations carry the store's span, so a
        // store that does not fit is reported once. (An `.await` on the guard's future,
        // or `pin!`, would repeat the error at a desugared span rustc does not merge with
        // the first.) The box keeps the future's `Send`-ness: it is not a `dyn`.
        // A `match` keeps the temporaries of `store = ...` (e.g. `&*STORE`) alive until the
        // guard's future completes.
        let mut pinned = Group::new(Delimiter::Parenthesis, call);
        pinned.set_span(last);
        let pin = respan(quote!(::std::boxed::Box::pin), first);
        let poll = respan(
            quote! {
                ::core::future::poll_fn(move |__babelqueue_cx| {
                    ::core::future::Future::poll(
                        ::core::pin::Pin::as_mut(&mut __babelqueue_guard),
                        __babelqueue_cx,
                    )
                })
            },
            first,
        );
        let await_ = quote_spanned!(last=> .await);
        let arm = respan(quote!(mut __babelqueue_guard =>), first);
        // The `match` itself keeps the macro's span: it is glue, and lints about a
        // `match` in tail position must not point at `store = ...`.
        let arms = Group::new(Delimiter::Brace, quote!(#arm #poll #await_));
        quote!(match #pin #pinned #arms)
    } else {
        call
    };
    // A `()` sync body ends with a statement, so lints such as
    // `semicolon_if_nothing_returned` stay quiet on the expansion (the async one ends
    // with a `match`, which needs none).
    let call = match &shape.ret {
        Return::Unit if !is_async => {
            let semi = quote_spanned!(last=> ;);
            quote!(#call #semi)
        }
        _ => call,
    };
    let body = quote! {
        #(#inner)*
        let __babelqueue_key = #key_call;
        #call
    };
    let mut body = Group::new(Delimiter::Brace, body);
    body.set_span(block.brace_token.span.join());
    quote! {
        #(#outer)*
        #vis #sig #body
    }
}

/// `#[handler("urn:...")]`.
pub fn handler(args: TokenStream, item: TokenStream) -> TokenStream {
    let (args, mut errors) = attr::parse_handler(args);
    let f = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(f) => f,
        Err(_) => {
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
    let rt = krate::runtime(args.krate.as_ref());
    let private = quote!(#rt::__private);

    let ItemFn {
        attrs,
        vis,
        mut sig,
        block,
    } = f;
    let name = sig.ident.clone();
    let inner_name = format_ident!("{}{}", HANDLER_FN_PREFIX, name, span = name.span());
    sig.ident = inner_name.clone();

    let mut docs = Vec::new();
    let mut cfgs = Vec::new();
    let mut fn_attrs = Vec::new();
    for a in attrs {
        if a.path().is_ident("doc") {
            docs.push(a);
        } else {
            if a.path().is_ident("cfg") {
                cfgs.push(a.clone());
            }
            fn_attrs.push(a);
        }
    }

    // A braced struct lives only in the type namespace, so the const of the same name is
    // what `charge` means as a value (a unit struct would be a constructor, and lints
    // would take `charge(&env);` for a no-op).
    let struct_doc = format!(
        "The type of the handler `{name}` (declared with `#[handler({:?})]`): calling it \
         runs the fn, and a `Router` registers it under its URN.",
        urn.value()
    );
    let env_ty = &shape.env_ty;
    let ret_ty = shape.ret.ty();
    let is_async = sig.asyncness.is_some();
    let env_arg = match shape.env {
        EnvRef::Owned => quote!(envelope),
        EnvRef::Shared => quote!(&envelope),
        EnvRef::Mut => quote!(&mut envelope),
    };
    let binding = match shape.env {
        EnvRef::Mut => quote!(mut envelope),
        _ => quote!(envelope),
    };
    let lifetime = match shape.env {
        EnvRef::Owned => quote!('static),
        EnvRef::Shared | EnvRef::Mut => quote!('_),
    };
    // The router's call is spanned at the return type: a return type the router cannot
    // report (an error that is not a `std::error::Error`) is reported there.
    let (ret_first, ret_last) = match &sig.output {
        syn::ReturnType::Type(_, t) => first_last(t),
        syn::ReturnType::Default => first_last(&name),
    };

    let (target, deref_body, call_body) = if is_async {
        let target = quote!(fn(#env_ty) -> #private::BoxFuture<#lifetime, #ret_ty>);
        let deref_body = quote! {
            fn __babelqueue_boxed(envelope: #env_ty) -> #private::BoxFuture<#lifetime, #ret_ty> {
                #private::boxed(#inner_name(envelope))
            }
            static __BABELQUEUE_HANDLER: #target = __babelqueue_boxed;
            &__BABELQUEUE_HANDLER
        };
        let route = routable(&ret_ty, &private, ret_first, ret_last);
        let method = quote_spanned!(ret_last=> route_async);
        let route = quote!(#route #method);
        let call_body = match shape.env {
            EnvRef::Owned => quote!(#inner_name(envelope)),
            _ => quote!(async move { #inner_name(#env_arg).await }),
        };
        let call_body = spanned_call(route, call_body, ret_last);
        (target, deref_body, call_body)
    } else {
        let target = quote!(fn(#env_ty) -> #ret_ty);
        let deref_body = quote! {
            static __BABELQUEUE_HANDLER: #target = #inner_name;
            &__BABELQUEUE_HANDLER
        };
        let route = routable(&ret_ty, &private, ret_first, ret_last);
        let method = quote_spanned!(ret_last=> route_sync);
        let route = quote!(#route #method);
        let call_body = spanned_call(route, quote!(move || #inner_name(#env_arg)), ret_last);
        (target, deref_body, call_body)
    };

    quote! {
        #(#fn_attrs)*
        #sig #block

        #[doc = #struct_doc]
        #(#cfgs)*
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy)]
        #vis struct #name {
            _handler: (),
        }

        #(#docs)*
        #(#cfgs)*
        #[allow(non_upper_case_globals)]
        #vis const #name: #name = #name { _handler: () };

        #(#cfgs)*
        impl ::core::ops::Deref for #name {
            type Target = #target;
            fn deref(&self) -> &Self::Target {
                #deref_body
            }
        }

        #(#cfgs)*
        impl #private::Handler for #name {
            fn urn(&self) -> &str {
                #urn
            }
            fn call(
                &self,
                #binding: #private::Envelope,
            ) -> #private::BoxFuture<'static, #private::HandlerOutput> {
                #call_body
            }
        }
    }
}
