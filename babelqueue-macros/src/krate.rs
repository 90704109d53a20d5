//! Which path names the runtime crate in the generated code.
//!
//! The user may depend on the `babelqueue` facade (possibly renamed) or on
//! `babelqueue-runtime` directly (which re-exports what the guard needs from
//! `babelqueue-core`); `proc-macro-crate` reads their `Cargo.toml` to tell which.
//! `crate = path` overrides the lookup (for crates that re-export babelqueue).

use proc_macro_crate::{FoundCrate, crate_name};
use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{Ident, Path};

/// The facade package.
pub const FACADE: &str = "babelqueue";
/// The runtime package, for users without the facade.
pub const CORE: &str = "babelqueue-runtime";

/// The runtime path: the explicit `crate = path`, else the one found in `Cargo.toml`.
pub fn runtime(explicit: Option<&Path>) -> TokenStream {
    match explicit {
        Some(path) => path.to_token_stream(),
        None => resolve(crate_name(FACADE).ok(), crate_name(CORE).ok()),
    }
}

/// Chooses the path from what `Cargo.toml` declares: the facade first, then the runtime,
/// else `::babelqueue` (a build without Cargo, e.g. with `rustc --extern`).
///
/// `FoundCrate::Itself` means the code being compiled belongs to that package without
/// being an integration test: its doctests and examples, which see the package's library
/// under its own name. (Neither library uses the macros itself.)
pub fn resolve(facade: Option<FoundCrate>, core: Option<FoundCrate>) -> TokenStream {
    let name = match (facade, core) {
        (Some(FoundCrate::Name(name)), _) => name,
        (Some(FoundCrate::Itself), _) => FACADE.to_owned(),
        (None, Some(FoundCrate::Name(name))) => name,
        (None, Some(FoundCrate::Itself)) => CORE.replace('-', "_"),
        (None, None) => FACADE.to_owned(),
    };
    let ident = Ident::new(&name, Span::call_site());
    quote!(::#ident)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(found: (Option<FoundCrate>, Option<FoundCrate>)) -> String {
        resolve(found.0, found.1).to_string().replace(' ', "")
    }

    #[test]
    fn facade_preferred_then_runtime() {
        let name = |n: &str| Some(FoundCrate::Name(n.to_owned()));
        assert_eq!(
            path((name("babelqueue"), name("babelqueue_runtime"))),
            "::babelqueue"
        );
        assert_eq!(path((name("bq"), None)), "::bq");
        assert_eq!(
            path((None, name("babelqueue_runtime"))),
            "::babelqueue_runtime"
        );
        assert_eq!(path((None, name("core_renamed"))), "::core_renamed");
        assert_eq!(path((Some(FoundCrate::Itself), None)), "::babelqueue");
        assert_eq!(
            path((None, Some(FoundCrate::Itself))),
            "::babelqueue_runtime"
        );
        assert_eq!(path((None, None)), "::babelqueue");
    }

    /// The real lookup, through `proc-macro-crate`, over manifests written to disk: a
    /// crate depending on the core only, on a renamed facade, and on both.
    #[test]
    fn reads_the_users_cargo_toml() {
        let cases = [
            (
                "[package]\nname = \"svc\"\nversion = \"0.1.0\"\n[dependencies]\nbabelqueue-runtime = \"0.1\"\n",
                "::babelqueue_runtime",
            ),
            (
                "[package]\nname = \"svc\"\nversion = \"0.1.0\"\n[dependencies]\nbq = { package = \"babelqueue\", version = \"0.1\" }\n",
                "::bq",
            ),
            (
                "[package]\nname = \"svc\"\nversion = \"0.1.0\"\n[dependencies]\nbabelqueue-runtime = \"0.1\"\nbabelqueue = \"0.1\"\n",
                "::babelqueue",
            ),
            (
                "[package]\nname = \"svc\"\nversion = \"0.1.0\"\n[dev-dependencies]\nbabelqueue-runtime = \"0.1\"\n",
                "::babelqueue_runtime",
            ),
        ];
        let base = std::env::temp_dir().join(format!("bq-macros-krate-{}", std::process::id()));
        let saved = std::env::var_os("CARGO_MANIFEST_DIR");
        for (i, (manifest, expected)) in cases.iter().enumerate() {
            let dir = base.join(i.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
            // SAFETY: this is the only test of this crate that reads or writes the
            // environment, and proc-macro-crate reads it on this thread.
            unsafe { std::env::set_var("CARGO_MANIFEST_DIR", &dir) };
            let got = runtime(None).to_string().replace(' ', "");
            assert_eq!(&got, expected, "manifest:\n{manifest}");
        }
        match saved {
            // SAFETY: as above.
            Some(v) => unsafe { std::env::set_var("CARGO_MANIFEST_DIR", v) },
            None => unsafe { std::env::remove_var("CARGO_MANIFEST_DIR") },
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
