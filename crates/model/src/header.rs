//! The one grammar of an HTTP header given on the command line:
//! `Name: value` (the first colon splits; both sides trimmed).

/// `Name: value` as `(name, value)`; `None` without a colon or a name.
pub fn parse_header(text: &str) -> Option<(String, String)> {
    let (name, value) = text.split_once(':')?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    Some((name.to_string(), value.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_colon_splits_and_both_sides_are_trimmed() {
        assert_eq!(
            parse_header(" X-Scope-OrgID : a:b "),
            Some(("X-Scope-OrgID".into(), "a:b".into()))
        );
        assert_eq!(
            parse_header("X-Empty:"),
            Some(("X-Empty".into(), String::new()))
        );
        assert_eq!(parse_header("nocolon"), None);
        assert_eq!(parse_header(" : value"), None);
    }
}
