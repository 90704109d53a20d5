//! The examples of [babelqueue](https://github.com/babelqueue/babelqueue-rs) live in
//! `examples/` (this package's `examples` directory is a link to it). Run one with
//! `cargo run --example payments` from the repository root. This library is empty: cargo
//! needs a target besides examples.
