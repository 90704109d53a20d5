use babelqueue::{AsyncStore, Envelope, idempotent};

pub struct RemoteStore;

impl AsyncStore for RemoteStore {
    type Error = std::io::Error;
    async fn seen(&self, _id: &str) -> Result<bool, std::io::Error> {
        Ok(false)
    }
    async fn remember(&self, _id: &str) -> Result<(), std::io::Error> {
        Ok(())
    }
    async fn forget(&self, _id: &str) -> Result<(), std::io::Error> {
        Ok(())
    }
}

static STORE: RemoteStore = RemoteStore;

#[idempotent(store = STORE)]
async fn charge(env: &Envelope) -> Result<(), String> {
    let _ = env;
    Ok(())
}

fn main() {}
