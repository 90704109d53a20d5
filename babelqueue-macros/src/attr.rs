//! Parsing the attributes' arguments. Every value keeps its span so an error can point at
//! it; every mistake is collected (not just the first).

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use syn::parse::{ParseStream, Parser};
use syn::{Expr, Ident, LitStr, Path, Token};

use crate::duration;

mod kw {
    syn::custom_keyword!(store);
    syn::custom_keyword!(key);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(namespace);
    syn::custom_keyword!(none);
    syn::custom_keyword!(fingerprint);
    syn::custom_keyword!(transactional);
}

/// The arguments `#[idempotent]` accepts, in the order the docs list them.
const IDEMPOTENT_ARGS: &str =
    "`store`, `key`, `namespace`, `ttl`, `lease`, `fingerprint`, `transactional`, `crate`";

/// A duration literal parsed at compile time.
pub struct DurationArg {
    pub value: Duration,
    pub lit: LitStr,
}

/// The parsed `#[idempotent(...)]` arguments.
#[derive(Default)]
pub struct IdempotentArgs {
    pub store: Option<Expr>,
    pub key: Option<Expr>,
    pub ttl: Option<DurationArg>,
    pub lease: Option<DurationArg>,
    pub krate: Option<Path>,
    /// `namespace = "..."` or `namespace = none`, with the span of `namespace`.
    pub namespace: Option<(NamespaceArg, Span)>,
    /// The span of the `fingerprint` flag.
    pub fingerprint: Option<Span>,
    /// `transactional = tx`: the binding the body receives, with the span of
    /// `transactional`.
    pub transactional: Option<(Ident, Span)>,
}

/// What `namespace = ...` says.
pub enum NamespaceArg {
    /// `namespace = "billing"`: checked non-empty, without `#`.
    Explicit(LitStr),
    /// `namespace = none`: the key is stored bare.
    None,
}

