//! The shape of the annotated fn: what each macro accepts, with errors at the offending
//! tokens. Nothing here generates code.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, Item, ItemFn, Pat, PathArguments, ReturnType, Signature, Type};

use crate::attr::{Errors, IdempotentArgs, tokens_text};

/// How a parameter holds the envelope.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum EnvRef {
    /// `env: Envelope`
    Owned,
    /// `env: &Envelope`
    Shared,
    /// `env: &mut Envelope`
    Mut,
    /// `env: Arc<Envelope>` (or `Box`, `Rc`), or a parameter named `env` / `envelope`
    /// whose type is not spelled `Envelope` (a type alias): built from the envelope with
    /// `From`, read through `macro_support::EnvelopeParam`.
    Smart,
}

/// The envelope parameter of a handler.
pub struct EnvParam {
    /// Its name (`None` for a pattern such as `_`).
    pub ident: Option<Ident>,
    /// Its pattern as written.
    pub pat: TokenStream,
    pub by: EnvRef,
    pub ty: Type,
}

/// What a handler returns.
pub enum Return {
    /// No return type, or `()`.
    Unit,
    /// Anything else that passed the syntactic checks (checked by the type system).
    Typed(Box<Type>),
}

impl Return {
    /// The return type as tokens (`()` for [`Return::Unit`]).
    pub fn ty(&self) -> TokenStream {
        match self {
            Return::Unit => quote::quote!(()),
            Return::Typed(t) => t.to_token_stream(),
        }
    }
}

/// What `#[idempotent]` needs to know about the fn.
pub struct IdempotentShape {
    pub env: Option<EnvParam>,
    pub ret: Return,
}

/// The user's name for the fn.
pub fn display_name(sig: &Signature) -> String {
    sig.ident.to_string()
}

/// Checks the fn under `#[idempotent]`.
pub fn idempotent(f: &ItemFn, args: &IdempotentArgs, errors: &mut Errors) -> IdempotentShape {
    let sig = &f.sig;
    let name = display_name(sig);
    if let Some(c) = &sig.constness {
        errors.error(
            c.span,
            "#[idempotent] cannot go on a `const fn`: the guard calls the store at run time, \
             which a const fn cannot do; remove `const`",
        );
    }
    if let Some(u) = &sig.unsafety {
        errors.error(
            u.span,
            "#[idempotent] cannot go on an `unsafe fn`: a handler is called by the runtime, \
             which cannot uphold an unsafe fn's safety contract; make the fn safe and put the \
             unsafe operation in an `unsafe { ... }` block inside it",
        );
    }
    if sig.abi.is_some() {
        extern_abi("idempotent", sig, errors);
    } else if let Some(v) = &sig.variadic {
        errors.error(v.span(), "#[idempotent] cannot go on a variadic fn");
    }

    let envs = envelope_params(sig);
    let env = if args.key.is_some() {
        envs.into_iter().next()
    } else {
        match envs.len() {
            0 => {
                errors.error(
                    sig.paren_token.span.join(),
                    format!(
                        "#[idempotent] keys on the message's `meta.id`, but `{name}` has no \
                         `Envelope` parameter; add one (`env: &Envelope`), or say what to key \
                         on with `key = ...`"
                    ),
                );
                None
            }
            1 => envs.into_iter().next(),
            _ => {
                errors.push(syn::Error::new_spanned(
                    &envs[1].ty,
                    format!(
                        "`{name}` has more than one `Envelope` parameter, so #[idempotent] \
                         cannot tell which message to key on; keep one, or choose the key with \
                         `key = ...` (e.g. `key = {}`)",
                        envs[0]
                            .ident
                            .as_ref()
                            .map_or_else(|| "env".to_owned(), Ident::to_string)
                    ),
                ));
                None
            }
        }
    };
    if args.key.is_none()
        && let Some(EnvParam {
            ident: None, pat, ..
        }) = &env
    {
        errors.push(syn::Error::new_spanned(
            pat,
            "#[idempotent] reads this envelope's `meta.id`, so the parameter needs a name: \
             write `env: &Envelope` (or choose the key with `key = ...`)",
        ));
    }

    needs_envelope(&name, args, env.as_ref(), errors);
    combinations(args, errors);

    let ret = return_type(&sig.output, errors);
    if let (Some(fp), Return::Unit) = (&args.fingerprint, &ret) {
        errors.error(
            *fp,
            "`fingerprint` needs a handler returning `Result<(), E>` with \
             `E: From<babelqueue::PayloadMismatch>`: a delivery whose payload differs from the \
             first delivery of its key is refused with that error; change the return type",
        );
    }
    if let (Some(lease), Return::Unit) = (&args.lease, &ret) {
        errors.error(
            lease.lit.span(),
            "`lease = ...` needs a handler returning `Result<(), E>` with \
             `E: From<babelqueue::InFlight>`: an id claimed by another worker is returned as an \
             error so the message is retried later; change the return type",
        );
    }
    IdempotentShape { env, ret }
}

