//! `BrokerUrl::parse`: never panics on any text; what it accepts displays and debugs
//! without panicking; an AMQP URL's normal form parses back to the same parts.
#![no_main]

use babelqueue_core::binding::{AmqpUrl, BrokerUrl};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match BrokerUrl::parse(text) {
        Err(e) => {
            let _ = e.to_string();
        }
        Ok(url) => {
            let _ = (url.to_string(), format!("{url:?}"), url.broker());
            if let BrokerUrl::Amqp(a) = &url {
                let again = BrokerUrl::parse(&a.to_url()).expect("the normal form parses");
                let expected = AmqpUrl {
                    query: Vec::new(),
                    ..a.clone()
                };
                assert_eq!(again, BrokerUrl::Amqp(expected), "{}", a.to_url());
            }
        }
    }
});
