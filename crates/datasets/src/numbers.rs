//! Numbers as GSM8K answers write them: found in text, and normalised so
//! that `1,234`, `$1234` and `1234.00` read alike.

/// Every number in `text`, in order, normalised: an optional minus, digits
/// with optional thousands commas, an optional decimal part.
pub(crate) fn all(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let negative =
            i > 0 && bytes[i - 1] == b'-' && (i < 2 || !bytes[i - 2].is_ascii_alphanumeric());
        let start = i;
        // Digits and commas between digits.
        while i < bytes.len()
            && (bytes[i].is_ascii_digit()
                || (bytes[i] == b',' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)))
        {
            i += 1;
        }
        // A decimal part: a point followed by a digit (a full stop is not).
        if i + 1 < bytes.len() && bytes[i] == b'.' && bytes[i + 1].is_ascii_digit() {
            i += 1;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
        }
        let digits = &text[start..i];
        if let Some(number) = normalise(&format!("{}{digits}", if negative { "-" } else { "" })) {
            out.push(number);
        }
    }
    out
}

/// `text` as a normalised number (`-1,234.50` → `-1234.5`, `7.00` → `7`),
/// or `None` when it is not one. `$` and surrounding spaces are ignored.
pub(crate) fn normalise(text: &str) -> Option<String> {
    let cleaned: String = text
        .trim()
        .trim_end_matches('.')
        .chars()
        .filter(|c| *c != ',' && *c != '$')
        .collect();
    let (negative, body) = match cleaned.strip_prefix('-') {
        Some(body) => (true, body),
        None => (false, cleaned.as_str()),
    };
    let (whole, fraction) = body.split_once('.').unwrap_or((body, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole = whole.trim_start_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    let fraction = fraction.trim_end_matches('0');
    let mut out = String::new();
    if negative && !(whole == "0" && fraction.is_empty()) {
        out.push('-');
    }
    out.push_str(whole);
    if !fraction.is_empty() {
        out.push('.');
        out.push_str(fraction);
    }
    Some(out)
}

/// A number other than `expected` (a wrong answer): one more.
pub(crate) fn another(expected: &str) -> String {
    match expected.parse::<i64>() {
        Ok(n) => n.saturating_add(1).to_string(),
        Err(_) => format!("{expected}1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_found_and_normalised() {
        assert_eq!(
            all("She paid $1,234.00 for 3 items, -5 each. Then 0.50."),
            ["1234", "3", "-5", "0.5"]
        );
        assert_eq!(all("x-3 and 7-2"), ["3", "7", "2"]);
        assert_eq!(normalise(" 042 "), Some("42".into()));
        assert_eq!(normalise("-0.0"), Some("0".into()));
        assert_eq!(normalise("12."), Some("12".into()));
        assert_eq!(normalise("1.2.3"), None);
        assert_eq!(normalise("abc"), None);
        assert_eq!(another("41"), "42");
    }
}
