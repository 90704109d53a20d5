use babelqueue::{Envelope, Router, handler};

#[handler("urn:babel:payments:charge")]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {
    let _ = Router::new().register(charge);
}
