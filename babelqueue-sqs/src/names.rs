//! SQS queue names: what SQS accepts, and the family's dead-letter queue.

use babelqueue_core::binding::sqs;
use babelqueue_runtime::TransportError;

/// The longest SQS queue name (the `.fifo` suffix included).
pub const MAX_NAME_LEN: usize = 80;

/// Checks that `queue` is a name SQS accepts: 1 to 80 characters of ASCII letters, digits,
/// `-` and `_`, with a `.fifo` suffix allowed (and required) for a FIFO queue. Anything
/// else — a `.` or `:` as the other brokers' names use them (`orders.dlq`,
/// `billing:jobs`) — is a clear error here, before any call to SQS.
///
/// ```
/// use babelqueue_sqs::validate_queue_name;
/// assert!(validate_queue_name("orders").is_ok());
/// assert!(validate_queue_name("orders-dlq.fifo").is_ok());
/// let err = validate_queue_name("orders.dlq").unwrap_err();
/// assert!(err.to_string().contains("not a valid SQS queue name"), "{err}");
/// assert!(validate_queue_name("billing:jobs").is_err());
/// assert!(validate_queue_name("").is_err());
/// ```
pub fn validate_queue_name(queue: &str) -> Result<(), InvalidQueueName> {
    let base = queue.strip_suffix(sqs::FIFO_SUFFIX).unwrap_or(queue);
    let why = if queue.len() > MAX_NAME_LEN {
        Some(format!("longer than {MAX_NAME_LEN} characters"))
    } else if base.is_empty() {
        Some("empty".to_owned())
    } else {
        base.chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
            .map(|c| {
                format!(
                    "{c:?} is not allowed (only ASCII letters, digits, `-` and `_`, and a `.fifo` suffix)"
                )
            })
    };
    match why {
        None => Ok(()),
        Some(why) => Err(InvalidQueueName {
            name: queue.chars().take(100).collect(),
            why,
        }),
    }
}

/// A queue name SQS would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{name}` is not a valid SQS queue name: {why}")]
pub struct InvalidQueueName {
    name: String,
    why: String,
}

impl From<InvalidQueueName> for TransportError {
    fn from(e: InvalidQueueName) -> Self {
        TransportError::backend(e)
    }
}

/// The dead-letter queue the runtime writes to for `queue` when the App's suffix is
/// `suffix`: the family's `<queue>-dlq` (`<queue>-dlq.fifo` for a FIFO queue) for the
/// runtime's default `.dlq` (a `.` is not allowed in an SQS name) or an empty suffix,
/// else `<queue><suffix>` with the suffix placed before `.fifo`.
///
/// ```
/// use babelqueue_sqs::dead_letter_queue;
/// assert_eq!(dead_letter_queue("orders", ".dlq"), "orders-dlq");
/// assert_eq!(dead_letter_queue("orders.fifo", ".dlq"), "orders-dlq.fifo");
/// assert_eq!(dead_letter_queue("orders", "-dead"), "orders-dead");
/// ```
pub fn dead_letter_queue(queue: &str, suffix: &str) -> String {
    let suffix = (suffix != ".dlq").then_some(suffix);
    sqs::dead_letter_queue_name_with(queue, suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_queue_name(&"a".repeat(80)).is_ok());
        assert!(validate_queue_name(&"a".repeat(81)).is_err());
        assert!(validate_queue_name(&format!("{}.fifo", "a".repeat(75))).is_ok());
        assert!(validate_queue_name(".fifo").is_err());
        assert!(validate_queue_name("a b").is_err());
        assert!(validate_queue_name("café").is_err());
        assert!(validate_queue_name("a.fifo.fifo").is_err());
        assert!(validate_queue_name("A_b-9").is_ok());
    }

    #[test]
    fn dlq_names_are_valid() {
        for q in ["orders", "orders.fifo", "x_y-z"] {
            validate_queue_name(&dead_letter_queue(q, ".dlq")).unwrap();
        }
    }
}
