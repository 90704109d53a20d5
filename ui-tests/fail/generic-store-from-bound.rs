use babelqueue::{Envelope, Store, idempotent};

#[derive(Debug)]
pub struct ChargeError;

#[idempotent(store = store)]
fn charge<S, E>(store: &S, env: &Envelope) -> Result<(), E>
where
    S: Store,
    E: From<S::Error>,
{
    let _ = env;
    Ok(())
}

fn main() {}
