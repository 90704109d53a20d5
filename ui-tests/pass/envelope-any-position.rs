//! The envelope may be `Envelope` or `&Envelope`, at any position among other parameters.
#![deny(warnings)]

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STORE: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static EFFECTS: AtomicU32 = AtomicU32::new(0);

#[idempotent(store = STORE)]
fn first_by_value(env: Envelope, gateway: &str, amount: u64) {
    let _ = (env.meta.id, gateway, amount);
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = STORE)]
fn middle_by_ref(gateway: &str, env: &Envelope, amount: u64) {
    let _ = (&env.meta.id, gateway, amount);
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = STORE)]
fn last_mut_ref(gateway: &str, amount: u64, env: &mut Envelope) {
    env.attempts += 1;
    let _ = (gateway, amount);
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = STORE)]
async fn async_last_by_value(gateway: String, mut env: Envelope) {
    env.attempts += 1;
    let _ = gateway;
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

fn new_env() -> Envelope {
    Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (a, b, mut c, d) = (new_env(), new_env(), new_env(), new_env());
    for _ in 0..2 {
        first_by_value(a.clone(), "stripe", 1);
        middle_by_ref("stripe", &b, 1);
        last_mut_ref("stripe", 1, &mut c);
        async_last_by_value("stripe".into(), d.clone()).await;
    }
    assert_eq!(EFFECTS.load(Ordering::SeqCst), 4, "each envelope ran once");
    assert_eq!(c.attempts, 1, "the second delivery was skipped");
}
