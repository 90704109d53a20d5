use babelqueue::{Envelope, idempotent};

#[idempotent]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
