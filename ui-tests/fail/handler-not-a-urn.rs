use babelqueue::{Envelope, handler};

#[handler("payments.charge")]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
