use babelqueue::{Envelope, idempotent};

pub struct Config {
    pub retries: u32,
}

static CONFIG: Config = Config { retries: 3 };

#[idempotent(store = CONFIG)]
fn charge(env: &Envelope) {
    let _ = (env, CONFIG.retries);
}

fn main() {}
