use babelqueue::{Json, handler};

pub struct Payment {
    pub amount: u64,
}

#[handler("urn:babel:payments:charge")]
async fn charge(payment: Json<Payment>) {
    let _ = payment.amount;
}

fn main() {}
