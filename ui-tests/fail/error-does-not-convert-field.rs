use babelqueue::{Envelope, Store, idempotent};

pub struct FileStore;

impl Store for FileStore {
    type Error = std::io::Error;
    fn seen(&self, _id: &str) -> Result<bool, std::io::Error> {
        Ok(false)
    }
    fn remember(&self, _id: &str) -> Result<(), std::io::Error> {
        Ok(())
    }
    fn forget(&self, _id: &str) -> Result<(), std::io::Error> {
        Ok(())
    }
}

#[derive(Debug)]
pub enum ChargeError {
    Declined,
}

pub struct Payments {
    store: FileStore,
}

impl Payments {
    #[idempotent(store = self.store)]
    fn charge(&self, env: &Envelope) -> Result<(), ChargeError> {
        let _ = env;
        Err(ChargeError::Declined)
    }
}

fn main() {}
