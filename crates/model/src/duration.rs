//! The one duration grammar of nyann-bench: every duration flag
//! (`--settle-wait`, `--request-timeout`, ...) and every duration in a
//! scenario (`stage("2m")`, `ttft_p99="750ms"`) is read by [`parse_seconds`].
//!
//! - an integer is a number of seconds: `30`;
//! - otherwise Go's `time.ParseDuration` syntax, which the Go nyann-bench
//!   uses, so scenario files carry over unchanged: decimal numbers (optional
//!   fraction), each followed by a unit `ns`, `us` (or `µs`), `ms`, `s`, `m`
//!   or `h`: `750ms`, `2s`, `1m30s`, `1.5s`.
//!
//! Signs are refused. Zero is a valid duration here (`--settle-wait 0s`
//! turns a wait off); callers that need a positive one say so themselves.

use std::time::Duration;

/// What a valid duration looks like, for error messages.
pub const DURATION_HELP: &str = "a duration like \"750ms\", \"2s\", \"1m30s\" or \"1.5s\" (units ns, us, ms, s, m, h), or an integer number of seconds";

/// Parses `text` to seconds. The error says what is wrong with the text.
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    let bad = || format!("invalid duration {text:?}: expected {DURATION_HELP}");
    if text.is_empty() {
        return Err(bad());
    }
    if text.starts_with(['-', '+']) {
        return Err(format!(
            "invalid duration {text:?}: durations are written without a sign"
        ));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(|n| n as f64)
            .map_err(|_| format!("invalid duration {text:?}: too large"));
    }
    let mut total = 0.0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_len];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(bad());
        }
        let value: f64 = number.parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: missing unit after {number:?} (write e.g. \"{number}s\"); expected {DURATION_HELP}"
                ));
            }
            other => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {other:?}; expected {DURATION_HELP}"
                ));
            }
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() {
        return Err(format!("invalid duration {text:?}: too large"));
    }
    Ok(total)
}

/// [`parse_seconds`] as a [`Duration`]: the `value_parser` of every
/// duration flag.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let seconds = parse_seconds(text)?;
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| format!("invalid duration {text:?}: too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_seconds_and_go_style_strings_parse() {
        let cases = [
            ("30", 30.0),
            ("0", 0.0),
            ("0s", 0.0),
            ("2m", 120.0),
            ("750ms", 0.75),
            ("1m30s", 90.0),
            ("1.5s", 1.5),
            ("1h", 3600.0),
            ("1h2m3s", 3723.0),
            ("250us", 250e-6),
            ("250µs", 250e-6),
            ("100ns", 100e-9),
            (".5s", 0.5),
            ("5.s", 5.0),
        ];
        for (text, want) in cases {
            let got = parse_seconds(text).unwrap();
            assert!((got - want).abs() < 1e-12, "{text}: got {got}, want {want}");
        }
        assert_eq!(parse_duration("750ms"), Ok(Duration::from_millis(750)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    }

    #[test]
    fn malformed_durations_say_what_is_wrong() {
        for text in [
            "", "1.5", "2 m", " 2s", "2min", "m", "s5", "-1s", "+1s", "1..5s", ".", "soon", "1 day",
        ] {
            let err = parse_seconds(text).unwrap_err();
            assert!(err.contains("invalid duration"), "{text}: {err}");
        }
        let missing = parse_seconds("1.5").unwrap_err();
        assert!(missing.contains("missing unit after \"1.5\" (write e.g. \"1.5s\")"));
        let unknown = parse_seconds("2min").unwrap_err();
        assert!(unknown.contains("unknown unit \"min\"") && unknown.contains("\"1m30s\""));
        assert!(parse_seconds("-1s").unwrap_err().contains("without a sign"));
        assert!(
            parse_seconds("99999999999999999999")
                .unwrap_err()
                .contains("too large")
        );
        assert!(
            parse_duration("9999999999999999999999h")
                .unwrap_err()
                .contains("too large")
        );
    }
}
