//! Compile-time behaviour of `#[idempotent]` and `#[handler]`, pinned by trybuild.
//!
//! `ui-tests/pass/*.rs` must compile (and run: each has a `main` asserting what it
//! shows); `ui-tests/fail/*.rs` must fail with exactly the committed `.stderr`. Each fail
//! case pins one rule and is named after it. Regenerate a `.stderr` with
//! `TRYBUILD=overwrite cargo test --test ui`, then review its wording.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("ui-tests/pass/*.rs");
    t.compile_fail("ui-tests/fail/*.rs");
}
