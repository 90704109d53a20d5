use babelqueue::{Envelope, handler};

#[handler("urn:babel:payments: charge")]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
