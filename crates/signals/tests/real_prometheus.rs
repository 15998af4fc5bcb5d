//! Both sources over the same stages against a real Prometheus (Debian
//! package, via nyann-testkit) scraping scripted vLLM-like exporters every
//! second: aggregate (two pods) and disaggregated (prefill + decode). They
//! must agree (waiting p50 and KV max within a small tolerance, TTFT p99 in
//! the same bucket), and both must see congestion when the servers are
//! overloaded and none when idle. Also: Prometheus over https with a private
//! CA and client certificates. Fails, never skips, without `prometheus`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Engine, Exporter, bucket_of, congested, now};
use nyann_signals::{SignalError, SignalOptions, SignalSource, StageSignals};
use nyann_testkit::{PrivateCa, PrometheusServer, ScrapeJob, WebTls};

/// What a scripted engine does each 50 ms tick in each phase.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Aggregate,
    Prefill,
    Decode,
}

fn tick(e: &mut Engine, kind: Kind, overloaded: bool, n: u64) {
    if !overloaded {
        e.waiting = 0.0;
        e.running = 1.0;
        e.kv = 0.1;
        if n.is_multiple_of(2) {
            e.observe_ttft(0.05);
        }
        e.generation_tokens += 5.0;
        return;
    }
    let queueing = kind != Kind::Decode;
    let kv_pressure = kind != Kind::Prefill;
    e.waiting = if queueing { 40.0 } else { 0.0 };
    e.running = 16.0;
    e.kv = if kv_pressure { 0.99 } else { 0.5 };
    e.observe_ttft(if queueing { 3.0 } else { 0.3 });
    if kv_pressure && n.is_multiple_of(4) {
        e.preemptions += 1.0;
    }
    e.generation_tokens += 50.0;
}

