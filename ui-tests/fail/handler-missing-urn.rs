use babelqueue::{Envelope, handler};

#[handler]
fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {}
