use std::rc::Rc;

use babelqueue::{Envelope, handler};

#[handler("urn:babel:payments:charge")]
async fn charge(env: &Envelope) {
    let local = Rc::new(env.meta.id.clone());
    tokio::task::yield_now().await;
    let _ = local;
}

fn main() {}
