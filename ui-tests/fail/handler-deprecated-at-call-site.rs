#![deny(deprecated)]

use babelqueue::{Envelope, handler};

/// Deprecated: the warning belongs where it is used, not here.
#[handler("urn:babel:payments:charge")]
#[deprecated = "use `charge_v2`"]
pub fn charge(env: &Envelope) {
    let _ = env;
}

fn main() {
    let env = Envelope::new("urn:babel:payments:charge", serde_json::json!({})).unwrap();
    charge(&env);
}