/// Drives every exporter according to the shared phase flag (bounded).
fn drive(exporters: Vec<(Arc<Exporter>, Kind)>, overloaded: Arc<AtomicBool>) {
    tokio::spawn(async move {
        for n in 0..4000u64 {
            let o = overloaded.load(Ordering::SeqCst);
            for (x, kind) in &exporters {
                x.update(|e| tick(e, *kind, o, n));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

fn agree(label: &str, prom: &StageSignals, scrape: &StageSignals) {
    assert!(
        prom.errors.is_empty(),
        "{label} prometheus: {:?}",
        prom.errors
    );
    assert!(
        scrape.errors.is_empty(),
        "{label} scrape: {:?}",
        scrape.errors
    );
    assert_eq!(prom.roles.len(), scrape.roles.len());
    for (p, s) in prom.roles.iter().zip(&scrape.roles) {
        eprintln!("{label} prometheus: {p:?}\n{label} scrape:     {s:?}");
        assert_eq!(p.role, s.role);
        assert!(
            (p.waiting_requests_p50 - s.waiting_requests_p50).abs() <= 0.5,
            "{label} {} waiting: {} vs {}",
            p.role,
            p.waiting_requests_p50,
            s.waiting_requests_p50
        );
        assert!(
            (p.kv_cache_usage_max - s.kv_cache_usage_max).abs() <= 0.01,
            "{label} {} kv: {} vs {}",
            p.role,
            p.kv_cache_usage_max,
            s.kv_cache_usage_max
        );
        assert_eq!(
            bucket_of(p.ttft_p99_seconds),
            bucket_of(s.ttft_p99_seconds),
            "{label} {} ttft p99: {} vs {}",
            p.role,
            p.ttft_p99_seconds,
            s.ttft_p99_seconds
        );
        // Prometheus extrapolates increase() to the window edges; the
        // scrape source does not: same order of magnitude.
        if s.preemptions > 0.0 || p.preemptions > 0.0 {
            let ratio = p.preemptions / s.preemptions;
            assert!(
                (0.5..=2.0).contains(&ratio),
                "{label} {} preemptions: {} vs {}",
                p.role,
                p.preemptions,
                s.preemptions
            );
        }
    }
}

async fn source(args: SignalOptions) -> SignalSource {
    let s = SignalSource::from_options(&args).await.unwrap().unwrap();
    s.start();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_and_scrape_sources_agree_idle_and_overloaded() {
    let mk = || async { Arc::new(Exporter::start(Engine::new()).await) };
    let (agg0, agg1, pre, dec) = (mk().await, mk().await, mk().await, mk().await);
    let overloaded = Arc::new(AtomicBool::new(false));
    drive(
        vec![
            (agg0.clone(), Kind::Aggregate),
            (agg1.clone(), Kind::Aggregate),
            (pre.clone(), Kind::Prefill),
            (dec.clone(), Kind::Decode),
        ],
        overloaded.clone(),
    );
    let prom = PrometheusServer::start(&[
        ScrapeJob::new("vllm-aggregate")
            .target(agg0.addr, &[("pod", "agg-0")])
            .target(agg1.addr, &[("pod", "agg-1")]),
        ScrapeJob::new("vllm-prefill").target(pre.addr, &[("pod", "m-prefill-0")]),
        ScrapeJob::new("vllm-decode").target(dec.addr, &[("pod", "m-decode-0")]),
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    let prom_args = |deploy: &str| SignalOptions {
        prometheus_url: Some(prom.url()),
        deploy_name: Some(deploy.to_string()),
        ..Default::default()
    };
    let scrape_args = |urls: Vec<String>| SignalOptions {
        scrape: urls.iter().map(|u| u.parse().unwrap()).collect(),
        ..Default::default()
    };
    let sources = [
        (
            "aggregate",
            source(prom_args("agg")).await,
            source(scrape_args(vec![agg0.url(), agg1.url()])).await,
        ),
        (
            "disaggregated",
            source(prom_args("m-decode")).await,
            source(scrape_args(vec![
                format!("prefill={}", pre.url()),
                format!("decode={}", dec.url()),
            ]))
            .await,
        ),
    ];

    for phase_overloaded in [false, true] {
        overloaded.store(phase_overloaded, Ordering::SeqCst);
        // Let the phase reach both the exporters and a Prometheus scrape.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let start = now();
        tokio::time::sleep(Duration::from_secs(8)).await;
        let end = now();
        for (mode, p, s) in &sources {
            let label = format!(
                "{mode} {}",
                if phase_overloaded {
                    "overloaded"
                } else {
                    "idle"
                }
            );
            let ps = p.stage_signals(start, end, Default::default()).await;
            let ss = s.stage_signals(start, end, Default::default()).await;
            agree(&label, &ps, &ss);
            assert_eq!(congested(&ps.roles), phase_overloaded, "{label} prometheus");
            assert_eq!(congested(&ss.roles), phase_overloaded, "{label} scrape");
            if phase_overloaded && *mode == "aggregate" {
                // Two pods of 40 waiting each.
                assert_eq!(ps.roles[0].waiting_requests_p50, 80.0);
                assert_eq!(ss.roles[0].waiting_requests_p50, 80.0);
                assert_eq!(ps.roles[0].kv_cache_usage_max, 0.99);
            }
            if phase_overloaded && *mode == "disaggregated" {
                assert_eq!(ps.roles[0].role, "prefill");
                assert_eq!(ps.roles[0].waiting_requests_p50, 40.0);
                assert_eq!(ps.roles[1].kv_cache_usage_max, 0.99);
                assert!(ps.roles[1].preemptions >= 1.0);
                assert!(ss.roles[1].preemptions >= 1.0);
            }
        }
    }
    drop(prom);
}

/// The raw samples Prometheus holds of `series` over the last 30 s:
/// (time, value), oldest first.
async fn samples(prom: &PrometheusServer, series: &str) -> Vec<(f64, f64)> {
    let result = prom.query(&format!("{series}[30s]")).await.unwrap();
    result[0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_f64().unwrap(),
                p[1].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// A short stage that starts right after a congested one (between
/// Prometheus' last congested sample and its first idle one) reads what
/// happened in it, not the congested stage's tail through the query's
/// lookback: the boundary of a capacity search stepping down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_right_after_a_congested_one_reads_only_its_own_samples() {
    let exporter = Arc::new(Exporter::start(Engine::new()).await);
    let overloaded = Arc::new(AtomicBool::new(true));
    drive(
        vec![(exporter.clone(), Kind::Aggregate)],
        overloaded.clone(),
    );
    let prom = PrometheusServer::start(&[
        ScrapeJob::new("vllm-aggregate").target(exporter.addr, &[("pod", "agg-0")])
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let kv = r#"vllm:kv_cache_usage_perc{pod="agg-0"}"#;
    prom.wait_for_series(kv, Duration::from_secs(30))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    overloaded.store(false, Ordering::SeqCst);
    // Until Prometheus holds an idle sample after the congested ones.
    let (busy, idle) =
        nyann_testkit::wait_until("an idle sample", Duration::from_secs(30), || async {
            let held = samples(&prom, kv).await;
            let last_busy = held.iter().rposition(|&(_, v)| v > 0.9)?;
            let first_idle = held.get(last_busy + 1)?;
            Some((held[last_busy].0, first_idle.0))
        })
        .await
        .unwrap();
    // 4 s: too short for a steady window, the whole stage is read.
    let start = (busy + idle) / 2.0;
    let end = start + 4.0;
    while now() < end + 2.0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let source = source(SignalOptions {
        prometheus_url: Some(prom.url()),
        selectors: vec![r#"aggregate={pod="agg-0"}"#.parse().unwrap()],
        ..Default::default()
    })
    .await;
    let signals = source.stage_signals(start, end, Default::default()).await;
    assert!(signals.errors.is_empty(), "{:?}", signals.errors);
    let role = &signals.roles[0];
    assert_eq!(
        role.kv_cache_usage_max, 0.1,
        "{role:?} (samples at {busy} and {idle})"
    );
    assert_eq!(role.waiting_requests_p50, 0.0, "{role:?}");
    assert_eq!(role.preemptions, 0.0, "{role:?}");
    assert!(!congested(&signals.roles));
    drop(prom);
}

/// Prometheus serving its API over https with a private CA's certificate
/// and requiring client certificates (mutual TLS): with the CA trusted
/// (`--ca-cert`) and the client certificate, the preflight and a stage read
/// the signals; without the client certificate or without the CA, the
/// preflight fails before any load, and an unreadable key is refused when
/// the source is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_prometheus_with_a_private_ca_and_client_certificates() {
    let mut engine = Engine::new();
    engine.waiting = 5.0;
    let exporter = Exporter::start(engine).await;
    let ca = PrivateCa::new().unwrap();
    let prom = PrometheusServer::start_https(
        &[ScrapeJob::new("vllm-aggregate").target(exporter.addr, &[("pod", "m-0")])],
        WebTls {
            ca: &ca,
            require_client_cert: true,
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(prom.url().starts_with("https://127.0.0.1:"));
    let base = SignalOptions {
        prometheus_url: Some(prom.url()),
        deploy_name: Some("m".into()),
        settle_wait: Duration::ZERO,
        ..Default::default()
    };

    let trusted = SignalOptions {
        ca_certs: vec![ca.ca_der.clone()],
        prometheus_client_cert: Some(ca.client_cert.clone()),
        prometheus_client_key: Some(ca.client_key.clone()),
        ..base.clone()
    };
    let source = SignalSource::from_options(&trusted).await.unwrap().unwrap();
    assert_eq!(source.preflight().await.unwrap(), Vec::new());
    let end = now();
    let out = source
        .stage_signals(end - 5.0, end, Default::default())
        .await;
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.roles[0].waiting_requests_p50, 5.0);

    let refused = |args: SignalOptions| async move {
        let source = SignalSource::from_options(&args).await.unwrap().unwrap();
        let e = source.preflight().await.unwrap_err();
        assert!(matches!(e, SignalError::Unreachable { .. }), "{e:?}");
        e.to_string()
    };
    let without_client_cert = refused(SignalOptions {
        ca_certs: vec![ca.ca_der.clone()],
        ..base.clone()
    })
    .await;
    assert!(
        without_client_cert.contains(&format!("from Prometheus {}", prom.url())),
        "{without_client_cert}"
    );
    let untrusted = refused(SignalOptions {
        prometheus_client_cert: Some(ca.client_cert.clone()),
        prometheus_client_key: Some(ca.client_key.clone()),
        ..base.clone()
    })
    .await;
    assert!(untrusted.contains("certificate"), "{untrusted}");

    let unreadable = SignalOptions {
        prometheus_client_key: Some("/nonexistent/key.pem".into()),
        ..trusted.clone()
    };
    let e = SignalSource::from_options(&unreadable)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("client key /nonexistent/key.pem: cannot read it: "),
        "{e}"
    );
}
