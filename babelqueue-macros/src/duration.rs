//! Duration literals (`"500ms"`, `"30s"`, `"15m"`, `"24h"`, `"7d"`, `"1h30m"`), parsed at
//! compile time.

use std::time::Duration;

/// The units, for error messages.
pub const UNITS: &str = "`ms`, `s`, `m`, `h`, `d`";

/// Parses a duration: one or more `<digits><unit>` parts, largest unit first, each unit
/// at most once, no spaces. The total must be at least one millisecond.
pub fn parse(text: &str) -> Result<Duration, String> {
    if text.is_empty() {
        return Err("it is empty".into());
    }
    if text.trim() != text || text.contains(char::is_whitespace) {
        return Err("it contains a space".into());
    }
    let mut total_ms: u64 = 0;
    let mut rest = text;
    let mut last_rank = usize::MAX;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("`{rest}` does not start with a number"));
        }
        let (number, after) = rest.split_at(digits);
        if after.starts_with(['.', ',']) {
            return Err("fractions are not supported (write `1h30m`, not `1.5h`)".into());
        }
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        let (rank, ms_per_unit) = match unit {
            "d" => (4, 86_400_000),
            "h" => (3, 3_600_000),
            "m" => (2, 60_000),
            "s" => (1, 1_000),
            "ms" => (0, 1),
            "" => return Err(format!("`{number}` has no unit")),
            other => return Err(format!("`{other}` is not a unit")),
        };
        if rank >= last_rank {
            return Err(format!(
                "`{unit}` comes after a smaller or equal unit; write the largest unit first, once"
            ));
        }
        last_rank = rank;
        let n: u64 = number
            .parse()
            .map_err(|_| format!("`{number}` is too large"))?;
        total_ms = n
            .checked_mul(ms_per_unit)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(|| "it is too large".to_owned())?;
        rest = after;
    }
    if total_ms == 0 {
        return Err("it is zero, which would forget every id at once".into());
    }
    Ok(Duration::from_millis(total_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted() {
        let cases = [
            ("500ms", 500),
            ("30s", 30_000),
            ("15m", 900_000),
            ("24h", 86_400_000),
            ("7d", 604_800_000),
            ("1h30m", 5_400_000),
            ("1d2h3m4s5ms", 93_784_005),
        ];
        for (text, ms) in cases {
            assert_eq!(parse(text), Ok(Duration::from_millis(ms)), "{text}");
        }
    }

    #[test]
    fn rejected() {
        for text in [
            "",
            "24",
            "h",
            "24 h",
            " 1h",
            "1hour",
            "1.5h",
            "30m1h",
            "1h1h",
            "0s",
            "-1s",
            "1y",
            "99999999999999999999d",
        ] {
            assert!(parse(text).is_err(), "{text:?} accepted");
        }
    }
}
