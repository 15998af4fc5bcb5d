//! The HTML report, opened in a real headless browser: a sweep against the
//! simulator writes it, every chart renders, nothing is logged as an error,
//! the stop reason is on the page; `report` overlays two runs.

use std::path::Path;

use serde_json::Value;

use crate::browser::Browser;
use crate::support::{
    generate, nyann_bench, scrape_flags, serial, simulator, sweep, validate_against_schema,
};

/// What the browser measured of the charts: per SVG, its rendered area and
/// how many drawn shapes it holds.
const CHARTS: &str = "Array.from(document.querySelectorAll('figure svg')).map(svg => { \
    const box = svg.getBBox(); \
    const shapes = Array.from(svg.querySelectorAll('polyline, path, polygon, circle, line, rect')) \
        .filter(s => { const b = s.getBBox(); return b.width > 0 || b.height > 0; }).length; \
    return [svg.querySelector('text') ? svg.querySelector('text').textContent : '', box.width * box.height, shapes]; })";

fn charts(browser: &mut Browser) -> Vec<(String, f64, u64)> {
    let Value::Array(charts) = browser.evaluate(CHARTS) else {
        panic!("no chart list")
    };
    charts
        .iter()
        .map(|c| {
            (
                c[0].as_str().unwrap_or("").to_string(),
                c[1].as_f64().unwrap_or(0.0),
                c[2].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn page_text(browser: &mut Browser) -> String {
    browser
        .evaluate("document.body.innerText")
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_report_renders_in_a_browser_and_runs_overlay() {
    let _serial = serial().await;
    let temp = tempfile::tempdir().unwrap();
    // Named like the run it holds: the report's title is the directory's
    // name (and this page is the README's picture).
    let dir = temp.path().join("demo");
    let out = nyann_bench()
        .args(["demo", "-q", "--output-dir"])
        .arg(&dir)
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = dir.as_path().join("report.html");
    let size = std::fs::metadata(&report).unwrap().len();
    assert!(size < 512 * 1024, "report.html is {size} bytes");
    for saved in ["scenario.json", "scenario.star"] {
        assert!(dir.as_path().join(saved).exists(), "{saved} not saved");
    }
    validate_against_schema(dir.as_path());

    let mut browser = Browser::launch();
    browser.open(&report);
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
    let charts = charts(&mut browser);
    // 2 throughput, 3 latency, 4 server signals, 2 timeline charts (no
    // errors chart: the demo has none).
    assert_eq!(charts.len(), 11, "{charts:?}");
    for (title, area, shapes) in &charts {
        assert!(
            *area > 10_000.0 && *shapes > 10,
            "chart {title:?} did not render: area {area}, {shapes} shapes"
        );
    }
    let text = page_text(&mut browser);
    // Where the demo stops is the simulator's business: the page must say
    // what the run's summary says.
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.as_path().join("summary.json")).unwrap())
            .unwrap();
    let stop = summary["outcome"]["stage"].as_u64().unwrap() as usize;
    assert!(stop >= 1, "the demo stopped at its first stage: {summary}");
    let label = |i: usize| summary["stages"][i]["label"].as_str().unwrap().to_string();
    assert!(
        text.contains(&format!(
            "sweep stopped after stage {}: congested",
            label(stop)
        )),
        "stop reason missing:\n{text}"
    );
    assert!(
        text.contains(&format!(
            "knee (the highest level not congested): {}",
            label(stop - 1)
        )),
        "{text}"
    );
    assert!(text.contains("policy builtin"), "{text}");
    assert!(text.starts_with("nyann-bench report: demo"), "{text}");
    let png = browser.screenshot();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 50_000,
        "{} bytes",
        png.len()
    );
    std::fs::write(dir.as_path().join("report.png"), &png).unwrap();
    // `NYANN_REPORT_SCREENSHOT=docs/report.png` refreshes the README's picture.
    if let Some(path) = std::env::var_os("NYANN_REPORT_SCREENSHOT") {
        std::fs::write(Path::new(&path), &png).unwrap();
    }

    // Two runs in one report: both named, both in the legends and headlines.
    let overlay = dir.as_path().join("overlay.html");
    let out = nyann_bench()
        .arg("report")
        .arg(dir.as_path())
        .arg(dir.as_path())
        .args(["--label", "before", "--label", "after", "-o"])
        .arg(&overlay)
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    browser.open(&overlay);
    let text = page_text(&mut browser);
    for label in ["before", "after"] {
        assert!(
            text.contains(&format!(
                "{label}: sweep stopped after stage {}",
                summary["stages"][stop]["label"].as_str().unwrap()
            )),
            "{text}"
        );
    }
    let legends = browser
        .evaluate(
            "Array.from(document.querySelectorAll('svg text')).map(t => t.textContent).join('|')",
        )
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        legends.contains("before: req/s") && legends.contains("after: req/s"),
        "{legends}"
    );
    assert_eq!(
        charts_len(&mut browser),
        11 + 2,
        "two more timelines for the second run"
    );
    let text = page_text(&mut browser);
    assert!(text.contains("Compared at equal levels"), "{text}");
    assert!(browser.console_errors().is_empty());

    extreme_readings_are_reported(dir.as_path(), stop, &mut browser).await;
}

/// The run again with its congested stage's TTFT p99 read as `f64::MAX` (a
/// `+Inf` quantile whose bucket bounds could not be read), on the client's
/// side and the server's: `report DIR` ends (it used to spin forever in the
/// chart code) and the page marks the values above the axis.
async fn extreme_readings_are_reported(dir: &Path, stop: usize, browser: &mut Browser) {
    for file in ["stages.json", "summary.json"] {
        let path = dir.join(file);
        let mut json: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let stage = &mut json["stages"][stop];
        stage["client"]["ttft_p99_seconds"] = Value::from(f64::MAX);
        stage["annotation"]["congestion"]["roles"][0]["ttft_p99_seconds"] = Value::from(f64::MAX);
        std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    }
    let extreme = dir.join("extreme.html");
    let report = nyann_bench()
        .arg("report")
        .arg(dir)
        .arg("-o")
        .arg(&extreme)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), report)
        .await
        .expect("`nyann-bench report` did not end within 2 minutes")
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    browser.open(&extreme);
    assert!(browser.console_errors().is_empty());
    let text = browser
        .evaluate(
            "Array.from(document.querySelectorAll('svg text')).map(t => t.textContent).join('|')",
        )
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains("above the axis (value shown)"), "{text}");
    assert!(text.contains("∞ ↑") || text.contains("e308 ↑"), "{text}");
}

