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

fn files() -> FileStore {
    FileStore
}

#[derive(Debug)]
pub enum ChargeError {
    Declined,
}

#[idempotent(store = files())]
fn charge(env: &Envelope) -> Result<(), ChargeError> {
    let _ = env;
    Err(ChargeError::Declined)
}

fn main() {}
