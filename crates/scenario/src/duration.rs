//! Go-style duration strings (`"2m"`, `"750ms"`, `"1m30s"`, `"1.5s"`) to seconds.
//!
//! The syntax follows Go's `time.ParseDuration`, which the Go nyann-bench
//! uses, so scenario files carry over unchanged: a sequence of decimal numbers
//! (optional fraction), each followed by a unit `ns`, `us` (or `µs`), `ms`,
//! `s`, `m` or `h`. Signs are refused here: every duration in a scenario must
//! be positive.

/// What a valid duration looks like, for error messages.
pub(crate) const DURATION_HELP: &str = "a duration string like \"2m\", \"750ms\", \"1m30s\" or \"1.5s\" (units ns, us, ms, s, m, h), or an integer number of seconds";

/// Parse `text` to seconds. The error says what is wrong with the text.
pub(crate) fn parse_duration(text: &str) -> Result<f64, String> {
    let bad = || format!("invalid duration {text:?}: expected {DURATION_HELP}");
    if text.is_empty() {
        return Err(bad());
    }
    if text.starts_with(['-', '+']) {
        return Err(format!(
            "invalid duration {text:?}: durations must be positive, without a sign"
        ));
    }
    // Go accepts a bare "0"; it then fails our "> 0" rule with a clearer message.
    if text == "0" {
        return Ok(0.0);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_durations_parse_to_seconds() {
        let cases = [
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
            ("0", 0.0),
        ];
        for (text, want) in cases {
            let got = parse_duration(text).unwrap();
            assert!((got - want).abs() < 1e-12, "{text}: got {got}, want {want}");
        }
    }

    #[test]
    fn malformed_durations_are_refused_with_the_expected_form() {
        for text in [
            "", "2", "1.5", "2 m", "2min", "m", "s5", "-1s", "+1s", "1..5s", ".",
        ] {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains("invalid duration"), "{text}: {err}");
        }
        assert!(
            parse_duration("2")
                .unwrap_err()
                .contains("missing unit after \"2\"")
        );
        assert!(
            parse_duration("2min")
                .unwrap_err()
                .contains("unknown unit \"min\"")
        );
        assert!(parse_duration("-1s").unwrap_err().contains("positive"));
    }
}
