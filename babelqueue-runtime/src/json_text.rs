//! Edits of a JSON object's text that leave every other byte as it arrived.
//!
//! A retry changes `attempts`, a dead letter adds the `dead_letter` block: the contract
//! changes nothing else, so nothing else may change. Decoding the body into a value and
//! encoding it again would (a 30-digit integer becomes a float, `1.0E2` becomes `100.0`, a
//! duplicated key loses a value, whitespace and escapes are rewritten). These functions
//! find the spans of the top-level members in the text and splice only the value they
//! change.

/// One top-level member of an object text: its decoded key and the byte spans of its key
/// (with quotes) and value.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub key: String,
    pub key_start: usize,
    pub value_start: usize,
    pub value_end: usize,
}

/// The top-level members of `text`, in order (duplicates included), and the offset of the
/// object's opening brace; `None` unless `text` is exactly one JSON object (surrounding
/// whitespace allowed).
pub(crate) fn members(text: &[u8]) -> Option<(Vec<Member>, usize)> {
    // Validates the whole text first, so the scanner below only meets valid JSON.
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(text).ok()?;
    let mut s = Scanner { text, at: 0 };
    s.ws();
    let open = s.at;
    s.expect(b'{')?;
    let mut out = Vec::new();
    s.ws();
    if s.peek()? == b'}' {
        return Some((out, open));
    }
    loop {
        s.ws();
        let key_start = s.at;
        s.string()?;
        let key: String = serde_json::from_slice(&text[key_start..s.at]).ok()?;
        s.ws();
        s.expect(b':')?;
        s.ws();
        let value_start = s.at;
        s.value()?;
        out.push(Member {
            key,
            key_start,
            value_start,
            value_end: s.at,
        });
        s.ws();
        match s.next()? {
            b',' => continue,
            b'}' => return Some((out, open)),
            _ => return None,
        }
    }
}

/// `text` with the top-level member `key` set to `value` (JSON text): the value of its
/// last occurrence replaced (the one every reader takes), or the member appended after the
/// last one. `None` unless `text` is a JSON object.
pub fn set_member(text: &[u8], key: &str, value: &[u8]) -> Option<Vec<u8>> {
    let (members, open) = members(text)?;
    if let Some(m) = members.iter().rev().find(|m| m.key == key) {
        let mut out = Vec::with_capacity(text.len() + value.len());
        out.extend_from_slice(&text[..m.value_start]);
        out.extend_from_slice(value);
        out.extend_from_slice(&text[m.value_end..]);
        return Some(out);
    }
    Some(append_member(text, &members, open, key, value))
}

/// `text` with `"key":value` added after its last member (or inside the empty braces).
fn append_member(text: &[u8], members: &[Member], open: usize, key: &str, value: &[u8]) -> Vec<u8> {
    let (at, comma) = match members.last() {
        Some(m) => (m.value_end, true),
        None => (open + 1, false),
    };
    let key = serde_json::to_vec(key).unwrap_or_default();
    let mut out = Vec::with_capacity(text.len() + key.len() + value.len() + 2);
    out.extend_from_slice(&text[..at]);
    if comma {
        out.push(b',');
    }
    out.extend_from_slice(&key);
    out.push(b':');
    out.extend_from_slice(value);
    out.extend_from_slice(&text[at..]);
    out
}

/// `text` with `key` appended as its last member, whether or not it already has one (the
/// caller checked it has none).
pub(crate) fn append(text: &[u8], key: &str, value: &[u8]) -> Option<Vec<u8>> {
    let (members, open) = members(text)?;
    Some(append_member(text, &members, open, key, value))
}

/// `text` without any top-level member named `key` (every occurrence), each taken out
/// with the separator that joined it to the member before it (or, for the first member,
/// to the one after it); every other byte stays. `text` itself when it has no such
/// member; `None` unless `text` is a JSON object.
pub(crate) fn remove_member(text: &[u8], key: &str) -> Option<Vec<u8>> {
    let mut out = text.to_vec();
    loop {
        let (members, _) = members(&out)?;
        let Some(i) = members.iter().position(|m| m.key == key) else {
            return Some(out);
        };
        let m = &members[i];
        let (from, to) = match (i, members.get(i + 1)) {
            (0, Some(next)) => (m.key_start, next.key_start),
            (0, None) => (m.key_start, m.value_end),
            (_, _) => (members[i - 1].value_end, m.value_end),
        };
        out.drain(from..to);
    }
}

/// The inverse of [`append`]: `text` without its last member when that member is `key`
/// (the exact bytes it had before the append). The separator before it must be a comma,
/// optionally after whitespace (where the family's splice, which appends before the
/// closing brace, leaves the whitespace that stood there); the comma goes, the whitespace
/// stays. `None` otherwise.
pub(crate) fn strip_last(text: &[u8], key: &str) -> Option<Vec<u8>> {
    let (members, open) = members(text)?;
    let last = members.last()?;
    if last.key != key {
        return None;
    }
    let from = match members.len() {
        1 => open + 1,
        n => members[n - 2].value_end,
    };
    let separator = &text[from..last.key_start];
    // What `append` writes between the previous value and the key: a comma, nothing else
    // (the family's splice: whitespace, then the comma).
    let from = match separator.split_last() {
        None if members.len() == 1 => from,
        Some((b',', ws)) if members.len() > 1 && ws.iter().all(u8::is_ascii_whitespace) => {
            last.key_start - 1
        }
        _ => return None,
    };
    let mut out = Vec::with_capacity(text.len());
    out.extend_from_slice(&text[..from]);
    out.extend_from_slice(&text[last.value_end..]);
    Some(out)
}

