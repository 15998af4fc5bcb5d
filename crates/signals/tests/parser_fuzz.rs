//! Property tests of the exposition parser: it never panics on any input
//! (random text, mutated real vLLM output), and every sample it is given in
//! canonical form comes back exactly (names, escaped label values, special
//! float values). Case count: PROPTEST_CASES (default 256); a long fuzz run is
//! `PROPTEST_CASES=2000000 cargo test --release -p nyann-signals --test parser_fuzz`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use nyann_signals::exposition::{Sample, parse, parse_line};
use proptest::prelude::*;

const FIXTURE: &str = include_str!("fixtures/vllm-0.32-metrics-loaded.txt");
static FIXTURE_SAMPLES: std::sync::LazyLock<usize> =
    std::sync::LazyLock::new(|| parse(FIXTURE).samples.len());

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn render(s: &Sample) -> String {
    let labels: Vec<String> = s
        .labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    let value = if s.value.is_nan() {
        "NaN".to_string()
    } else if s.value == f64::INFINITY {
        "+Inf".to_string()
    } else if s.value == f64::NEG_INFINITY {
        "-Inf".to_string()
    } else {
        format!("{:?}", s.value)
    };
    if labels.is_empty() {
        format!("{} {value}", s.name)
    } else {
        format!("{}{{{}}} {value}", s.name, labels.join(","))
    }
}

fn sample() -> impl Strategy<Value = Sample> {
    (
        "[a-zA-Z_:][a-zA-Z0-9_:]{0,30}",
        prop::collection::vec(("[a-zA-Z_][a-zA-Z0-9_]{0,12}", any::<String>()), 0..5),
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            (-1e6f64..1e6),
        ],
    )
        .prop_map(|(name, labels, value)| Sample {
            name,
            labels,
            value,
        })
}

fn same(a: &Sample, b: &Sample) -> bool {
    a.name == b.name
        && a.labels == b.labels
        && (a.value == b.value || (a.value.is_nan() && b.value.is_nan()))
}

proptest! {
    #[test]
    fn never_panics_on_any_text(text in any::<String>()) {
        let p = parse(&text);
        let lines = text.lines().filter(|l| !l.trim().is_empty() && !l.trim().starts_with('#')).count();
        prop_assert_eq!(p.samples.len() + p.skipped_lines, lines);
    }

    #[test]
    fn never_panics_on_exposition_like_text(text in r#"[a-z_:{}="\\, \n#0-9.+eInfaN-]{0,200}"#) {
        let _ = parse(&text);
    }

    #[test]
    fn mutated_fixture_never_panics(pos in 0usize..FIXTURE.len(), len in 0usize..64, junk in any::<String>()) {
        let mut bytes = FIXTURE.as_bytes().to_vec();
        let end = (pos + len).min(bytes.len());
        bytes.splice(pos..end, junk.bytes());
        let text = String::from_utf8_lossy(&bytes);
        let p = parse(&text);
        // A 64-byte splice touches a few lines; every other sample survives.
        let whole = *FIXTURE_SAMPLES;
        prop_assert!(p.samples.len() + 10 >= whole, "{} of {whole} samples", p.samples.len());
    }

    #[test]
    fn canonical_samples_round_trip(samples in prop::collection::vec(sample(), 1..20)) {
        let text: String = samples.iter().map(|s| render(s) + "\n").collect();
        let p = parse(&text);
        prop_assert_eq!(p.skipped_lines, 0, "{:?}\n{}", p.first_error, text);
        prop_assert_eq!(p.samples.len(), samples.len());
        for (a, b) in samples.iter().zip(&p.samples) {
            prop_assert!(same(a, b), "{:?} != {:?}", a, b);
        }
    }

    #[test]
    fn timestamps_and_exemplars_are_ignored(s in sample(), ts in any::<i64>()) {
        let line = format!("{} {ts} # {{trace_id=\"x\"}} 1.0", render(&s));
        let parsed = parse_line(&line).unwrap();
        prop_assert!(same(&s, &parsed));
    }
}
