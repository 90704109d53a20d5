use babelqueue::{Envelope, Router, handler};

#[derive(Debug)]
pub struct Declined;

#[handler("urn:babel:payments:charge")]
fn charge(env: &Envelope) -> Result<(), Declined> {
    let _ = env;
    Err(Declined)
}

fn main() {
    let _ = Router::new().register(charge {});
}