struct Scanner<'a> {
    text: &'a [u8],
    at: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A string, from its opening quote to past its closing one.
    fn string(&mut self) -> Option<()> {
        self.expect(b'"')?;
        loop {
            match self.next()? {
                b'"' => return Some(()),
                b'\\' => {
                    self.next()?;
                }
                _ => {}
            }
        }
    }

    /// Any value (the text was validated: only the extent is found here).
    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => self.string()?,
                        b'{' | b'[' => {
                            depth += 1;
                            self.at += 1;
                        }
                        b'}' | b']' => {
                            depth -= 1;
                            self.at += 1;
                            if depth == 0 {
                                return Some(());
                            }
                        }
                        _ => self.at += 1,
                    }
                }
            }
            _ => {
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.at += 1;
                }
                Some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[u8]) -> &str {
        std::str::from_utf8(v).unwrap()
    }

    #[test]
    fn replaces_only_the_value_and_keeps_every_other_byte() {
        let body = br#"{ "job":"urn:x", "data":{"n":123456789012345678901234567890,"f":1.0E2,"z":-0,"s":"a\"}b"},"attempts" : 2 ,"k":1,"k":2 }"#;
        let out = set_member(body, "attempts", b"3").unwrap();
        assert_eq!(
            s(&out),
            r#"{ "job":"urn:x", "data":{"n":123456789012345678901234567890,"f":1.0E2,"z":-0,"s":"a\"}b"},"attempts" : 3 ,"k":1,"k":2 }"#
        );
    }

    #[test]
    fn the_last_of_duplicated_keys_is_the_one_set() {
        let out = set_member(
            br#"{"attempts":1,"x":[1,{"attempts":9}],"attempts":2}"#,
            "attempts",
            b"5",
        )
        .unwrap();
        assert_eq!(
            s(&out),
            r#"{"attempts":1,"x":[1,{"attempts":9}],"attempts":5}"#
        );
    }

    #[test]
    fn appends_and_strips_back_to_the_same_bytes() {
        for body in [
            &br#"{"a":1}"#[..],
            br#"  {"a" : [1, 2] ,"b":"}"}  "#,
            b"{}",
            b"{ \n }",
            br#"{"a":{"dead_letter":1}}"#,
            br#"{"\u0061":12345678901234567890123456789e-3}"#,
        ] {
            let with = append(body, "dead_letter", br#"{"reason":"poison"}"#).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&with).unwrap();
            assert_eq!(v["dead_letter"]["reason"], "poison", "{}", s(&with));
            assert_eq!(
                strip_last(&with, "dead_letter").unwrap(),
                body,
                "{}",
                s(&with)
            );
        }
    }

    #[test]
    fn escaped_keys_are_compared_decoded() {
        let out = set_member(br#"{"att\u0065mpts":1}"#, "attempts", b"2").unwrap();
        assert_eq!(s(&out), r#"{"att\u0065mpts":2}"#);
    }

    #[test]
    fn not_an_object_is_none() {
        for body in [
            &b"[1]"[..],
            b"1",
            b"",
            b"{",
            br#"{"a":1} x"#,
            br#"{"a":1}{}"#,
            b"\"{}\"",
        ] {
            assert!(members(body).is_none(), "{}", String::from_utf8_lossy(body));
            assert!(set_member(body, "a", b"1").is_none());
        }
    }

    #[test]
    fn strip_refuses_what_append_did_not_write() {
        assert!(strip_last(br#"{"a":1, "dead_letter":{}}"#, "dead_letter").is_none());
        assert!(strip_last(br#"{"dead_letter":{},"a":1}"#, "dead_letter").is_none());
        assert!(strip_last(br#"{ "dead_letter":{}}"#, "dead_letter").is_none());
    }

    #[test]
    fn remove_member_takes_out_every_occurrence_and_nothing_else() {
        for (body, expect) in [
            (&br#"{"a":1,"dead_letter":{"x":1}}"#[..], &br#"{"a":1}"#[..]),
            (br#"{"dead_letter":1,"a":1.0E2}"#, br#"{"a":1.0E2}"#),
            (br#"{ "dead_letter" : 1 , "a" : -0 }"#, br#"{ "a" : -0 }"#),
            (br#"{"dead_letter":1}"#, b"{}"),
            (br#"{ "dead_letter":[1] }"#, b"{  }"),
            (
                br#"{"a":1,"dead_letter":1,"b":{"dead_letter":2},"dead_letter":3}"#,
                br#"{"a":1,"b":{"dead_letter":2}}"#,
            ),
            (br#"{"a":1}"#, br#"{"a":1}"#),
            (br#"{"dead\u005fletter":1,"a":2}"#, br#"{"a":2}"#),
        ] {
            assert_eq!(s(&remove_member(body, "dead_letter").unwrap()), s(expect));
        }
        assert!(remove_member(b"[1]", "a").is_none());
    }

    #[test]
    fn remove_member_undoes_append() {
        for body in [
            &br#"{"a":1}"#[..],
            br#"  {"a" : [1, 2] ,"b":"}"}  "#,
            b"{}",
            b"{ \n }",
        ] {
            let with = append(body, "dead_letter", b"{}").unwrap();
            assert_eq!(remove_member(&with, "dead_letter").unwrap(), body);
        }
    }
}
