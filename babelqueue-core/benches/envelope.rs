//! Decoding a consumed envelope: [`Envelope::decode`] (the acceptance rules' fields are
//! picked while parsing) against parsing a `serde_json::Value` first and picking from it
//! ([`Envelope::from_value`], how `decode` worked before), on the same bytes in one run.
//!
//! And reading `data` into a typed payload: [`Envelope::data_as`] (the map read in place)
//! against deserializing a copy of it as a `Value` (how `data_as` and `Json<T>` worked
//! before).
//!
//! ```bash
//! cargo bench -p babelqueue-core --bench envelope
//! ```

use std::hint::black_box;

use babelqueue_core::Envelope;
use criterion::{Criterion, criterion_group, criterion_main};

/// The bench's payment (the shape `babelqueue-bench` sends) and a larger order.
fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    let payment = br#"{"job":"urn:babel:payments:charge","trace_id":"6f1c2a9e-0d4b-4c5e-9a3f-2b7d8e1f0a6c","data":{"payment_id":"pay_000042","amount":4200,"currency":"EUR"},"meta":{"id":"0b6e7d3c-8a2f-4e1b-9c5d-3f4a2e1b0c9d","queue":"payments","lang":"python","schema_version":1,"created_at":1764680000000},"attempts":0}"#.to_vec();
    let items: Vec<String> = (0..20)
        .map(|i| {
            format!(r#"{{"sku":"SKU-{i}","qty":{i},"price":"{i}.99","note":"a \"quoted\" word"}}"#)
        })
        .collect();
    let order = format!(
        r#"{{"job":"urn:babel:orders:created","trace_id":"t-1","data":{{"order_id":1042,"items":[{}]}},"meta":{{"id":"m-1","queue":"orders","lang":"go","schema_version":1,"created_at":1764680000000,"tenant":"acme"}},"attempts":2,"x-origin":"eu"}}"#,
        items.join(",")
    )
    .into_bytes();
    vec![("payment", payment), ("order_20_items", order)]
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("envelope_decode");
    for (name, body) in bodies() {
        assert!(Envelope::decode(&body).is_ok(), "{name}");
        g.bench_function(format!("{name}/decode"), |b| {
            b.iter(|| Envelope::decode(black_box(&body)))
        });
        g.bench_function(format!("{name}/value_then_from_value"), |b| {
            b.iter(|| {
                serde_json::from_slice::<serde_json::Value>(black_box(&body))
                    .map_err(|e| e.to_string())
                    .and_then(|v| Envelope::from_value(v).map_err(|e| e.to_string()))
            })
        });
    }
    g.finish();
}

/// The typed payloads of the two bodies.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Payment {
    payment_id: String,
    amount: u64,
    currency: String,
}

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Order {
    order_id: u64,
    items: Vec<Item>,
}

#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Item {
    sku: String,
    qty: u32,
    price: String,
    note: String,
}

fn typed<T: serde::de::DeserializeOwned>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    body: &[u8],
) {
    let env = Envelope::decode(body).expect("decodes");
    assert!(env.data_as::<T>().is_ok(), "{name}");
    g.bench_function(format!("{name}/data_as"), |b| {
        b.iter(|| black_box(&env).data_as::<T>())
    });
    // The same after the map was built (a handler that also read `env.data`).
    let parsed = Envelope::decode(body).expect("decodes");
    let _ = parsed.data.as_map();
    g.bench_function(format!("{name}/data_as_from_the_map"), |b| {
        b.iter(|| black_box(&parsed).data_as::<T>())
    });
    g.bench_function(format!("{name}/copy_to_value_then_deserialize"), |b| {
        b.iter(|| {
            T::deserialize(serde_json::Value::Object(
                black_box(&env).data.as_map().clone(),
            ))
        })
    });
}

fn data_as(c: &mut Criterion) {
    let mut g = c.benchmark_group("envelope_data_as");
    let bodies = bodies();
    typed::<Payment>(&mut g, bodies[0].0, &bodies[0].1);
    typed::<Order>(&mut g, bodies[1].0, &bodies[1].1);
    g.finish();
}

criterion_group!(benches, decode, data_as);
criterion_main!(benches);