/// A namespaced `key = ...` (the default) and `fingerprint` read the envelope: its `job`
/// (the handler's URN) and its `data`.
fn needs_envelope(name: &str, args: &IdempotentArgs, env: Option<&EnvParam>, errors: &mut Errors) {
    let named = env.is_some_and(|e| e.ident.is_some());
    if named {
        return;
    }
    if let (Some(key), None) = (&args.key, &args.namespace) {
        let msg = match env {
            None => format!(
                "a custom `key` is namespaced by the handler's URN (the envelope's `job`), but \
                 `{name}` has no `Envelope` parameter; add one (`env: &Envelope`), put \
                 `#[handler(\"urn:...\")]` on the fn (its URN is then the namespace), or name \
                 the namespace: `namespace = \"{name}\"` (or `namespace = none` for a bare key \
                 shared with other handlers and SDKs)"
            ),
            Some(_) => "a custom `key` is namespaced by the handler's URN (the envelope's \
                        `job`), so the envelope parameter needs a name: write `env: &Envelope`, \
                        or name the namespace (`namespace = \"...\"` or `namespace = none`)"
                .to_owned(),
        };
        errors.push(syn::Error::new_spanned(key, msg));
    }
    // Without `key`, a missing or unnamed envelope is already an error of its own.
    if let (Some(fp), Some(_)) = (&args.fingerprint, &args.key) {
        let msg = match env {
            None => format!(
                "`fingerprint` digests the message's `data`, but `{name}` has no `Envelope` \
                 parameter; add one (`env: &Envelope`)"
            ),
            Some(_) => "`fingerprint` digests this envelope's `data`, so the parameter needs a \
                        name: write `env: &Envelope`"
                .to_owned(),
        };
        errors.error(*fp, msg);
    }
}

/// Arguments that do not go together.
fn combinations(args: &IdempotentArgs, errors: &mut Errors) {
    if let (Some((_, span)), None) = (&args.namespace, &args.key) {
        errors.error(
            *span,
            "`namespace` scopes a custom `key = ...`, but there is none: the default key, \
             `meta.id`, is never namespaced (every handler and SDK of the fleet shares it); \
             remove `namespace`, or add `key = ...`",
        );
    }
    if let (Some(fp), Some(_)) = (&args.fingerprint, &args.lease) {
        errors.error(
            *fp,
            "`fingerprint` cannot be combined with `lease = ...` (lease mode does not store \
             fingerprints yet); keep one of them",
        );
    }
    if let (Some((_, span)), Some(_)) = (&args.transactional, &args.lease) {
        errors.error(
            *span,
            "`transactional` cannot be combined with `lease = ...`: the transaction already \
             serializes concurrent deliveries of one id on its row; remove `lease`",
        );
    }
}

/// Every parameter whose type is `Envelope`, `&Envelope`, `&mut Envelope` or
/// `Arc<Envelope>` (any path ending in `Envelope`); when there is none, the parameter
/// named `env` or `envelope` (its type, e.g. an alias of `Envelope`, is checked by the
/// compiler).
fn envelope_params(sig: &Signature) -> Vec<EnvParam> {
    let spelled = envelope_params_by(sig, |pt| envelope_ref(&pt.ty));
    if !spelled.is_empty() {
        return spelled;
    }
    envelope_params_by(sig, envelope_by_name)
}

/// Whether the fn has an envelope parameter with a name (which `#[idempotent]` can read
/// the `job` from).
pub fn has_named_envelope(sig: &Signature) -> bool {
    envelope_params(sig).iter().any(|e| e.ident.is_some())
}

