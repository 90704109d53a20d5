use babelqueue::{Envelope, handler};

#[handler("urn:babel:payments:charge")]
fn charge<T: Default>(env: &Envelope) {
    let _ = (env, T::default());
}

fn main() {}
