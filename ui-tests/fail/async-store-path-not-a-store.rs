use babelqueue::{Envelope, idempotent};

mod config {
    pub struct Config;
    pub static STORE: Config = Config;
}

#[idempotent(store = config::STORE)]
async fn charge(env: &Envelope) -> Result<(), std::io::Error> {
    let _ = env;
    Ok(())
}

fn main() {}
