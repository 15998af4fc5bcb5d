//! A small, lenient parser for the Prometheus text exposition format (and the
//! OpenMetrics text format that servers send when asked for it).
//!
//! Only samples matter here (name, labels, value): `# HELP`/`# TYPE` lines,
//! timestamps and OpenMetrics exemplars are read past. A malformed line is
//! skipped and counted rather than failing the whole scrape, because one odd
//! line from a newer server must not blind the congestion check. Written by
//! hand because `prometheus-parse` 0.2 matches metric names with `\w+` (so
//! none of vLLM's `vllm:*` names) and splits label values on `,` and `=`,
//! and the OpenMetrics parsers pull in a grammar engine for a small need; it
//! is fuzz-tested (tests/parser_fuzz.rs, and the `exposition` target of
//! `fuzz/`, docs/fuzzing.md).

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    /// Label pairs in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The result of parsing one exposition body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    pub samples: Vec<Sample>,
    /// Lines that could not be parsed (skipped).
    pub skipped_lines: usize,
    /// The first parse problem, `line N: what`, for the logs.
    pub first_error: Option<String>,
}

/// Prometheus query results as an exposition body (one sample line per
/// series: its name, its other labels escaped, its last value), so that a
/// series read from Prometheus is saved as `/metrics` would have shown it.
/// A metric or label name beyond the classic characters (Prometheus 3
/// allows any UTF-8) is written quoted, in the UTF-8 form
/// (`{"my.metric","my-label"="v"} 1`), so that [`parse`] reads it back.
pub fn render(series: &[crate::prometheus::Series]) -> String {
    let mut out = String::new();
    for s in series {
        let Some((_, value)) = s.points.last() else {
            continue;
        };
        let name = s.labels.get("__name__").map_or("", String::as_str);
        let labels = s.labels.iter().filter(|(k, _)| *k != "__name__");
        let mut parts: Vec<String> = Vec::new();
        let classic = is_metric_name(name);
        if !classic {
            parts.push(format!("\"{}\"", escape(name)));
        }
        for (k, v) in labels {
            let v = escape(v);
            parts.push(if is_label_name(k) {
                format!("{k}=\"{v}\"")
            } else {
                format!("\"{}\"=\"{v}\"", escape(k))
            });
        }
        let name = if classic { name } else { "" };
        out.push_str(&format!("{name}{{{}}} {value}\n", parts.join(",")));
    }
    out
}

/// A label value (or quoted name) with `\`, `"` and line feeds escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`: a name written without quotes.
fn is_metric_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`: a label name written without quotes.
fn is_label_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Parses a text exposition body. Never fails: bad lines are skipped and
/// reported in [`Parsed::skipped_lines`] / [`Parsed::first_error`].
pub fn parse(text: &str) -> Parsed {
    let mut out = Parsed::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Ok(sample) => out.samples.push(sample),
            Err(what) => {
                out.skipped_lines += 1;
                if out.first_error.is_none() {
                    out.first_error = Some(format!("line {}: {what}", i + 1));
                }
            }
        }
    }
    out
}

/// Parses one sample line: `name{l="v",...} value [timestamp] [# exemplar]`,
/// or the UTF-8 form `{"name",l="v"} value`.
pub fn parse_line(line: &str) -> Result<Sample, String> {
    let mut cur = Cursor { s: line, pos: 0 };
    let mut name = String::new();
    if cur.peek() != Some('{') {
        name = cur.take_while(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err("expected a metric name".into());
        }
    }
    let mut labels = Vec::new();
    if cur.peek() == Some('{') {
        cur.bump();
        loop {
            cur.skip_ws();
            match cur.peek() {
                Some('}') => {
                    cur.bump();
                    break;
                }
                None => return Err("unterminated label set".into()),
                _ => {}
            }
            let key = if cur.peek() == Some('"') {
                cur.quoted()?
            } else {
                let k = cur.take_while(|c| c.is_ascii_alphanumeric() || c == '_');
                if k.is_empty() {
                    return Err("expected a label name".into());
                }
                k
            };
            cur.skip_ws();
            if cur.peek() == Some('=') {
                cur.bump();
                cur.skip_ws();
                let value = cur.quoted()?;
                labels.push((key, value));
            } else if name.is_empty() {
                // UTF-8 form: a bare quoted string is the metric name.
                name = key;
            } else {
                return Err("expected '=' after a label name".into());
            }
            cur.skip_ws();
            match cur.peek() {
                Some(',') => cur.bump(),
                Some('}') => {}
                _ => return Err("expected ',' or '}' in a label set".into()),
            }
        }
    }
    if name.is_empty() {
        return Err("missing metric name".into());
    }
    if !cur.peek().is_some_and(|c| c == ' ' || c == '\t') {
        return Err("expected whitespace before the value".into());
    }
    cur.skip_ws();
    let value_text = cur.take_while(|c| !c.is_whitespace());
    let value = parse_value(&value_text).ok_or_else(|| format!("bad value {value_text:?}"))?;
    // The rest is an optional timestamp and an optional exemplar: ignored.
    Ok(Sample {
        name,
        labels,
        value,
    })
}

/// Go's `ParseFloat` accepts what Rust's does for the exposition format
/// (`NaN`, `+Inf`, `-Inf`, exponents), case-insensitively.
fn parse_value(s: &str) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    s.parse::<f64>().ok()
}

struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn bump(&mut self) {
        if let Some(c) = self.peek() {
            self.pos += c.len_utf8();
        }
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|c| c == ' ' || c == '\t') {
            self.bump();
        }
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> String {
        let start = self.pos;
        while self.peek().is_some_and(&f) {
            self.bump();
        }
        self.s[start..self.pos].to_string()
    }

    /// A double-quoted string with `\\`, `\"` and `\n` escapes.
    fn quoted(&mut self) -> Result<String, String> {
        if self.peek() != Some('"') {
            return Err("expected '\"'".into());
        }
        self.bump();
        let mut out = String::new();
        loop {
            match self.peek() {
                None => return Err("unterminated string".into()),
                Some('"') => {
                    self.bump();
                    return Ok(out);
                }
                Some('\\') => {
                    self.bump();
                    match self.peek() {
                        Some('n') => out.push('\n'),
                        Some('\\') => out.push('\\'),
                        Some('"') => out.push('"'),
                        Some(c) => {
                            // Unknown escape: keep it verbatim, as Prometheus does.
                            out.push('\\');
                            out.push(c);
                        }
                        None => return Err("unterminated escape".into()),
                    }
                    self.bump();
                }
                Some(c) => {
                    out.push(c);
                    self.bump();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_series_parse_back() {
        let series = crate::prometheus::Series {
            labels: [
                ("__name__", "vllm:cache_config_info"),
                ("num_gpu_blocks", "64"),
                ("odd", "a \"b\" \\ c\nd"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            points: vec![(1.0, 1.0)],
        };
        let parsed = parse(&render(&[series]));
        assert_eq!(parsed.skipped_lines, 0);
        let sample = &parsed.samples[0];
        assert_eq!(sample.name, "vllm:cache_config_info");
        assert_eq!(sample.label("num_gpu_blocks"), Some("64"));
        assert_eq!(sample.label("odd"), Some("a \"b\" \\ c\nd"));
        assert_eq!(sample.value, 1.0);
    }

    /// Found by the `prometheus_response` fuzz target: a label name
    /// Prometheus 3 allows (`nu-m`) was written bare, and the whole line
    /// read back as a skipped one, every other label lost with it.
    #[test]
    fn rendered_series_with_any_names_parse_back() {
        let series = |labels: &[(&str, &str)]| crate::prometheus::Series {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            points: vec![(1.0, 2.5)],
        };
        let text = render(&[
            series(&[("__name__", "vllm:x"), ("nu-m", "1"), ("k", "v")]),
            series(&[("__name__", "my.metric"), ("0b", "\"q\"\n"), ("é", "")]),
            series(&[("__name__", "9lives")]),
        ]);
        assert_eq!(
            text,
            "vllm:x{k=\"v\",\"nu-m\"=\"1\"} 2.5\n\
             {\"my.metric\",\"0b\"=\"\\\"q\\\"\\n\",\"é\"=\"\"} 2.5\n\
             {\"9lives\"} 2.5\n"
        );
        let parsed = parse(&text);
        assert_eq!(parsed.skipped_lines, 0, "{:?}", parsed.first_error);
        let [x, my, nine] = &parsed.samples[..] else {
            panic!("{:?}", parsed.samples)
        };
        assert_eq!(
            (x.name.as_str(), x.label("nu-m"), x.label("k")),
            ("vllm:x", Some("1"), Some("v"))
        );
        assert_eq!(
            (my.name.as_str(), my.label("0b"), my.label("é")),
            ("my.metric", Some("\"q\"\n"), Some(""))
        );
        assert_eq!((nine.name.as_str(), nine.value), ("9lives", 2.5));
    }

    #[test]
    fn parses_labels_values_and_specials() {
        let p = parse(
            "# HELP x doc\n# TYPE x gauge\n\
             vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
             up 1\n\
             h_bucket{le=\"+Inf\"} 7 1700000000000\n\
             g{a=\"x,}y\",b=\"q\\\"\\\\\\n\",} NaN\n\
             n -Inf # {trace_id=\"1\"} 1\n\
             {\"my.metric\",le=\"0.5\"} 2e3\n",
        );
        assert_eq!(p.skipped_lines, 0, "{:?}", p.first_error);
        assert_eq!(p.samples.len(), 6);
        assert_eq!(p.samples[0].name, "vllm:num_requests_waiting");
        assert_eq!(p.samples[0].label("model_name"), Some("m"));
        assert_eq!(p.samples[0].value, 3.0);
        assert_eq!(p.samples[2].label("le"), Some("+Inf"));
        assert_eq!(p.samples[2].value, 7.0);
        assert_eq!(p.samples[3].label("a"), Some("x,}y"));
        assert_eq!(p.samples[3].label("b"), Some("q\"\\\n"));
        assert!(p.samples[3].value.is_nan());
        assert_eq!(p.samples[4].value, f64::NEG_INFINITY);
        assert_eq!(p.samples[5].name, "my.metric");
        assert_eq!(p.samples[5].value, 2000.0);
    }

    #[test]
    fn bad_lines_are_skipped_and_reported() {
        let p = parse("ok 1\nbad{ 2\nnovalue\n9bad 1\nx{a=\"1\"}3\nok 2\n");
        assert_eq!(p.samples.len(), 2);
        assert_eq!(p.skipped_lines, 4);
        assert_eq!(
            p.first_error.as_deref(),
            Some("line 2: expected '=' after a label name")
        );
    }

    #[test]
    fn both_fixtures_parse_completely() {
        for (file, waiting) in [
            ("vllm-0.32-metrics-idle.txt", 0.0),
            ("vllm-0.32-metrics-loaded.txt", 50.0),
        ] {
            let path = format!("{}/tests/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            let p = parse(&text);
            let lines = text
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .count();
            assert_eq!(p.skipped_lines, 0, "{file}: {:?}", p.first_error);
            assert_eq!(p.samples.len(), lines, "{file}");
            let w = p
                .samples
                .iter()
                .find(|s| s.name == "vllm:num_requests_waiting")
                .map(|s| s.value);
            assert_eq!(w, Some(waiting), "{file}");
            let buckets = p
                .samples
                .iter()
                .filter(|s| s.name == "vllm:time_to_first_token_seconds_bucket")
                .count();
            assert_eq!(buckets, 23, "{file}: 22 bounds + +Inf");
        }
    }
}
