//! The direct-scrape source against scripted exporters on 127.0.0.1: exact
//! signals from controlled values, pods combined, the real vLLM fixture,
//! SGLang's names through the profile, the preflight scrape, and a down URL
//! reported as an error rather than a crash.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::{Engine, Exporter, now};
use nyann_model::SeriesStatus;
use nyann_signals::{Server, SignalError, SignalOptions, SignalSource};

fn scrape_args(urls: &[String]) -> SignalOptions {
    SignalOptions {
        scrape: urls.iter().map(|u| u.parse().unwrap()).collect(),
        scrape_interval: Duration::from_millis(200),
        scrape_timeout: Duration::from_millis(500),
        settle_wait: Duration::from_secs(5),
        ..Default::default()
    }
}

/// Adds one 0.3 s TTFT observation and one preemption every 50 ms, so the
/// histogram increase over any window lies in the (0.25, 0.5] bucket.
fn drive(exporter: &Exporter) -> tokio::task::JoinHandle<()> {
    let engine = exporter.engine.clone();
    tokio::spawn(async move {
        for _ in 0..2000 {
            {
                let mut e = engine.lock().unwrap();
                e.observe_ttft(0.3);
                e.preemptions += 1.0;
                e.generation_tokens += 10.0;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// Runs a stage of `secs` seconds (wall time) and returns its signals.
async fn stage(source: &SignalSource, secs: f64) -> nyann_signals::StageSignals {
    tokio::time::sleep(Duration::from_millis(300)).await; // a baseline sample
    let start = now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    source.stage_signals(start, now(), Default::default()).await
}

#[tokio::test]
async fn exact_signals_from_a_scripted_exporter() {
    let mut e = Engine::new();
    e.waiting = 42.0;
    e.running = 7.0;
    e.kv = 0.875;
    let exporter = Exporter::start(e).await;
    let driver = drive(&exporter);
    let source = SignalSource::from_options(&scrape_args(&[exporter.url()]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(source.roles(), ["aggregate"]);
    assert!(
        source
            .describe()
            .starts_with("scrape every 200ms; aggregate http://127.0.0.1:")
    );
    source.start();
    let out = stage(&source, 3.0).await;
    driver.abort();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let r = &out.roles[0];
    assert_eq!(r.role, "aggregate");
    assert_eq!(r.waiting_requests_p50, 42.0);
    assert_eq!(r.kv_cache_usage_max, 0.875);
    assert_eq!(r.extra("kv_cache_usage_min"), Some(0.875));
    assert_eq!(r.extra("running_requests_p50"), Some(7.0));
    // All new observations in (0.25, 0.5]: p99 = 0.25 + 0.25 * 0.99.
    assert!(
        (r.ttft_p99_seconds - 0.4975).abs() < 1e-12,
        "{}",
        r.ttft_p99_seconds
    );
    assert!((r.extra("ttft_p50_seconds").unwrap() - 0.375).abs() < 1e-12);
    // ~20 preemptions per second for 3 s; generous bounds, no timing luck.
    assert!(
        r.preemptions >= 20.0 && r.preemptions <= 120.0,
        "{}",
        r.preemptions
    );
    let tps = r.extra("generation_tokens_per_second").unwrap();
    assert!(tps > 50.0 && tps < 400.0, "{tps}");
}

/// A stalled server, scraped: 50 requests waiting, and a TTFT histogram
/// that has series but does not move over the stage. TTFT reads as at
/// least the stage's length (a lower bound), not as an idle 0; with
/// nothing waiting it is no data.
#[tokio::test]
async fn a_histogram_that_does_not_move_is_a_stall_or_no_data() {
    for waiting in [50.0, 0.0] {
        let mut e = Engine::new();
        e.waiting = waiting;
        e.observe_ttft(0.3); // the series exist, from before the stage
        let exporter = Exporter::start(e).await;
        let source = SignalSource::from_options(&scrape_args(&[exporter.url()]))
            .await
            .unwrap()
            .unwrap();
        source.start();
        let out = stage(&source, 2.0).await;
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        let r = &out.roles[0];
        let ttft = out.coverage[0].get("ttft_p99_seconds").unwrap();
        if waiting > 0.0 {
            // The whole stage (shorter than 5 s): about 2 s.
            assert!(
                r.ttft_p99_seconds >= 1.9 && r.ttft_p99_seconds < 10.0,
                "{}",
                r.ttft_p99_seconds
            );
            assert_eq!(ttft.status, SeriesStatus::Found);
            assert!(ttft.lower_bound);
        } else {
            assert_eq!(r.ttft_p99_seconds, 0.0);
            assert_eq!(ttft.status, SeriesStatus::NoObservations);
        }
    }
}

#[tokio::test]
async fn urls_of_one_role_are_combined_like_pods() {
    let mk = |w: f64, kv: f64| {
        let mut e = Engine::new();
        e.waiting = w;
        e.kv = kv;
        e
    };
    let a = Exporter::start(mk(3.0, 0.25)).await;
    let b = Exporter::start(mk(5.0, 0.75)).await;
    let p = Exporter::start(mk(11.0, 0.5)).await;
    let urls = [
        format!("decode={}", a.url()),
        format!("prefill={}", p.url()),
        format!("decode={}", b.addr), // host:port form
    ];
    let source = SignalSource::from_options(&scrape_args(&urls))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(source.roles(), ["prefill", "decode"]);
    source.start();
    let out = stage(&source, 1.5).await;
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.roles[0].role, "prefill");
    assert_eq!(out.roles[0].waiting_requests_p50, 11.0);
    assert_eq!(out.roles[1].role, "decode");
    assert_eq!(out.roles[1].waiting_requests_p50, 8.0);
    assert_eq!(out.roles[1].kv_cache_usage_max, 0.75);
    assert_eq!(out.roles[1].extra("kv_cache_usage_min"), Some(0.25));
    // Histograms without observations while requests wait: a stall, TTFT
    // at least the stage's length (the whole 1.5 s stage), a lower bound.
    let ttft = out.roles[1].ttft_p99_seconds;
    assert!((1.4..10.0).contains(&ttft), "{ttft}");
    assert!(out.coverage[1].get("ttft_p99_seconds").unwrap().lower_bound);
}

#[tokio::test]
async fn real_vllm_exposition_is_read() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vllm-0.32-metrics-loaded.txt"
    ))
    .unwrap();
    let app = Router::new().route("/metrics", get(move || std::future::ready(text.clone())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let source = SignalSource::from_options(&scrape_args(&[addr.to_string()]))
        .await
        .unwrap()
        .unwrap();
    source.start();
    let out = stage(&source, 1.0).await;
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let r = &out.roles[0];
    assert_eq!(r.waiting_requests_p50, 50.0);
    assert_eq!(r.kv_cache_usage_max, 0.9682539682539683);
    assert_eq!(r.extra("running_requests_p50"), Some(14.0));
    // A frozen snapshot: counters do not move, histograms have no new
    // observations, while 50 requests wait and 14 run: a stall, TTFT at
    // least the (whole, 1 s) stage.
    assert_eq!(r.preemptions, 0.0);
    assert!(
        (0.9..10.0).contains(&r.ttft_p99_seconds),
        "{}",
        r.ttft_p99_seconds
    );
    assert!(out.coverage[0].get("ttft_p99_seconds").unwrap().lower_bound);
}

#[tokio::test]
async fn a_down_url_is_an_error_not_a_crash() {
    let mut e = Engine::new();
    e.waiting = 4.0;
    let up = Exporter::start(e).await;
    let down_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let down = format!("http://127.0.0.1:{down_port}/metrics");
    let urls = [format!("prefill={down}"), format!("decode={}", up.url())];
    let source = SignalSource::from_options(&scrape_args(&urls))
        .await
        .unwrap()
        .unwrap();
    source.start();
    let out = stage(&source, 1.0).await;
    assert_eq!(out.roles[0].role, "prefill");
    assert_eq!(out.roles[0].waiting_requests_p50, 0.0);
    assert_eq!(out.roles[1].waiting_requests_p50, 4.0);
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    let e = &out.errors[0];
    assert!(
        e.starts_with(&format!("prefill: all signals: scrape of {down} failed")),
        "{e}"
    );
    assert!(e.to_lowercase().contains("connect"), "{e}");
    // Unread because the scrapes failed: recorded as failed, not missing.
    assert!(
        out.coverage[0].all(SeriesStatus::Failed),
        "{:?}",
        out.coverage[0]
    );
    assert_eq!(
        out.coverage[1].status("waiting_requests_p50"),
        SeriesStatus::Found
    );

    // Before any load, the same URL stops the run with the reason.
    let e = source.preflight().await.unwrap_err();
    assert!(matches!(e, SignalError::Unreachable { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with(&format!(
            "cannot read server signals from {down} before the first stage: "
        )),
        "{e}"
    );
}

/// An SGLang server read with vLLM's names finds nothing and is refused
/// with the fix; with `--server sglang` every signal is found, and its
/// values come from SGLang's own names.
#[tokio::test]
async fn sglang_names_through_the_profile() {
    let mut e = Engine::sglang();
    e.waiting = 12.0;
    e.kv = 0.97;
    let exporter = Exporter::start(e).await;
    let driver = drive(&exporter);

    let vllm = SignalSource::from_options(&scrape_args(&[exporter.url()]))
        .await
        .unwrap()
        .unwrap();
    let e = vllm.preflight().await.unwrap_err();
    let SignalError::NothingFound(nothing) = &e else {
        panic!("{e:?}");
    };
    let hint = &nothing.roles[0].hints[0];
    assert!(
        hint.found
            .starts_with(&format!("{} serves SGLang series (sglang:", exporter.url())),
        "{e}"
    );
    assert_eq!(
        hint.suggestions,
        [nyann_signals::Suggestion::Server(Server::Sglang)]
    );

    let args = SignalOptions {
        server: Server::Sglang,
        ..scrape_args(&[exporter.url()])
    };
    let source = SignalSource::from_options(&args).await.unwrap().unwrap();
    assert_eq!(source.preflight().await.unwrap(), Vec::new());
    source.start();
    let out = stage(&source, 2.0).await;
    driver.abort();
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let r = &out.roles[0];
    assert_eq!(r.waiting_requests_p50, 12.0);
    assert_eq!(r.kv_cache_usage_max, 0.97);
    assert!(r.preemptions >= 10.0, "{}", r.preemptions);
    // SGLang's buckets: every observation (0.3 s) in (0.2, 0.4].
    assert!(
        (r.ttft_p99_seconds - 0.398).abs() < 1e-9,
        "{}",
        r.ttft_p99_seconds
    );
    let c = &out.coverage[0];
    assert_eq!(
        c.get("preemptions").unwrap().metric.as_deref(),
        Some("sglang:num_retracted_requests_total")
    );
    assert_eq!(
        c.get("kv_cache_usage_max").unwrap().metric.as_deref(),
        Some("sglang:token_usage")
    );
}

#[tokio::test]
async fn not_started_is_reported() {
    let up = Exporter::start(Engine::new()).await;
    let source = SignalSource::from_options(&scrape_args(&[up.url()]))
        .await
        .unwrap()
        .unwrap();
    let out = source
        .stage_signals(now() - 2.0, now(), Default::default())
        .await;
    assert_eq!(out.roles.len(), 1);
    assert!(out.errors[0].contains("never started"), "{:?}", out.errors);
}