/// Collects errors: `syn::Error::combine` so the user sees every mistake at once.
#[derive(Default)]
pub struct Errors(pub Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    pub fn error(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }

    pub fn into_result(self) -> Result<(), syn::Error> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Parses `#[idempotent(...)]`. Returns what could be parsed and every error found.
pub fn parse_idempotent(args: TokenStream) -> (IdempotentArgs, Errors) {
    let mut out = IdempotentArgs::default();
    let mut errors = Errors::default();
    let parser = |input: ParseStream| {
        parse_idempotent_stream(input, &mut out, &mut errors);
        Ok(())
    };
    if let Err(e) = parser.parse2(args) {
        errors.push(e);
    }
    if out.store.is_none() && !errors.has_missing_store_hint() {
        errors.error(
            Span::call_site(),
            "#[idempotent] needs the seen-set store to use: write `#[idempotent(store = STORE)]`, \
             where `STORE` is an expression such as a `static` `InMemoryStore`",
        );
    }
    (out, errors)
}

impl Errors {
    /// Whether an error already told the user to write `store = ...` (a bare store
    /// expression, or a misspelt `store`), so "missing store" would only repeat it.
    fn has_missing_store_hint(&self) -> bool {
        self.0.as_ref().is_some_and(|e| {
            e.into_iter().any(|e| {
                let msg = e.to_string();
                msg.contains("write `store = ") || msg.contains("did you mean `store`?")
            })
        })
    }
}

fn parse_idempotent_stream(input: ParseStream, out: &mut IdempotentArgs, errors: &mut Errors) {
    let mut first = true;
    while !input.is_empty() {
        if !first {
            if let Err(e) = input.parse::<Token![,]>() {
                errors.push(syn::Error::new(
                    e.span(),
                    "expected `,` between #[idempotent] arguments",
                ));
                skip_to_comma(input);
                continue;
            }
            if input.is_empty() {
                break;
            }
        }
        first = false;
        if let Err(e) = parse_one(input, out) {
            errors.push(e);
            skip_to_comma(input);
        }
    }
}

/// Parses one `name = value` argument.
fn parse_one(input: ParseStream, out: &mut IdempotentArgs) -> syn::Result<()> {
    let lookahead = input.lookahead1();
    if lookahead.peek(kw::store) {
        let name = input.parse::<kw::store>()?;
        let value = parse_eq_expr(input, "store", name.span, "store = STORE")?;
        set_once(&mut out.store, value, "store", name.span)
    } else if lookahead.peek(kw::key) {
        let name = input.parse::<kw::key>()?;
        let value = parse_eq_expr(input, "key", name.span, "key = env.data[\"payment_id\"]")?;
        set_once(&mut out.key, value, "key", name.span)
    } else if lookahead.peek(kw::ttl) {
        let name = input.parse::<kw::ttl>()?;
        let value = parse_duration(input, "ttl", name.span, "24h")?;
        set_once(&mut out.ttl, value, "ttl", name.span)
    } else if lookahead.peek(kw::lease) {
        let name = input.parse::<kw::lease>()?;
        let value = parse_duration(input, "lease", name.span, "30s")?;
        set_once(&mut out.lease, value, "lease", name.span)
    } else if lookahead.peek(kw::namespace) {
        let name = input.parse::<kw::namespace>()?;
        let value = parse_namespace(input, name.span)?;
        set_once(
            &mut out.namespace,
            (value, name.span),
            "namespace",
            name.span,
        )
    } else if lookahead.peek(kw::fingerprint) {
        let name = input.parse::<kw::fingerprint>()?;
        if input.peek(Token![=]) {
            return Err(syn::Error::new(
                name.span,
                "`fingerprint` is a flag and takes no value: write `fingerprint` on its own \
                 (leave it out for plain dedupe)",
            ));
        }
        if out.fingerprint.is_some() {
            return Err(syn::Error::new(
                name.span,
                "`fingerprint` is given more than once in #[idempotent]; keep one",
            ));
        }
        out.fingerprint = Some(name.span);
        Ok(())
    } else if lookahead.peek(kw::transactional) {
        let name = input.parse::<kw::transactional>()?;
        expect_eq(input, "transactional", name.span, "transactional = tx")?;
        if input.is_empty() || input.peek(Token![,]) {
            return Err(syn::Error::new(
                name.span,
                "`transactional =` needs the name the body gives the transaction: write \
                 `transactional = tx`",
            ));
        }
        let value: Expr = input.parse()?;
        let ident = match &value {
            Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => p.path.get_ident(),
            _ => None,
        };
        let Some(ident) = ident else {
            return Err(syn::Error::new_spanned(
                &value,
                format!(
                    "`transactional` takes a name, not an expression: the body receives the \
                     store's transaction under that name; write `transactional = tx` (not `{}`)",
                    tokens_text(&value)
                ),
            ));
        };
        set_once(
            &mut out.transactional,
            (ident.clone(), name.span),
            "transactional",
            name.span,
        )
    } else if lookahead.peek(Token![crate]) {
        let name = input.parse::<Token![crate]>()?;
        expect_eq(input, "crate", name.span, "crate = ::babelqueue")?;
        let path = Path::parse_mod_style(input).map_err(|e| {
            syn::Error::new(
                e.span(),
                "`crate` takes the path of the babelqueue runtime crate, e.g. \
                 `crate = ::babelqueue` or `crate = my_crate::babelqueue`",
            )
        })?;
        set_once(&mut out.krate, path, "crate", name.span)
    } else if input.peek(Ident) && input.peek2(Token![=]) {
        let name = input.call(<Ident as syn::ext::IdentExt>::parse_any)?;
        Err(unknown_argument(&name))
    } else if input.peek(Ident) || input.peek(Token![&]) || input.peek(Token![*]) {
        // A bare expression: most likely the store without `store =`.
        let expr: Expr = input.parse()?;
        let text = tokens_text(&expr);
        Err(syn::Error::new_spanned(
            &expr,
            format!(
                "#[idempotent] arguments are named: write `store = {text}` \
                 (expected one of: {IDEMPOTENT_ARGS})"
            ),
        ))
    } else {
        let mut err = lookahead.error();
        err.combine(syn::Error::new(
            input.span(),
            format!("expected one of: {IDEMPOTENT_ARGS}, e.g. `#[idempotent(store = STORE)]`"),
        ));
        Err(first_only(err))
    }
}

/// The first error of a combined error (lookahead's "expected ..." is replaced by ours).
fn first_only(err: syn::Error) -> syn::Error {
    err.into_iter()
        .last()
        .unwrap_or_else(|| syn::Error::new(Span::call_site(), "invalid argument"))
}

fn unknown_argument(name: &Ident) -> syn::Error {
    let text = name.to_string();
    let hint = match suggest(&text) {
        Some(s) => format!(" (did you mean `{s}`?)"),
        None => String::new(),
    };
    syn::Error::new(
        name.span(),
        format!(
            "unknown #[idempotent] argument `{text}`; expected one of: {IDEMPOTENT_ARGS}{hint}"
        ),
    )
}

/// A likely intended argument for a misspelt or synonym name.
fn suggest(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    let synonyms: &[(&str, &[&str])] = &[
        (
            "store",
            &["storage", "seen", "seen_set", "backend", "db", "cache"],
        ),
        (
            "key",
            &["id", "dedupe_key", "dedup_key", "idempotency_key", "by"],
        ),
        (
            "ttl",
            &[
                "expire",
                "expiry",
                "expires",
                "expiration",
                "retention",
                "duration",
            ],
        ),
        (
            "lease",
            &["lock", "claim", "in_flight", "inflight", "timeout"],
        ),
        ("crate", &["krate", "runtime", "path"]),
        ("namespace", &["prefix", "key_prefix", "scope", "ns"]),
        (
            "fingerprint",
            &[
                "validate",
                "payload_validation",
                "digest",
                "hash",
                "checksum",
            ],
        ),
        ("transactional", &["transaction", "tx", "txn", "atomic"]),
    ];
    for (arg, names) in synonyms {
        if names.contains(&lower.as_str()) {
            return Some(arg);
        }
    }
    [
        "store",
        "key",
        "namespace",
        "ttl",
        "lease",
        "fingerprint",
        "transactional",
        "crate",
    ]
    .into_iter()
    .find(|arg| edit_distance(&lower, arg) <= 2 && lower.len() > 1)
}

/// Levenshtein distance (the arguments are a few bytes long).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn set_once<T>(slot: &mut Option<T>, value: T, name: &str, span: Span) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            span,
            format!("`{name}` is set more than once in #[idempotent]; keep one `{name} = ...`"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn expect_eq(input: ParseStream, name: &str, span: Span, example: &str) -> syn::Result<()> {
    if input.peek(Token![=]) {
        input.parse::<Token![=]>()?;
        return Ok(());
    }
    let at = if input.is_empty() { span } else { input.span() };
    Err(syn::Error::new(
        at,
        format!("expected `=` after `{name}`: write `{example}`"),
    ))
}

fn parse_eq_expr(input: ParseStream, name: &str, span: Span, example: &str) -> syn::Result<Expr> {
    expect_eq(input, name, span, example)?;
    if input.is_empty() || input.peek(Token![,]) {
        return Err(syn::Error::new(
            span,
            format!("`{name} =` needs a value: write `{example}`"),
        ));
    }
    input.parse()
}

/// `namespace = "literal"` (non-empty, no `#`) or `namespace = none`.
fn parse_namespace(input: ParseStream, span: Span) -> syn::Result<NamespaceArg> {
    expect_eq(input, "namespace", span, "namespace = \"billing\"")?;
    if input.peek(kw::none) {
        input.parse::<kw::none>()?;
        return Ok(NamespaceArg::None);
    }
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        let text = lit.value();
        let why = if text.is_empty() {
            "it is empty"
        } else if text.contains('#') {
            "it contains `#`, which separates the namespace from the key in the stored key"
        } else {
            return Ok(NamespaceArg::Explicit(lit));
        };
        return Err(syn::Error::new(
            lit.span(),
            format!(
                "invalid namespace {}: {why}; write a non-empty name without `#`, e.g. \
                 `namespace = \"billing\"`, or `namespace = none` for a bare key",
                tokens_text(&lit)
            ),
        ));
    }
    if input.is_empty() || input.peek(Token![,]) {
        return Err(syn::Error::new(
            span,
            "`namespace =` needs a value: write `namespace = \"billing\"` or `namespace = none`",
        ));
    }
    let value: Expr = input.parse()?;
    Err(syn::Error::new_spanned(
        &value,
        format!(
            "`namespace` takes a string literal, checked at compile time, or `none`: write \
             `namespace = \"billing\"` (not `{}`), or `namespace = none` for a bare key",
            tokens_text(&value)
        ),
    ))
}

fn parse_duration(
    input: ParseStream,
    name: &str,
    span: Span,
    example: &str,
) -> syn::Result<DurationArg> {
    expect_eq(input, name, span, &format!("{name} = \"{example}\""))?;
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        return match duration::parse(&lit.value()) {
            Ok(value) => Ok(DurationArg { value, lit }),
            Err(why) => Err(syn::Error::new(
                lit.span(),
                format!(
                    "malformed duration {} for `{name}`: {why}; write a number and a unit, \
                     e.g. `{name} = \"{example}\"` or `\"1h30m\"` (units: {})",
                    tokens_text(&lit),
                    duration::UNITS
                ),
            )),
        };
    }
    if input.is_empty() || input.peek(Token![,]) {
        return Err(syn::Error::new(
            span,
            format!("`{name} =` needs a duration: write `{name} = \"{example}\"`"),
        ));
    }
    let value: Expr = input.parse()?;
    let hint = match &value {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(_) | syn::Lit::Float(_),
            ..
        }) => "a bare number has no unit; ",
        _ => "",
    };
    Err(syn::Error::new_spanned(
        &value,
        format!(
            "`{name}` takes a duration string literal, parsed at compile time: {hint}write \
             `{name} = \"{example}\"` (units: {})",
            duration::UNITS
        ),
    ))
}

