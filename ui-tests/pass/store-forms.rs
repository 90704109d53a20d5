//! `store =` takes any expression: a std `LazyLock` static, a `once_cell::sync::Lazy`
//! static, a path into a module, `&*STORE`, a function call, an `Arc`.
#![deny(warnings)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};

use babelqueue::{Envelope, InMemoryStore, idempotent};

static STD_LAZY: LazyLock<InMemoryStore> = LazyLock::new(InMemoryStore::new);
static ONCE_CELL: once_cell::sync::Lazy<InMemoryStore> =
    once_cell::sync::Lazy::new(InMemoryStore::new);
static ARC: LazyLock<Arc<InMemoryStore>> = LazyLock::new(|| Arc::new(InMemoryStore::new()));
static EFFECTS: AtomicU32 = AtomicU32::new(0);

mod stores {
    pub static PAYMENTS: std::sync::LazyLock<babelqueue::InMemoryStore> =
        std::sync::LazyLock::new(babelqueue::InMemoryStore::new);
}

fn store() -> &'static InMemoryStore {
    &STD_LAZY
}

macro_rules! handler {
    ($name:ident, $store:expr) => {
        #[idempotent(store = $store)]
        fn $name(env: &Envelope) {
            let _ = env;
            EFFECTS.fetch_add(1, Ordering::SeqCst);
        }
    };
}

#[idempotent(store = STD_LAZY)]
fn std_lazy(env: &Envelope) {
    let _ = env;
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = ONCE_CELL)]
async fn once_cell(env: &Envelope) {
    let _ = env;
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = stores::PAYMENTS)]
fn path(env: &Envelope) {
    let _ = env;
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = &*STD_LAZY)]
async fn deref(env: &Envelope) {
    let _ = env;
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = store())]
fn call(env: &Envelope) {
    let _ = env;
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(store = ARC.clone())]
async fn arc(env: &Envelope) {
    let _ = env;
    EFFECTS.fetch_add(1, Ordering::SeqCst);
}

handler!(from_macro_rules, stores::PAYMENTS);

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let env = || Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
    let (a, b, c, d, e, f, g) = (env(), env(), env(), env(), env(), env(), env());
    for _ in 0..3 {
        std_lazy(&a);
        once_cell(&b).await;
        path(&c);
        deref(&d).await;
        call(&e);
        arc(&f).await;
        from_macro_rules(&g);
    }
    assert_eq!(EFFECTS.load(Ordering::SeqCst), 7, "each envelope had one effect");
}
