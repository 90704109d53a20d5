use babelqueue::{Envelope, idempotent};

pub struct Config {
    pub url: String,
}

pub struct Payments {
    config: Config,
}

impl Payments {
    #[idempotent(store = self.config)]
    async fn charge(&self, env: &Envelope) -> Result<(), std::io::Error> {
        let _ = (env, &self.config.url);
        Ok(())
    }
}

fn main() {}
