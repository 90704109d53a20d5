//! The canonical JSON text of one field value, as the family's Python SDK writes it before
//! encrypting: `json.dumps(value, sort_keys=True, separators=(",", ":"))`.

use std::fmt::Write as _;

use serde_json::{Number, Value};

/// The canonical JSON text of `value`: object keys sorted (by code point), no whitespace,
/// every character outside printable ASCII written as a `\uXXXX` escape (lower-case hex,
/// UTF-16 surrogate pairs beyond the BMP), and numbers as Python writes them (an integer
/// as its digits, a float as Python's `repr`: `1.0`, `1e+16`, `1e-05`).
///
/// These are the bytes [`protect`](super::protect) hands to [`Cipher::encrypt`](super::Cipher::encrypt),
/// the same bytes the Python SDK encrypts for the same value. The reader of a protected
/// field only needs them to be JSON; they are kept identical anyway, so two SDKs sealing
/// the same value seal the same plaintext.
///
/// An integer beyond 64 bits is read by `serde_json` as a float, so it is written as
/// Python writes that float (`1.2345678901234568e+22`), where Python, keeping the integer,
/// writes all its digits.
///
/// ```
/// use babelqueue_core::gdpr::canonical_json;
/// use serde_json::json;
///
/// let value = json!({"name": "Zoë", "n": [1, 2.0, 1e16], "a": null});
/// assert_eq!(
///     canonical_json(&value),
///     r#"{"a":null,"n":[1,2.0,1e+16],"name":"Zo\u00eb"}"#
/// );
/// ```
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            // `String`'s order is its UTF-8 bytes', which is the code points' order:
            // Python's order of `str` keys.
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_value(item, out);
            }
            out.push('}');
        }
    }
}

fn write_number(n: &Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        write_python_float(f, out);
    } else {
        // Not reached without serde_json's `arbitrary_precision`; its text is then the
        // number as it was read.
        out.push_str(&n.to_string());
    }
}

/// Python's `repr` of a float: the shortest digits that read back to it, in positional
/// notation when the decimal exponent is in `-4..16`, else as `d.ddde±XX`.
pub(crate) fn write_python_float(f: f64, out: &mut String) {
    if f.is_nan() {
        out.push_str("NaN");
        return;
    }
    if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
        return;
    }
    // Rust's `{:e}` is the shortest round-trip digits too: `-1.2345e-7`, `1e16`, `0e0`.
    let sci = format!("{f:e}");
    let (negative, sci) = match sci.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, sci.as_str()),
    };
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // Where the decimal point falls after `digits[0]`'s position: 1 for `d.ddd e0`.
    let decpt = exp + 1;
    if negative {
        out.push('-');
    }
    let len = digits.len() as i32;
    if decpt <= -4 || decpt > 16 {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let e = decpt - 1;
        let _ = write!(out, "e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    } else if decpt <= 0 {
        out.push_str("0.");
        for _ in 0..-decpt {
            out.push('0');
        }
        out.push_str(&digits);
    } else if decpt < len {
        let (int, frac) = digits.split_at(decpt as usize);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    } else {
        out.push_str(&digits);
        for _ in 0..decpt - len {
            out.push('0');
        }
        out.push_str(".0");
    }
}

/// A JSON string as Python's `json.dumps` writes it with `ensure_ascii=True`.
fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each float with Python's `repr` of it (`python3 -c 'print(repr(x))'`).
    #[test]
    fn floats_are_written_as_python_writes_them() {
        let cases: &[(f64, &str)] = &[
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (2.5, "2.5"),
            (100.0, "100.0"),
            (1e22, "1e+22"),
            (0.000123, "0.000123"),
            (12345.678, "12345.678"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-1e-7, "-1e-07"),
            (1e21, "1e+21"),
            (9007199254740993.0, "9007199254740992.0"),
        ];
        for (f, want) in cases {
            let mut out = String::new();
            write_python_float(*f, &mut out);
            assert_eq!(&out, want, "{f:e}");
        }
    }

    #[test]
    fn strings_are_ascii_with_python_escapes() {
        let v = serde_json::json!({"b": "é\u{7f}\u{1}\n\t\"\\/😀\u{2028}", "a": [1, true, null]});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":[1,true,null],"b":"\u00e9\u007f\u0001\n\t\"\\/\ud83d\ude00\u2028"}"#
        );
    }
}
