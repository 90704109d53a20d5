use babelqueue::{Envelope, handler};

pub struct Gateway;

#[handler("urn:babel:payments:charge")]
fn charge(env: &Envelope, gateway: &Gateway) {
    let _ = (env, gateway);
}

fn main() {}
