use babelqueue::{Envelope, handler};

#[handler("urn:babel:payments:charge")]
extern "C" fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
