//! What the fuzz targets of the metric parsers check on one input
//! (`fuzz/fuzz_targets/`, run with cargo-fuzz; see `docs/fuzzing.md`). Each
//! function panics when the parser misbehaves. The targets call them, and
//! `tests/fuzz_corpus.rs` replays each target's committed corpus
//! (`fuzz/corpus/TARGET/`) through them on the stable toolchain. Not an API:
//! hidden from the documentation, free to change with the targets.

use crate::exposition::{self, Sample};
use crate::prometheus::{self, MAX_POINTS_PER_SERIES, QueryError, Series};

/// `exposition`: any bytes (read as lossy UTF-8) as a `/metrics` body.
/// Every line that is not blank or a comment is either a sample or counted
/// as skipped (the first skip explained), and every sample, written back
/// in the canonical quoted form, reads back the same, line by line and as
/// a whole body.
pub fn exposition(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let parsed = exposition::parse(&text);
    let lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(parsed.samples.len() + parsed.skipped_lines, lines);
    assert_eq!(parsed.first_error.is_some(), parsed.skipped_lines > 0);
    let mut canonical = String::new();
    for sample in &parsed.samples {
        let line = quoted_form(sample);
        let back = exposition::parse_line(&line)
            .unwrap_or_else(|e| panic!("{line:?} (from {sample:?}) does not read back: {e}"));
        assert!(same(sample, &back), "{sample:?} read back as {back:?}");
        canonical.push_str(&line);
        canonical.push('\n');
    }
    let again = exposition::parse(&canonical);
    assert_eq!(again.skipped_lines, 0, "{:?}", again.first_error);
    assert_eq!(again.samples.len(), parsed.samples.len());
    for (a, b) in parsed.samples.iter().zip(&again.samples) {
        assert!(same(a, b), "{a:?} read back as {b:?}");
    }
}

/// HTTP statuses the first byte of a `prometheus_response` input picks from.
const STATUSES: [u16; 12] = [200, 200, 200, 200, 204, 299, 400, 422, 429, 502, 503, 302];

/// `prometheus_response`: the first byte picks an HTTP status, the rest is
/// the body of a Prometheus HTTP API answer. The envelope decodes to
/// series only for a 2xx `"status":"success"`, each within the resolution
/// limit; each failure is of the kind its status and body call for; and
/// the series, saved as a `/metrics` text ([`exposition::render`]), read
/// back as the same samples (each series' last point; a series without a
/// name is no sample).
pub fn prometheus_response(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let status = STATUSES[usize::from(pick) % STATUSES.len()];
    let success = (200..300).contains(&status);
    // What the body says its status is, read as leniently as `decode`
    // reads it (the other fields skipped unchecked: strings in them may
    // not even be UTF-8).
    #[derive(serde::Deserialize)]
    struct Said {
        status: String,
    }
    let said = serde_json::from_slice::<Said>(body).ok().map(|s| s.status);
    let said = said.as_deref();
    match prometheus::decode(status, body) {
        Ok(series) => {
            assert!(success, "series from an HTTP {status}");
            assert_eq!(
                said,
                Some("success"),
                "series from a body that says {said:?}"
            );
            for s in &series {
                assert!(s.points.len() <= MAX_POINTS_PER_SERIES);
            }
            saved_series_read_back(&series);
        }
        Err(QueryError::Api { status: s, .. }) => {
            assert_eq!(s, status);
            assert!(
                body.trim_ascii_start().starts_with(b"{"),
                "an API error from a non-object"
            );
            assert!(said.is_some_and(|s| s != "success"), "{body:?}");
        }
        Err(QueryError::Http { status: s, .. }) => {
            assert_eq!(s, status);
            assert!(!success, "an HTTP {status} said to be an HTTP error");
        }
        Err(QueryError::Malformed { .. }) => assert!(success, "HTTP {status} malformed"),
        Err(QueryError::TooManyPoints { points }) => assert!(points > MAX_POINTS_PER_SERIES),
        Err(other) => panic!("decoding answered {other:?}"),
    }
}

/// Series rendered as a `/metrics` text read back as their samples.
fn saved_series_read_back(series: &[Series]) {
    let expected: Vec<Sample> = series
        .iter()
        .filter_map(|s| {
            let name = s.labels.get("__name__").filter(|n| !n.is_empty())?;
            let (_, value) = s.points.last()?;
            Some(Sample {
                name: name.clone(),
                labels: s
                    .labels
                    .iter()
                    .filter(|(k, _)| *k != "__name__")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                value: *value,
            })
        })
        .collect();
    let text = exposition::render(series);
    let parsed = exposition::parse(&text);
    assert_eq!(
        parsed.samples.len(),
        expected.len(),
        "{text:?}: {:?}",
        parsed.first_error
    );
    for (a, b) in expected.iter().zip(&parsed.samples) {
        assert!(same(a, b), "{a:?} saved as {text:?}, read back as {b:?}");
    }
}

/// `{"name","label"="value",...} value`: the form that holds any name.
fn quoted_form(sample: &Sample) -> String {
    let mut line = format!("{{\"{}\"", escape(&sample.name));
    for (k, v) in &sample.labels {
        line.push_str(&format!(",\"{}\"=\"{}\"", escape(k), escape(v)));
    }
    line.push_str(&format!("}} {:?}", sample.value));
    line
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn same(a: &Sample, b: &Sample) -> bool {
    a.name == b.name
        && a.labels == b.labels
        && (a.value == b.value || (a.value.is_nan() && b.value.is_nan()))
}