fn skip_to_comma(input: ParseStream) {
    let _ = input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tt, next)) = rest.token_tree() {
            if let proc_macro2::TokenTree::Punct(p) = &tt
                && p.as_char() == ','
            {
                return Ok(((), rest));
            }
            rest = next;
        }
        Ok(((), rest))
    });
}

/// The source text of some tokens, for quoting them in a message.
pub fn tokens_text(tokens: &impl quote::ToTokens) -> String {
    let ts = tokens.to_token_stream();
    // `to_string` spaces every token apart; close the gaps users never write.
    let s = ts.to_string();
    s.replace(" . ", ".")
        .replace(" :: ", "::")
        .replace(":: ", "::")
        .replace("& ", "&")
        .replace("* ", "*")
        .replace(" (", "(")
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(" [", "[")
        .replace(" ]", "]")
        .replace(" ,", ",")
        .replace(" !", "!")
}

/// The parsed `#[handler("urn:...")]` arguments.
pub struct HandlerArgs {
    pub urn: Option<LitStr>,
    pub krate: Option<Path>,
    /// Set by `#[idempotent]` written above `#[handler]` when it rejected the fn's return
    /// type (see [`RETURN_REPORTED`]).
    pub return_reported: bool,
}

/// A hidden `#[handler]` argument that `#[idempotent]`, written above it, adds when it
/// has rejected the fn's return type: `#[handler]` then does not check the return type a
/// second time, so the mistake gets one error, `#[idempotent]`'s.
pub const RETURN_REPORTED: &str = "__babelqueue_return_reported";

