use babelqueue::{Envelope, handler};

pub struct Payments;

impl Payments {
    #[handler("urn:babel:payments:charge")]
    fn charge(&self, env: &Envelope) {
        let _ = env;
    }
}

fn main() {}