/// A parameter named `env` or `envelope` whose type is not an extractor (`Json<T>`, ...),
/// as an envelope parameter.
pub fn envelope_by_name(pt: &syn::PatType) -> Option<EnvRef> {
    let Pat::Ident(p) = &*pt.pat else {
        return None;
    };
    let name = p.ident.unraw().to_string();
    if !matches!(name.as_str(), "env" | "envelope") || p.subpat.is_some() {
        return None;
    }
    match peel(&pt.ty) {
        Type::Reference(r) if r.mutability.is_some() => Some(EnvRef::Mut),
        Type::Reference(_) => Some(EnvRef::Shared),
        Type::Path(tp) if tp.qself.is_none() => {
            let last = tp.path.segments.last()?;
            let extractor = matches!(
                last.ident.to_string().as_str(),
                "Json" | "State" | "Attempts" | "Meta" | "String" | "Value" | "Option"
            );
            (!extractor).then_some(EnvRef::Smart)
        }
        _ => None,
    }
}

fn envelope_params_by(
    sig: &Signature,
    by: impl Fn(&syn::PatType) -> Option<EnvRef>,
) -> Vec<EnvParam> {
    sig.inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(pt) => {
                let by = by(pt)?;
                let ident = match &*pt.pat {
                    Pat::Ident(p) if p.subpat.is_none() => Some(p.ident.clone()),
                    _ => None,
                };
                Some(EnvParam {
                    ident,
                    pat: pt.pat.to_token_stream(),
                    by,
                    ty: (*pt.ty).clone(),
                })
            }
            FnArg::Receiver(_) => None,
        })
        .collect()
}

/// Whether `ty` is the envelope, and how it is held.
pub fn envelope_ref(ty: &Type) -> Option<EnvRef> {
    match ty {
        Type::Group(g) => envelope_ref(&g.elem),
        Type::Paren(p) => envelope_ref(&p.elem),
        Type::Reference(r) => match (is_envelope_path(&r.elem), r.mutability.is_some()) {
            (true, false) => Some(EnvRef::Shared),
            (true, true) => Some(EnvRef::Mut),
            (false, _) => None,
        },
        _ if is_envelope_path(ty) => Some(EnvRef::Owned),
        Type::Path(p) if p.qself.is_none() => {
            // `Arc<Envelope>`, `Box<Envelope>`, `Rc<Envelope>` (any path ending in them).
            let last = p.path.segments.last()?;
            let smart = matches!(last.ident.to_string().as_str(), "Arc" | "Box" | "Rc");
            let PathArguments::AngleBracketed(args) = &last.arguments else {
                return None;
            };
            match (smart, args.args.first(), args.args.len()) {
                (true, Some(syn::GenericArgument::Type(inner)), 1) if is_envelope_path(inner) => {
                    Some(EnvRef::Smart)
                }
                _ => None,
            }
        }
        _ => None,
    }
}

fn is_envelope_path(ty: &Type) -> bool {
    match ty {
        Type::Group(g) => is_envelope_path(&g.elem),
        Type::Paren(p) => is_envelope_path(&p.elem),
        Type::Path(p) if p.qself.is_none() => {
            p.path.segments.last().is_some_and(|s| {
                s.ident == "Envelope" && matches!(s.arguments, PathArguments::None)
            })
        }
        _ => false,
    }
}

/// Checks the return type: `()` or `Result<(), E>` where that can be told from the tokens.
/// Whether `#[idempotent]` rejects this return type by its syntax (e.g. `-> bool`), an
/// error it reports itself: `#[handler]`, stacked with it, then leaves the return type
/// alone, so the mistake gets one error.
pub fn idempotent_rejects_return(output: &ReturnType) -> bool {
    let mut errors = Errors::default();
    return_type(output, &mut errors);
    errors.0.is_some()
}

