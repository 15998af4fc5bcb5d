//! Checks `until_congested(...)` parameters against a policy's `describe()`
//! (generic, before the policy's own `validate`): unknown names, duplicates,
//! missing required ones, wrong kinds; fills defaults and turns durations
//! into seconds, so policies only ever see numbers for durations.

use nyann_model::observation::{ParamKind, ParamSpec, PolicyInfo};
use nyann_model::scenario::{Param, Value};

/// The parameters as the policy will receive them, in `describe()` order,
/// or one message saying what is wrong (without location: the caller adds it).
pub fn check(info: &PolicyInfo, given: &[Param]) -> Result<Vec<Param>, String> {
    for (i, p) in given.iter().enumerate() {
        if given[..i].iter().any(|q| q.name == p.name) {
            return Err(format!("parameter `{}` is given twice", p.name));
        }
        if !info.params.iter().any(|s| s.name == p.name) {
            return Err(format!(
                "unknown parameter `{}`; {} accepts {}",
                p.name,
                info.name,
                known(info)
            ));
        }
    }
    let mut out = Vec::with_capacity(info.params.len());
    // Every missing required parameter is said at once: one run to fix them.
    let mut missing = Vec::new();
    for spec in &info.params {
        let value = match given.iter().find(|p| p.name == spec.name) {
            Some(p) => convert(spec, &p.value)?,
            None => match &spec.default {
                Some(default) => convert(spec, default)
                    .map_err(|e| format!("the policy's default is invalid: {e}"))?,
                None if spec.required => {
                    missing.push(format!("`{}` ({})", spec.name, kind_help(spec.kind)));
                    continue;
                }
                // Optional without default: the policy handles its absence.
                None => continue,
            },
        };
        out.push(Param {
            name: spec.name.clone(),
            value,
        });
    }
    match missing.len() {
        0 => Ok(out),
        1 => Err(format!("missing required parameter {}", missing[0])),
        _ => Err(format!(
            "missing required parameters {}",
            missing.join(", ")
        )),
    }
}

/// The given parameter a message is about, so that the error can point at
/// its keyword: the first one named in backticks, else the one whose name
/// appears first as a word (policies' own `validate` messages usually start
/// with it: "ttft_p99 must be > 0"). `None`: the message is about the call.
pub fn offending<'a>(given: &'a [Param], message: &str) -> Option<&'a str> {
    let is_given = |name: &str| given.iter().find(|p| p.name == name);
    if let Some(p) = message.split('`').skip(1).step_by(2).find_map(is_given) {
        return Some(&p.name);
    }
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    given
        .iter()
        .filter_map(|p| {
            message
                .match_indices(p.name.as_str())
                .find(|(at, _)| {
                    let before = message[..*at].chars().next_back();
                    let after = message[at + p.name.len()..].chars().next();
                    !before.is_some_and(ident) && !after.is_some_and(ident)
                })
                .map(|(at, _)| (at, p.name.as_str()))
        })
        .min()
        .map(|(_, name)| name)
}

/// Check and convert one value to what the policy receives.
pub(crate) fn convert(spec: &ParamSpec, value: &Value) -> Result<Value, String> {
    let name = &spec.name;
    let wrong = || {
        format!(
            "parameter `{name}` must be {}, got {}",
            kind_help(spec.kind),
            show(value)
        )
    };
    match (spec.kind, value) {
        (ParamKind::Number, Value::Number(n)) if n.is_finite() => Ok(Value::Number(*n)),
        (ParamKind::Number, Value::Integer(i)) => Ok(Value::Number(*i as f64)),
        (ParamKind::Integer, Value::Integer(i)) => Ok(Value::Integer(*i)),
        // Whole numbers only, within the range an f64 holds exactly.
        (ParamKind::Integer, Value::Number(n))
            if n.fract() == 0.0 && n.abs() <= 9_007_199_254_740_992.0 =>
        {
            Ok(Value::Integer(*n as i64))
        }
        (ParamKind::Fraction, Value::Number(n)) if (0.0..=1.0).contains(n) => Ok(Value::Number(*n)),
        (ParamKind::Duration, Value::Number(n)) if n.is_finite() && *n >= 0.0 => {
            Ok(Value::Number(*n))
        }
        (ParamKind::Duration, Value::Text(t)) => nyann_model::parse_seconds(t)
            .map(Value::Number)
            .map_err(|e| format!("{}: {e}", wrong())),
        (ParamKind::Text, Value::Text(t)) => Ok(Value::Text(t.clone())),
        (ParamKind::Flag, Value::Flag(b)) => Ok(Value::Flag(*b)),
        _ => Err(wrong()),
    }
}

