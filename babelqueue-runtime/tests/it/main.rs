//! The runtime's integration tests, one binary: `cargo test -p babelqueue-runtime
//! --features metrics,opentelemetry --test it` (the modules that need a feature are
//! empty without it).

mod observability;
mod otel_parent;
mod otel_publish;
mod span_fields;
