//! Signals a user can trust, end to end with a real Prometheus: a selector
//! that finds nothing is refused before any load (with what does exist),
//! `--allow-missing-signals` runs and records "no data", a missing signal
//! warns at start, a Prometheus that is down stops the run before load,
//! SGLang's names stop a sweep through `--server sglang` as vLLM's do, a
//! stalled server stops it in both sources, and an https Prometheus behind
//! a private CA is read with `--ca-cert`.
//!
//! The scripted exporters report exactly known signals; the load goes to
//! the simulator, whose own metrics play no part here.

use std::time::Duration;

use nyann_testkit::exporter::{Engine, Exporter};
use nyann_testkit::{PrivateCa, PrometheusServer, ScrapeJob, WebTls};
use serde_json::Value;

use crate::support::{Run, generate, refused, serial, simulator, sweep};

/// Thresholds no stage reaches.
const NEVER: &str =
    r#"waiting_requests_p50=100000, ttft_p99="1h", kv_cache_usage=1.0, preemptions=1000000"#;

/// KV pressure with preemptions: a scripted engine at 99% KV usage that
/// preempts every tick stops the sweep at its first stage.
const KV_RULE: &str =
    r#"waiting_requests_p50=100000, ttft_p99="1h", kv_cache_usage=0.95, preemptions=1"#;

async fn prometheus(job: &str, exporter: &Exporter, pod: &str) -> PrometheusServer {
    PrometheusServer::start(&[ScrapeJob::new(job).target(exporter.addr, &[("pod", pod)])])
        .await
        .expect("Prometheus starts (apt-get install prometheus)")
}