fn return_type(output: &ReturnType, errors: &mut Errors) -> Return {
    let ty = match output {
        ReturnType::Default => return Return::Unit,
        ReturnType::Type(_, ty) => &**ty,
    };
    let ty = peel(ty);
    if let Type::Tuple(t) = ty
        && t.elems.is_empty()
    {
        return Return::Unit;
    }
    let unsupported = |errors: &mut Errors, what: &Type| {
        errors.push(syn::Error::new_spanned(
            what,
            format!(
                "#[idempotent] handlers return `()` or `Result<(), E>`: a skipped duplicate does \
                 not run the body, so it has no `{}` to return; return `Result<(), E>` and keep \
                 a value you need in your own storage",
                tokens_text(what)
            ),
        ));
    };
    match ty {
        Type::ImplTrait(_) => {
            errors.push(syn::Error::new_spanned(
                ty,
                "#[idempotent] cannot guard a fn returning `impl Trait`; write the handler as an \
                 `async fn` returning `()` or `Result<(), E>`",
            ));
        }
        Type::Path(p) if p.qself.is_none() => {
            let Some(last) = p.path.segments.last() else {
                return Return::Typed(Box::new(ty.clone()));
            };
            let name = last.ident.to_string();
            if name == "Result" {
                if let PathArguments::AngleBracketed(args) = &last.arguments
                    && let Some(syn::GenericArgument::Type(ok)) = args.args.first()
                    && !is_unit(ok)
                {
                    let suggestion = match args.args.iter().nth(1) {
                        Some(err) => format!("Result<(), {}>", tokens_text(err)),
                        None => {
                            let path: Vec<String> = p
                                .path
                                .segments
                                .iter()
                                .map(|s| s.ident.to_string())
                                .collect();
                            format!("{}<()>", path.join("::"))
                        }
                    };
                    errors.push(syn::Error::new_spanned(
                        ok,
                        format!(
                            "#[idempotent] handlers return `Result<(), E>` or `()`: a skipped \
                             duplicate does not run the body, so it has no `{}` to return; write \
                             `{suggestion}` and keep a result you need in your own storage",
                            tokens_text(ok)
                        ),
                    ));
                }
            } else if matches!(
                name.as_str(),
                "Option"
                    | "bool"
                    | "char"
                    | "str"
                    | "String"
                    | "Vec"
                    | "Box"
                    | "u8"
                    | "u16"
                    | "u32"
                    | "u64"
                    | "u128"
                    | "usize"
                    | "i8"
                    | "i16"
                    | "i32"
                    | "i64"
                    | "i128"
                    | "isize"
                    | "f32"
                    | "f64"
            ) {
                unsupported(errors, ty);
            }
        }
        Type::Path(_) | Type::Macro(_) | Type::Verbatim(_) => {}
        _ => unsupported(errors, ty),
    }
    Return::Typed(Box::new(ty.clone()))
}

fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => peel(&g.elem),
        Type::Paren(p) => peel(&p.elem),
        _ => ty,
    }
}

fn is_unit(ty: &Type) -> bool {
    matches!(peel(ty), Type::Tuple(t) if t.elems.is_empty())
}

/// One parameter of a `#[handler]` fn, as the router passes it.
pub enum HandlerArg {
    /// The envelope, held as written.
    Envelope(EnvRef),
    /// Any other argument, built with `FromEnvelope` (its type as written).
    Extract(Box<Type>),
}

/// What `#[handler]` needs to know about the fn.
pub struct HandlerShape {
    pub args: Vec<HandlerArg>,
    pub ret: Return,
}

/// The error for an `extern "ABI"` fn, the same for both macros.
pub fn extern_abi(macro_name: &str, sig: &Signature, errors: &mut Errors) {
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new_spanned(
            abi,
            format!(
                "#[{macro_name}] cannot go on an `extern` fn: a handler is called by the runtime \
                 as a Rust fn; remove `{}` (keep a separate `extern` fn that calls it if C \
                 needs one)",
                tokens_text(abi)
            ),
        ));
    }
}

