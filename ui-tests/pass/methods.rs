//! Methods with `&self` / `&mut self` in `impl` blocks, the store in a field
//! (`store = self.store`), sync and async.
#![deny(warnings)]

use std::sync::Arc;

use babelqueue::{Envelope, InMemoryStore, idempotent};

pub struct Payments {
    store: InMemoryStore,
    shared: Arc<InMemoryStore>,
    charged: u32,
}

impl Payments {
    #[idempotent(store = self.store)]
    pub fn charge(&mut self, env: &Envelope) {
        let _ = env;
        self.charged += 1;
    }

    #[idempotent(store = self.store)]
    pub async fn charge_async(&mut self, env: &Envelope) -> Result<(), std::io::Error> {
        tokio::task::yield_now().await;
        let _ = env;
        self.charged += 1;
        Ok(())
    }

    #[idempotent(store = self.shared)]
    pub fn audit(&self, env: &Envelope) {
        let _ = (env, self.charged);
    }

    #[idempotent(store = self.shared)]
    pub async fn audit_async(&self, env: Envelope) {
        let _ = (env, self.charged);
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut p = Payments {
        store: InMemoryStore::new(),
        shared: Arc::new(InMemoryStore::new()),
        charged: 0,
    };
    let a = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
    let b = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
    p.charge(&a);
    p.charge(&a);
    p.charge_async(&b).await.unwrap();
    p.charge_async(&b).await.unwrap();
    assert_eq!(p.charged, 2);
    p.audit(&a);
    p.audit_async(a).await;
}
