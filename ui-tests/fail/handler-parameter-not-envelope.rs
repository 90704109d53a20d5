use babelqueue::handler;

#[handler("urn:babel:payments:charge")]
fn charge(body: &serde_json::Value) {
    let _ = body;
}

fn main() {}
