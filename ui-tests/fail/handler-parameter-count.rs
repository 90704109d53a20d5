use babelqueue::{Envelope, handler};

#[handler("urn:babel:payments:charge")]
fn charge(env: &Envelope, gateway: &str) {
    let _ = (env, gateway);
}

fn main() {}
