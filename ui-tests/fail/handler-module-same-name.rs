use babelqueue::{Envelope, handler};

mod charge {
    pub const FEE: u64 = 30;
}

#[handler("urn:babel:payments:charge")]
fn charge(env: &Envelope) {
    let _ = (env, charge::FEE);
}

fn main() {}
