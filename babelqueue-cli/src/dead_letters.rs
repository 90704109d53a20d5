//! What the Redis and the RabbitMQ commands share about dead letters: how one is
//! described, how a list is printed, which ones a requeue selects and how its outcome is
//! reported.

use serde_json::{Value, json};

use crate::CliError;
use crate::envelope::{Element, iso_millis};

/// One dead letter, as listed (a line of `dlq list --json`).
pub(crate) fn describe(element: &[u8]) -> Value {
    let el = Element::parse(element);
    if el.envelope.is_none() {
        return json!({ "meta_id": null, "reason": null, "note": "not a JSON envelope" });
    }
    let failed_at = el.dead_letter("failed_at").and_then(Value::as_i64);
    let mut v = json!({
        "meta_id": el.meta_id(),
        "job": el.job(),
        "reason": el.dead_letter("reason"),
        "attempts": el.dead_letter("attempts"),
        "failed_at": failed_at,
        "failed_at_utc": failed_at.map(iso_millis),
        "error": el.dead_letter("error"),
        "original_queue": el.dead_letter("original_queue"),
    });
    if el.job() == Some(babelqueue_runtime::POISON_URN) {
        v["poison_wrapper"] = Value::Bool(true);
    }
    v
}

/// Prints `items` of `dlq` (of `total` dead letters): one JSON object per line, or the
/// text listing.
pub(crate) fn print_list(dlq: &str, total: u64, items: &[Vec<u8>], json: bool) {
    if json {
        for item in items {
            println!("{}", describe(item));
        }
        return;
    }
    println!("{dlq}: {total} dead letter(s), showing {}", items.len());
    for (i, item) in items.iter().enumerate() {
        let d = describe(item);
        let text = |k: &str| match &d[k] {
            Value::Null => "-".to_owned(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let poison = if d["poison_wrapper"] == true {
            "  (poison wrapper: see `dlq recover-poison`)"
        } else {
            ""
        };
        println!(
            "{:>4}  meta.id={}  reason={}  attempts={}  failed_at={}  job={}{poison}\n      error: {}",
            i + 1,
            text("meta_id"),
            text("reason"),
            text("attempts"),
            text("failed_at_utc"),
            text("job"),
            text("error"),
        );
    }
}

/// Which dead letters to requeue.
pub(crate) enum Select {
    Id(String),
    All,
}

impl Select {
    /// Whether `el` is selected.
    pub(crate) fn matches(&self, el: &Element) -> bool {
        match self {
            Select::Id(id) => el.meta_id() == Some(id.as_str()),
            Select::All => true,
        }
    }
}

/// What a requeue did, to report at the end.
#[derive(Default)]
pub(crate) struct Tally {
    /// Requeued.
    pub moved: u64,
    /// Selected (requeued or not).
    pub matched: u64,
    /// Selected poison wrappers, left in the dead-letter queue.
    pub poison: u64,
    /// Selected bodies that are not JSON objects, left in the dead-letter queue.
    pub unreadable: u64,
}

impl Tally {
    /// Prints the summary (`requeued N dead letter(s) from <dlq> to <target>`, skipped
    /// poison wrappers and unreadable bodies on stderr) and says whether the requeue did
    /// what was asked: `--id` that matched nothing, or nothing it could move, is an error.
    pub(crate) fn finish(&self, dlq: &str, target: &str, select: &Select) -> Result<(), CliError> {
        if self.poison > 0 {
            eprintln!(
                "skipped {} poison wrapper(s): use `babelqueue dlq recover-poison` for their original bytes",
                self.poison
            );
        }
        if self.unreadable > 0 {
            eprintln!(
                "skipped {} dead letter(s) that are not JSON objects",
                self.unreadable
            );
        }
        println!(
            "requeued {} dead letter(s) from {dlq} to {target}",
            self.moved
        );
        match select {
            Select::Id(id) if self.matched == 0 => Err(CliError::Message(format!(
                "no dead letter with meta.id {id} in {dlq}"
            ))),
            Select::Id(id) if self.moved == 0 => Err(CliError::Message(format!(
                "the dead letter with meta.id {id} in {dlq} was not requeued"
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_is_described_by_its_block() {
        let d = describe(
            br#"{"job":"urn:x","meta":{"id":"m1"},"dead_letter":{"reason":"failed","attempts":3,"failed_at":0,"error":"boom","original_queue":"q"}}"#,
        );
        assert_eq!(d["meta_id"], "m1");
        assert_eq!(d["reason"], "failed");
        assert_eq!(d["attempts"], 3);
        assert_eq!(d["failed_at_utc"], "1970-01-01T00:00:00.000Z");
        assert_eq!(d["original_queue"], "q");
        assert!(d.get("poison_wrapper").is_none());
        assert_eq!(describe(b"\xff")["note"], "not a JSON envelope");
    }

    #[test]
    fn selection_by_id() {
        let el = Element::parse(br#"{"job":"urn:x","meta":{"id":"m1"}}"#);
        assert!(Select::Id("m1".into()).matches(&el));
        assert!(!Select::Id("m2".into()).matches(&el));
        assert!(Select::All.matches(&el));
    }

    #[test]
    fn an_id_that_moved_nothing_is_an_error() {
        let select = Select::Id("m1".into());
        assert!(Tally::default().finish("q.dlq", "q", &select).is_err());
        let found = Tally {
            matched: 1,
            poison: 1,
            ..Tally::default()
        };
        assert!(found.finish("q.dlq", "q", &select).is_err());
        let moved = Tally {
            matched: 1,
            moved: 1,
            ..Tally::default()
        };
        assert!(moved.finish("q.dlq", "q", &select).is_ok());
        assert!(Tally::default().finish("q.dlq", "q", &Select::All).is_ok());
    }
}
