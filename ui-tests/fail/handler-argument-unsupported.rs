use babelqueue::{Json, handler};

#[derive(serde::Deserialize)]
pub struct Payment {
    pub amount: u64,
}

#[handler("urn:babel:payments:charge")]
async fn charge(payment: Json<Payment>, amount: u64) {
    let _ = (payment.amount, amount);
}

fn main() {}