const URN_EXAMPLE: &str = "#[handler(\"urn:babel:payments:charge\")]";

/// Parses `#[handler("urn:...", crate = path)]`.
pub fn parse_handler(args: TokenStream) -> (HandlerArgs, Errors) {
    let mut out = HandlerArgs {
        urn: None,
        krate: None,
        return_reported: false,
    };
    let mut errors = Errors::default();
    let parser = |input: ParseStream| {
        parse_handler_stream(input, &mut out, &mut errors);
        Ok(())
    };
    if let Err(e) = parser.parse2(args) {
        errors.push(e);
    }
    (out, errors)
}

fn parse_handler_stream(input: ParseStream, out: &mut HandlerArgs, errors: &mut Errors) {
    if input.is_empty() {
        errors.error(
            Span::call_site(),
            format!("#[handler] needs the URN this handler serves: write `{URN_EXAMPLE}`"),
        );
        return;
    }
    let mut first = true;
    while !input.is_empty() {
        if !first {
            if let Err(e) = input.parse::<Token![,]>() {
                errors.error(e.span(), "expected `,` between #[handler] arguments");
                skip_to_comma(input);
                continue;
            }
            if input.is_empty() {
                break;
            }
        }
        first = false;
        if let Err(e) = parse_handler_one(input, out) {
            errors.push(e);
            skip_to_comma(input);
        }
    }
    if out.urn.is_none() && errors.0.is_none() {
        errors.error(
            Span::call_site(),
            format!("#[handler] needs the URN this handler serves: write `{URN_EXAMPLE}`"),
        );
    }
}