/// What a kind accepts, for messages.
pub fn kind_help(kind: ParamKind) -> &'static str {
    match kind {
        ParamKind::Number => "a number",
        ParamKind::Integer => "a whole number",
        ParamKind::Fraction => "a fraction between 0 and 1",
        ParamKind::Duration => {
            "a duration such as \"750ms\", \"2s\", \"1m30s\" or a number of seconds"
        }
        ParamKind::Text => "a string",
        ParamKind::Flag => "True or False",
    }
}

fn known(info: &PolicyInfo) -> String {
    if info.params.is_empty() {
        return "no parameters".to_string();
    }
    info.params
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn show(value: &Value) -> String {
    match value {
        Value::Number(n) => format!("{n}"),
        Value::Integer(i) => format!("{i}"),
        Value::Text(t) => format!("{t:?}"),
        Value::Flag(b) => if *b { "True" } else { "False" }.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, kind: ParamKind, required: bool, default: Option<Value>) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            kind,
            required,
            default,
            doc: String::new(),
        }
    }

    fn info() -> PolicyInfo {
        PolicyInfo {
            name: "builtin".into(),
            version: "1".into(),
            summary: String::new(),
            server_signals: true,
            params: vec![
                spec("waiting_requests_p50", ParamKind::Number, true, None),
                spec("ttft_p99", ParamKind::Duration, true, None),
                spec(
                    "kv_cache_usage",
                    ParamKind::Fraction,
                    false,
                    Some(Value::Number(0.95)),
                ),
                spec(
                    "preemptions",
                    ParamKind::Number,
                    false,
                    Some(Value::Number(1.0)),
                ),
                spec("label", ParamKind::Text, false, None),
                spec("strict", ParamKind::Flag, false, Some(Value::Flag(false))),
                spec("window", ParamKind::Integer, false, Some(Value::Integer(3))),
            ],
        }
    }

    fn p(name: &str, value: Value) -> Param {
        Param {
            name: name.into(),
            value,
        }
    }

    #[test]
    fn fills_defaults_and_converts_durations() {
        let out = check(
            &info(),
            &[
                p("ttft_p99", Value::Text("750ms".into())),
                p("waiting_requests_p50", Value::Number(32.0)),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            vec![
                p("waiting_requests_p50", Value::Number(32.0)),
                p("ttft_p99", Value::Number(0.75)),
                p("kv_cache_usage", Value::Number(0.95)),
                p("preemptions", Value::Number(1.0)),
                p("strict", Value::Flag(false)),
                p("window", Value::Integer(3)),
            ]
        );
    }

    #[test]
    fn messages_name_the_offending_parameter() {
        let given = [
            p("ttft_p99", Value::Number(0.0)),
            p("kv_usage", Value::Number(1.0)),
            p("p", Value::Number(1.0)),
        ];
        let unknown = "unknown parameter `kv_usage`; builtin accepts ttft_p99, p";
        assert_eq!(offending(&given, unknown), Some("kv_usage"));
        assert_eq!(
            offending(&given, "ttft_p99 must be > 0 (got 0)"),
            Some("ttft_p99")
        );
        // `p` inside other words is not `p`.
        assert_eq!(
            offending(&given, "the kv_usage is too high"),
            Some("kv_usage")
        );
        assert_eq!(
            offending(&given, "missing required parameter `other`"),
            None
        );
        assert_eq!(offending(&given, "parameters disagree"), None);
    }

    #[test]
    fn integers_are_whole_numbers() {
        let base = |window: Value| {
            vec![
                p("waiting_requests_p50", Value::Number(1.0)),
                p("ttft_p99", Value::Text("2s".into())),
                p("window", window),
            ]
        };
        let out = check(&info(), &base(Value::Number(5.0))).unwrap();
        assert_eq!(out.last(), Some(&p("window", Value::Integer(5))));
        assert_eq!(
            check(&info(), &base(Value::Number(2.5))).unwrap_err(),
            "parameter `window` must be a whole number, got 2.5"
        );
        assert!(check(&info(), &base(Value::Number(1e300))).is_err());
        assert!(check(&info(), &base(Value::Text("3".into()))).is_err());
    }

    #[test]
    fn durations_accept_the_documented_forms() {
        let ttft = |text: &str| {
            check(
                &info(),
                &[
                    p("waiting_requests_p50", Value::Number(1.0)),
                    p("ttft_p99", Value::Text(text.into())),
                ],
            )
            .map(|params| params[1].clone())
        };
        assert_eq!(ttft("1m30s"), Ok(p("ttft_p99", Value::Number(90.0))));
        assert_eq!(ttft("90"), Ok(p("ttft_p99", Value::Number(90.0))));
        assert!(ttft("soon").unwrap_err().contains("\"750ms\""));
        let out = check(
            &info(),
            &[
                p("waiting_requests_p50", Value::Number(1.0)),
                p("ttft_p99", Value::Number(2.0)),
            ],
        );
        assert_eq!(out.unwrap()[1], p("ttft_p99", Value::Number(2.0)));
    }

    #[test]
    fn refuses_unknown_duplicate_missing_and_wrong_kinds() {
        let base = || {
            vec![
                p("waiting_requests_p50", Value::Number(1.0)),
                p("ttft_p99", Value::Text("2s".into())),
            ]
        };
        let mut unknown = base();
        unknown.push(p("kv_usage", Value::Number(0.9)));
        let e = check(&info(), &unknown).unwrap_err();
        assert!(
            e.starts_with(
                "unknown parameter `kv_usage`; builtin accepts waiting_requests_p50, ttft_p99"
            ),
            "{e}"
        );

        let mut twice = base();
        twice.push(p("ttft_p99", Value::Text("3s".into())));
        assert_eq!(
            check(&info(), &twice).unwrap_err(),
            "parameter `ttft_p99` is given twice"
        );

        let e = check(&info(), &base()[..1]).unwrap_err();
        assert!(
            e.starts_with("missing required parameter `ttft_p99`"),
            "{e}"
        );
        // Both missing: said together, not one per run.
        let e = check(&info(), &[]).unwrap_err();
        assert_eq!(
            e,
            "missing required parameters `waiting_requests_p50` (a number), `ttft_p99` (a \
             duration such as \"750ms\", \"2s\", \"1m30s\" or a number of seconds)"
        );

        let mut kind = base();
        kind.push(p("kv_cache_usage", Value::Number(95.0)));
        assert_eq!(
            check(&info(), &kind).unwrap_err(),
            "parameter `kv_cache_usage` must be a fraction between 0 and 1, got 95"
        );

        let mut text = base();
        text[0] = p("waiting_requests_p50", Value::Text("32".into()));
        assert!(
            check(&info(), &text)
                .unwrap_err()
                .contains("must be a number, got \"32\"")
        );

        let mut flag = base();
        flag.push(p("strict", Value::Number(1.0)));
        assert!(
            check(&info(), &flag)
                .unwrap_err()
                .contains("must be True or False")
        );

        let mut nan = base();
        nan[0] = p("waiting_requests_p50", Value::Number(f64::NAN));
        assert!(check(&info(), &nan).is_err());
    }
}