/// Moves the exporter's preemption counter every 100 ms (bounded to 2 min).
fn preempting(exporter: &Exporter) -> tokio::task::JoinHandle<()> {
    let engine = exporter.engine.clone();
    tokio::spawn(async move {
        for _ in 0..1200 {
            engine.lock().unwrap().preemptions += 1.0;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// A one-stage sweep with `args` that must be refused before any load.
async fn refused_before_load(args: Vec<String>) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(&sweep(&[2], NEVER), false, &args).await
}

fn prometheus_args(prom: &PrometheusServer, deploy_name: &str) -> Vec<String> {
    vec![
        "--prometheus-url".into(),
        prom.url(),
        "--deploy-name".into(),
        deploy_name.into(),
        "--settle-wait".into(),
        "5".into(),
    ]
}

/// The coverage entry of `signal` for the first role of a judged stage.
fn coverage<'a>(run: &'a Run, stage: usize, signal: &str) -> &'a Value {
    run.congestion(stage)["coverage"][0]["signals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["signal"] == signal)
        .unwrap_or_else(|| panic!("no coverage of {signal}: {}", run.congestion(stage)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_deploy_name_is_refused_before_load_with_a_hint() {
    let exporter = Exporter::start(Engine::new()).await;
    let prom = prometheus("vllm-aggregate", &exporter, "mymodel-0").await;
    let stderr = refused_before_load(prometheus_args(&prom, "mymdoel")).await;
    assert!(
        stderr.contains(&format!(
            "role aggregate: no series of any signal in Prometheus {} at selector {{job=\"vllm-aggregate\",pod=~\"mymdoel.*\"}}",
            prom.url()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "found job=\"vllm-aggregate\", pod=\"mymodel-0\" (vllm:num_requests_waiting); did you mean --deploy-name mymodel?"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("--allow-missing-signals"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_missing_signals_runs_and_records_no_data() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let exporter = Exporter::start(Engine::new()).await;
    let prom = prometheus("vllm-aggregate", &exporter, "mymodel-0").await;
    let mut args = prometheus_args(&prom, "mymdoel");
    args.push("--allow-missing-signals".into());
    let run = generate(&sim, &sweep(&[2, 2], NEVER), &args).await;
    let stderr = run.stderr();
    assert_eq!(run.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("starting anyway (--allow-missing-signals)"),
        "{stderr}"
    );
    for stage in 0..2 {
        assert_eq!(run.status(stage), "measured");
        let coverage = &run.congestion(stage)["coverage"][0];
        assert_eq!(coverage["role"], "aggregate");
        let signals = coverage["signals"].as_array().unwrap();
        assert_eq!(signals.len(), 10);
        assert!(
            signals.iter().all(|s| s["status"] == "missing"),
            "{coverage}"
        );
    }
    // Each judged stage says the role was blind, and the table shows no data.
    assert!(
        stderr.contains(
            "stage #0 c=2: role aggregate has no series of any signal (selector {job=\"vllm-aggregate\",pod=~\"mymdoel.*\"})"
        ),
        "{stderr}"
    );
    let row = stderr
        .lines()
        .find(|l| l.starts_with("#1 c=2"))
        .unwrap_or_else(|| panic!("no table row: {stderr}"));
    assert_eq!(row.matches("no data").count(), 4, "{row}");
    assert!(
        stderr.contains("no data: no series of that signal on any role"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_missing_one_signal_warns_at_start() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    // No preemption counter, as llm-d-inference-sim exports.
    let mut engine = Engine::new();
    engine.without_preemptions = true;
    engine.kv = 0.5;
    let exporter = Exporter::start(engine).await;
    let prom = prometheus("vllm-aggregate", &exporter, "sim-0").await;
    let run = generate(&sim, &sweep(&[2], NEVER), &prometheus_args(&prom, "sim")).await;
    let stderr = run.stderr();
    assert_eq!(run.code(), Some(0), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("no series for"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].contains(
            "role aggregate: no series for preemptions in Prometheus"
        ) && warnings[0].contains(
            "(tried vllm:num_preemptions_total, vllm_num_preemptions_total): preemptions read 0 at every stage, recorded as no data"
        ),
        "{stderr}"
    );
    assert!(warnings[0].contains("WARN"), "{stderr}");
    assert_eq!(coverage(&run, 0, "preemptions")["status"], "missing");
    assert_eq!(coverage(&run, 0, "kv_cache_usage_max")["status"], "found");
    assert_eq!(
        coverage(&run, 0, "kv_cache_usage_max")["metric"],
        "vllm:kv_cache_usage_perc"
    );
    let row = stderr.lines().find(|l| l.starts_with("#0 c=2")).unwrap();
    assert!(row.contains("50.0%") && row.contains("no data"), "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_down_at_start_exits_1_before_load() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let stderr = refused(
        &sweep(&[2], NEVER),
        false,
        &["--prometheus-url", &url, "--deploy-name", "sim"],
    )
    .await;
    assert!(
        stderr.contains(&format!(
            "cannot read server signals from Prometheus {url} before the first stage: prometheus: request to {url}/api/v1/query failed: "
        )),
        "{stderr}"
    );
}

/// A server so stalled that no request gets its first token: 50 requests
/// wait, the TTFT histogram does not move, so Prometheus answers NaN for
/// its quantile. That reads as TTFT of at least the window (a lower bound),
/// and the queueing rule stops the sweep at its first stage, through a real
/// Prometheus and through `--scrape` alike. (It read as an idle 0 and the
/// sweep ran to its end, exit 0.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_stops_the_sweep_in_both_sources() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let exporter = Exporter::start(Engine {
        waiting: 50.0,
        ..Engine::new()
    })
    .await;
    let prom = prometheus("vllm-aggregate", &exporter, "sim-0").await;
    let queueing =
        r#"waiting_requests_p50=32, ttft_p99="1s", kv_cache_usage=1.0, preemptions=1000000"#;
    let scrape = vec!["--scrape".to_string(), exporter.url()];
    for args in [prometheus_args(&prom, "sim"), scrape] {
        let run = generate(&sim, &sweep(&[2, 2, 2], queueing), &args).await;
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        assert_eq!(run.stopped_at(), Some(0), "{}", run.stderr());
        let role = &run.congestion(0)["roles"][0];
        assert!(
            role["ttft_p99_seconds"].as_f64().unwrap() >= 1.0,
            "{}",
            run.congestion(0)
        );
        let ttft = coverage(&run, 0, "ttft_p99_seconds");
        assert_eq!(ttft["status"], "found", "{ttft}");
        assert_eq!(ttft["lower_bound"], true, "{ttft}");
        assert!(run.stderr().contains("CONGESTED"), "{}", run.stderr());
        assert_eq!(run.status(1), "skipped");
    }
}

/// The same scripted congestion (KV at 99% with preemptions) under vLLM's
/// names and under SGLang's: both stop at the first stage on the KV rule,
/// SGLang's through `--server sglang`; without it SGLang's server is
/// refused before load with the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_names_through_the_profile_stop_the_sweep_like_vllm_names() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    for (engine, server) in [(Engine::new(), "vllm"), (Engine::sglang(), "sglang")] {
        let exporter = Exporter::start(Engine { kv: 0.99, ..engine }).await;
        let driver = preempting(&exporter);
        let prom = prometheus("vllm-aggregate", &exporter, "sim-0").await;
        let mut args = prometheus_args(&prom, "sim");
        args.extend(["--server".into(), server.into()]);
        let run = generate(&sim, &sweep(&[2, 2], KV_RULE), &args).await;
        assert_eq!(run.code(), Some(0), "{server}: {}", run.stderr());
        assert_eq!(run.stopped_at(), Some(0), "{server}: {}", run.stderr());
        let reasons = run.congestion(0)["verdict"]["reasons"].to_string();
        assert!(
            reasons.contains("KV cache on aggregate"),
            "{server}: {reasons}"
        );
        assert_eq!(run.status(1), "skipped");
        let kv = coverage(&run, 0, "kv_cache_usage_max");
        let preemptions = coverage(&run, 0, "preemptions");
        if server == "sglang" {
            assert_eq!(kv["metric"], "sglang:token_usage");
            assert_eq!(preemptions["metric"], "sglang:num_retracted_requests_total");
            let stderr = refused_before_load(prometheus_args(&prom, "sim")).await;
            assert!(
                stderr.contains(
                    "found job=\"vllm-aggregate\", pod=\"sim-0\" (sglang:num_queue_reqs); did you mean --server sglang?"
                ),
                "{stderr}"
            );
        } else {
            assert_eq!(kv["metric"], "vllm:kv_cache_usage_perc");
            assert_eq!(preemptions["metric"], "vllm:num_preemptions_total");
        }
        driver.abort();
    }
}

/// Prometheus serving https with a certificate of a private CA: read with
/// `--ca-cert` (the sweep stops on the scripted congestion); without it the
/// certificate is refused before any load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_cert_reaches_an_https_prometheus_behind_a_private_ca() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let exporter = Exporter::start(Engine {
        kv: 0.99,
        ..Engine::new()
    })
    .await;
    let driver = preempting(&exporter);
    let ca = PrivateCa::new().unwrap();
    let prom = PrometheusServer::start_https(
        &[ScrapeJob::new("vllm-aggregate").target(exporter.addr, &[("pod", "sim-0")])],
        WebTls {
            ca: &ca,
            require_client_cert: false,
        },
    )
    .await
    .expect("Prometheus starts with TLS");
    let mut args = prometheus_args(&prom, "sim");
    args.extend(["--ca-cert".into(), ca.ca_pem.display().to_string()]);
    let run = generate(&sim, &sweep(&[2, 2], KV_RULE), &args).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(0), "{}", run.stderr());
    assert_eq!(run.congestion(0)["signal_errors"], serde_json::json!([]));

    let stderr = refused_before_load(prometheus_args(&prom, "sim")).await;
    assert!(
        stderr.contains(&format!(
            "cannot read server signals from Prometheus {} before the first stage: ",
            prom.url()
        )) && stderr.contains("certificate"),
        "{stderr}"
    );
    driver.abort();
}