fn parse_handler_one(input: ParseStream, out: &mut HandlerArgs) -> syn::Result<()> {
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        if out.urn.is_some() {
            return Err(syn::Error::new(
                lit.span(),
                "#[handler] serves one URN; register a second handler for another URN",
            ));
        }
        validate_urn(&lit)?;
        out.urn = Some(lit);
        return Ok(());
    }
    if input.peek(Token![crate]) {
        let name = input.parse::<Token![crate]>()?;
        expect_eq(input, "crate", name.span, "crate = ::babelqueue")?;
        let path = Path::parse_mod_style(input)?;
        if out.krate.is_some() {
            return Err(syn::Error::new(
                name.span,
                "`crate` is set more than once in #[handler]; keep one `crate = ...`",
            ));
        }
        out.krate = Some(path);
        return Ok(());
    }
    if input.peek(Ident) && !input.peek2(Token![=]) {
        let fork = input.fork();
        if fork.parse::<Ident>().is_ok_and(|i| i == RETURN_REPORTED) {
            input.parse::<Ident>()?;
            out.return_reported = true;
            return Ok(());
        }
    }
    if input.peek(Ident) && input.peek2(Token![=]) {
        let name = input.call(<Ident as syn::ext::IdentExt>::parse_any)?;
        if name == "urn" {
            return Err(syn::Error::new(
                name.span(),
                format!("the URN is written on its own, without `urn =`: `{URN_EXAMPLE}`"),
            ));
        }
        return Err(syn::Error::new(
            name.span(),
            format!(
                "unknown #[handler] argument `{name}`; #[handler] takes the URN and optionally \
                 `crate = path`: `{URN_EXAMPLE}`"
            ),
        ));
    }
    let tt: TokenStream = input.parse::<proc_macro2::TokenTree>()?.into();
    Err(syn::Error::new_spanned(
        &tt,
        format!("#[handler] takes the URN as a string literal: write `{URN_EXAMPLE}`"),
    ))
}