/// Checks the fn under `#[handler]`: not a method, not generic, each parameter the
/// envelope or a type the router can build.
pub fn handler(f: &ItemFn, errors: &mut Errors) -> Option<HandlerShape> {
    let sig = &f.sig;
    let mut ok = true;
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        let at = if sig.generics.params.is_empty() {
            sig.generics.where_clause.to_token_stream()
        } else {
            sig.generics.to_token_stream()
        };
        errors.push(syn::Error::new_spanned(
            at,
            "a #[handler] fn cannot be generic: the router calls one concrete fn; remove the \
             generic parameters (shared values come in as `State<T>` arguments)",
        ));
        ok = false;
    }
    if let Some(u) = &sig.unsafety {
        errors.error(
            u.span,
            "#[handler] cannot go on an `unsafe fn`: the router cannot uphold its safety \
             contract; make the fn safe and use an `unsafe { ... }` block inside it",
        );
        ok = false;
    }
    if sig.abi.is_some() {
        extern_abi("handler", sig, errors);
        ok = false;
    }
    if let Some(v) = &sig.variadic {
        errors.error(v.span(), "#[handler] cannot go on a variadic fn");
        ok = false;
    }
    let mut args = Vec::new();
    let mut owned_envelopes = 0;
    let spelled = sig
        .inputs
        .iter()
        .any(|i| matches!(i, FnArg::Typed(pt) if envelope_ref(&pt.ty).is_some()));
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(recv) => {
                errors.push(syn::Error::new_spanned(
                    recv,
                    "a #[handler] fn cannot take `self`: the router has no value to call it \
                     on; take what you need as a `State<T>` argument (added with \
                     `Router::state`)",
                ));
                ok = false;
            }
            FnArg::Typed(pt) => {
                let by = match envelope_ref(&pt.ty) {
                    Some(by) => Some(by),
                    None if !spelled => envelope_by_name(pt),
                    None => None,
                };
                if let Some(by) = by {
                    if matches!(by, EnvRef::Owned | EnvRef::Smart) {
                        owned_envelopes += 1;
                    }
                    args.push(HandlerArg::Envelope(by));
                    continue;
                }
                match peel(&pt.ty) {
                    Type::Reference(r) => {
                        errors.push(syn::Error::new_spanned(
                            &pt.ty,
                            format!(
                                "a #[handler] argument cannot borrow `{}`: the router builds \
                                 each argument for the call and only the envelope can be \
                                 borrowed (`&Envelope`); take it by value, e.g. `State<{}>` \
                                 for shared state",
                                tokens_text(&r.elem),
                                tokens_text(&r.elem)
                            ),
                        ));
                        ok = false;
                    }
                    Type::ImplTrait(_) => {
                        errors.push(syn::Error::new_spanned(
                            &pt.ty,
                            "a #[handler] argument cannot be `impl Trait`: the router builds \
                             one concrete type per argument; name the type",
                        ));
                        ok = false;
                    }
                    _ => args.push(HandlerArg::Extract(pt.ty.clone())),
                }
            }
        }
    }
    if owned_envelopes > 1 {
        errors.error(
            sig.paren_token.span.join(),
            "a #[handler] fn takes the envelope by value at most once; borrow it for the \
             other parameters (`&Envelope`)",
        );
        ok = false;
    }
    let ret = match &sig.output {
        ReturnType::Default => Return::Unit,
        ReturnType::Type(_, ty) if is_unit(ty) => Return::Unit,
        ReturnType::Type(_, ty) => {
            if let Type::ImplTrait(_) = peel(ty) {
                errors.push(syn::Error::new_spanned(
                    ty,
                    "a #[handler] fn cannot return `impl Trait`; write it as an `async fn` \
                     returning `()` or `Result<(), E>`",
                ));
                ok = false;
            }
            Return::Typed(ty.clone())
        }
    };
    ok.then_some(HandlerShape { args, ret })
}

/// The error for an attribute put on something that is not a fn with a body.
pub fn not_a_fn(macro_name: &str, item: &TokenStream) -> syn::Error {
    let what = match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Struct(s)) => Some(("a struct", s.struct_token.span)),
        Ok(Item::Enum(e)) => Some(("an enum", e.enum_token.span)),
        Ok(Item::Union(u)) => Some(("a union", u.union_token.span)),
        Ok(Item::Impl(i)) => {
            return syn::Error::new(
                i.impl_token.span,
                format!(
                    "#[{macro_name}] goes on a handler fn, not on an `impl` block; put it on \
                     each handler method inside"
                ),
            );
        }
        Ok(Item::Trait(t)) => Some(("a trait", t.trait_token.span)),
        Ok(Item::Mod(m)) => Some(("a module", m.mod_token.span)),
        Ok(Item::Const(c)) => Some(("a const", c.const_token.span)),
        Ok(Item::Static(s)) => Some(("a static", s.static_token.span)),
        Ok(Item::Type(t)) => Some(("a type alias", t.type_token.span)),
        Ok(Item::Use(u)) => Some(("a `use`", u.use_token.span)),
        _ => None,
    };
    if let Some((what, span)) = what {
        return syn::Error::new(
            span,
            format!(
                "#[{macro_name}] goes on a handler fn (one taking an `Envelope`), not on {what}"
            ),
        );
    }
    // A fn without a body (a trait method declaration), or something else.
    let fn_kw = item.clone().into_iter().find_map(|t| match t {
        proc_macro2::TokenTree::Ident(i) if i == "fn" => Some(i.span()),
        _ => None,
    });
    match fn_kw {
        Some(span) => syn::Error::new(
            span,
            format!(
                "#[{macro_name}] needs the fn's body; put it on a fn with a body (in a trait: on \
                 the methods of the impls, or on a default body)"
            ),
        ),
        None => syn::Error::new_spanned(
            item,
            format!("#[{macro_name}] goes on a handler fn (one taking an `Envelope`)"),
        ),
    }
}