fn charts_len(browser: &mut Browser) -> usize {
    charts(browser).len()
}

#[test]
fn report_refuses_what_is_not_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nyann-bench"))
        .arg("report")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("holds no summary.json") && stderr.contains("generate --output-dir DIR"),
        "{stderr}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nyann-bench"))
        .arg("report")
        .arg(dir.path())
        .args(["--label", "a", "--label", "b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most one label per directory"));
}

/// The checks above can fail: a page with a broken SVG path logs an error
/// the browser reports, and an empty chart renders nothing.
#[test]
fn the_browser_checks_catch_a_broken_chart() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("broken.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><body><figure><svg width=\"100\" height=\"100\">\
         <path d=\"M 0 0 L NaN 5\" stroke=\"black\"/></svg></figure></body></html>",
    )
    .unwrap();
    let mut browser = Browser::launch();
    browser.open(&page);
    let errors = browser.console_errors();
    assert!(
        errors.iter().any(|e| e.contains("Expected number")),
        "{errors:?}"
    );
    let charts = charts(&mut browser);
    assert_eq!(charts.len(), 1);
    assert!(charts[0].1 == 0.0 && charts[0].2 == 0, "{charts:?}");
}

/// Per chart: its title, its legend entries, and how many congested marks
/// (circles of radius 7) it holds.
const MARKED: &str = "Array.from(document.querySelectorAll('figure svg')).map(svg => [\
    svg.querySelector('text') ? svg.querySelector('text').textContent : '', \
    Array.from(svg.querySelectorAll('text')).map(t => t.textContent).join('|'), \
    svg.querySelectorAll('circle[r=\"7\"]').length])";

/// A sweep the queueing rule stops, written with only some parameters: the
/// KV-cache threshold is the policy's default (drawn and listed as such),
/// the preemptions threshold of 1,000,000 (the KV rule switched off) is
/// marked above the axis with its value instead of flattening the data, and
/// the congested stage is circled on the queueing rule's charts only, not
/// on the KV chart (its usage reached 100% there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_draws_defaults_off_scale_thresholds_and_the_rule_that_fired() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let params = r#"waiting_requests_p50=4, ttft_p99="500ms", preemptions=1000000"#;
    let run = generate(&sim, &sweep(&[4, 8, 32, 64], params), &scrape_flags(&sim)).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    let reasons = run.congestion(2)["verdict"]["reasons"].to_string();
    assert!(reasons.contains("queue"), "{reasons}");
    assert!(
        run.congestion(2)["roles"][0]["kv_cache_usage_max"]
            .as_f64()
            .unwrap()
            >= 0.95,
        "the KV chart would have been circled: {}",
        run.congestion(2)
    );

    let mut browser = Browser::launch();
    browser.open(&run.dir().join("report.html"));
    assert!(browser.console_errors().is_empty());
    let Value::Array(charts) = browser.evaluate(MARKED) else {
        panic!("no charts")
    };
    let chart = |title: &str| -> (String, u64) {
        let found = charts
            .iter()
            .find(|c| c[0].as_str().is_some_and(|t| t.trim().starts_with(title)))
            .unwrap_or_else(|| panic!("no chart {title}: {charts:?}"));
        (
            found[1].as_str().unwrap().to_string(),
            found[2].as_u64().unwrap(),
        )
    };
    let (kv, kv_marks) = chart("Server KV-cache usage");
    assert!(
        kv.contains("threshold kv_cache_usage (policy default)"),
        "{kv}"
    );
    assert_eq!(kv_marks, 0, "the KV rule did not fire: {kv}");
    let (preemptions, _) = chart("Server preemptions");
    assert!(
        preemptions.contains("threshold preemptions 1000000 ↑"),
        "{preemptions}"
    );
    let (_, waiting_marks) = chart("Server waiting requests");
    assert_eq!(waiting_marks, 1);
    let (_, ttft_marks) = chart("Server time to first token");
    assert_eq!(ttft_marks, 1);
    let text = page_text(&mut browser);
    assert!(
        text.contains("kv_cache_usage=0.95 (policy default)")
            && text.contains("preemptions=1000000")
            && !text.contains("preemptions=1000000 (policy default)"),
        "{text}"
    );
    // Skipped stages sit along the top edge, off the data, in the throughput chart.
    let (throughput, _) = chart("Requests per second");
    assert!(
        throughput.contains("skipped (not run, no value)"),
        "{throughput}"
    );
}