/// The URN rules of the envelope (`job`): non-empty, no whitespace, a `urn:` URN.
fn validate_urn(lit: &LitStr) -> syn::Result<()> {
    let urn = lit.value();
    let why = if urn.is_empty() {
        "the URN is empty".to_owned()
    } else if let Some(c) = urn.chars().find(|c| c.is_whitespace() || c.is_control()) {
        format!(
            "the URN contains {}",
            if c == ' ' {
                "a space".to_owned()
            } else {
                format!("the whitespace or control character {c:?}")
            }
        )
    } else if !urn.starts_with("urn:") {
        format!(
            "{} is not a URN: a URN starts with `urn:`",
            tokens_text(lit)
        )
    } else if urn.len() == "urn:".len() || urn[4..].split(':').any(str::is_empty) {
        format!("{} has an empty part between `:`", tokens_text(lit))
    } else {
        return Ok(());
    };
    Err(syn::Error::new(
        lit.span(),
        format!(
            "{why}; a handler serves a message URN such as `\"urn:babel:payments:charge\"` \
             (the envelope's `job`, never a type name)"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn errors_of(args: TokenStream) -> Vec<String> {
        let (_, errors) = parse_idempotent(args);
        match errors.into_result() {
            Ok(()) => vec![],
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn full_argument_list_parses() {
        let (args, errors) = parse_idempotent(quote!(
            store = &*STORE,
            key = env.data["id"],
            ttl = "1h30m",
            lease = "30s",
            crate = ::babelqueue_core
        ));
        assert!(errors.into_result().is_ok());
        assert_eq!(args.ttl.map(|d| d.value), Some(Duration::from_secs(5400)));
        assert_eq!(args.lease.map(|d| d.value), Some(Duration::from_secs(30)));
        assert!(args.store.is_some() && args.key.is_some() && args.krate.is_some());
    }

    #[test]
    fn namespace_fingerprint_transactional_parse() {
        let (args, errors) = parse_idempotent(quote!(
            store = S,
            key = k,
            namespace = "billing",
            fingerprint,
            transactional = tx
        ));
        assert!(errors.into_result().is_ok());
        assert!(matches!(
            args.namespace,
            Some((NamespaceArg::Explicit(ref l), _)) if l.value() == "billing"
        ));
        assert!(args.fingerprint.is_some());
        assert_eq!(
            args.transactional.map(|(i, _)| i.to_string()).as_deref(),
            Some("tx")
        );
        let (args, errors) = parse_idempotent(quote!(store = S, key = k, namespace = none));
        assert!(errors.into_result().is_ok());
        assert!(matches!(args.namespace, Some((NamespaceArg::None, _))));
    }

    #[test]
    fn namespace_fingerprint_transactional_mistakes() {
        let errs = errors_of(quote!(
            store = S,
            namespace = "",
            fingerprint = true,
            transactional = a.b,
            namespace = "a#b"
        ));
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(errs[0].contains("it is empty"));
        assert!(errs[1].contains("is a flag"));
        assert!(errs[2].contains("takes a name"));
        assert!(errs[3].contains("contains `#`"));
        assert_eq!(suggest("prefix"), Some("namespace"));
        assert_eq!(suggest("transaction"), Some("transactional"));
    }

    #[test]
    fn every_mistake_is_reported() {
        let errs = errors_of(quote!(store = A, store = B, tll = "1h", ttl = "soon"));
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].contains("`store` is set more than once"));
        assert!(errs[1].contains("did you mean `ttl`?"));
        assert!(errs[2].contains("malformed duration"));
    }

    #[test]
    fn missing_store_and_bare_store() {
        assert!(errors_of(quote!(ttl = "1h"))[0].contains("needs the seen-set store"));
        let errs = errors_of(quote!(STORE));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("write `store = STORE`"));
    }

    #[test]
    fn urns() {
        let ok: LitStr = syn::parse_quote!("urn:babel:payments:charge");
        assert!(validate_urn(&ok).is_ok());
        for bad in ["", "urn:babel: x", "orders.created", "urn:", "urn:a::b"] {
            let lit = LitStr::new(bad, Span::call_site());
            assert!(validate_urn(&lit).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("stor"), Some("store"));
        assert_eq!(suggest("expires"), Some("ttl"));
        assert_eq!(suggest("zzzzzz"), None);
    }
}
