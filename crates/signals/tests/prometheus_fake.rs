//! The Prometheus source against a fake Prometheus: the exact queries and
//! windows (the Go tool's three cases), metric-name fallbacks, the settle
//! wait, auth headers, the preflight before any load, and every fault
//! turning into a clear error with zero signals (a hung Prometheus costing
//! one timeout per check, a quantile of +Inf reading as slow, not as 0).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Answer, FakeProm, Req, empty, every_vllm_series, labelled, matrix, vector};
use nyann_model::SeriesStatus;
use nyann_signals::prometheus::MAX_PARALLEL_QUERIES;
use nyann_signals::{
    Hint, PreflightWarning, SignalError, SignalOptions, SignalSource, StageSignals, Suggestion,
};

const DECODE: &str = r#"{job="vllm-decode",pod=~"model-decode.*"}"#;
const PREFILL: &str = r#"{job="vllm-prefill",pod=~"model-prefill.*"}"#;

/// The query of a gauge over a window starting at `from` (112: the steady
/// window of stage 100..160).
fn gauge(agg: &str, metric: &str, sel: &str, from: f64) -> String {
    nyann_signals::prometheus::gauge_query(agg, &format!("{metric}{sel}"), from)
}

fn args(url: &str, deploy: &str) -> SignalOptions {
    SignalOptions {
        prometheus_url: Some(url.to_string()),
        deploy_name: Some(deploy.to_string()),
        settle_wait: Duration::ZERO,
        ..Default::default()
    }
}

async fn signals(args: &SignalOptions, start: f64, end: f64) -> StageSignals {
    let source = SignalSource::from_options(args).await.unwrap().unwrap();
    source.stage_signals(start, end, Default::default()).await
}

/// The primary (first-name) queries of one role for stage 100..160:
/// (path, query, start|time, end, step).
fn primary_queries(sel: &str) -> Vec<(String, String, f64, f64, f64)> {
    let range = |q: String| ("/api/v1/query_range".to_string(), q, 112.0, 157.0, 0.225);
    let at = |q: String, t: f64| ("/api/v1/query".to_string(), q, t, 0.0, 0.0);
    let hq = |q: f64, m: &str| {
        at(
            format!("histogram_quantile({q}, sum by (le) (rate({m}_bucket{sel}[45s])))"),
            157.0,
        )
    };
    vec![
        range(gauge("sum", "vllm:num_requests_waiting", sel, 112.0)),
        hq(0.99, "vllm:time_to_first_token_seconds"),
        range(gauge("max", "vllm:kv_cache_usage_perc", sel, 112.0)),
        at(
            format!("sum(increase(vllm:num_preemptions_total{sel}[60s]))"),
            160.0,
        ),
        hq(0.5, "vllm:time_to_first_token_seconds"),
        hq(0.5, "vllm:inter_token_latency_seconds"),
        hq(0.99, "vllm:inter_token_latency_seconds"),
        at(
            format!("sum(rate(vllm:generation_tokens_total{sel}[45s]))"),
            157.0,
        ),
        range(gauge("min", "vllm:kv_cache_usage_perc", sel, 112.0)),
        range(gauge("sum", "vllm:num_requests_running", sel, 112.0)),
    ]
}

fn seen(reqs: &[Req]) -> Vec<(String, String, f64, f64, f64)> {
    reqs.iter()
        .map(|r| {
            if r.path.ends_with("query_range") {
                (
                    r.path.clone(),
                    r.query().to_string(),
                    r.num("start"),
                    r.num("end"),
                    r.num("step"),
                )
            } else {
                (
                    r.path.clone(),
                    r.query().to_string(),
                    r.num("time"),
                    0.0,
                    0.0,
                )
            }
        })
        .collect()
}

/// Answers the primary queries from `answers` (query -> body); anything else
/// (fallback names) gets an empty result.
fn answering(answers: Vec<(String, String)>) -> impl Fn(&Req) -> Answer + Send + Sync {
    move |req: &Req| {
        let body = answers
            .iter()
            .find(|(q, _)| q == req.query())
            .map(|(_, b)| b.clone())
            .unwrap_or_else(|| empty(req));
        Answer::json(200, body)
    }
}

#[tokio::test]
async fn go_case_queueing_on_decode_with_prefill_ttft() {
    // Decode queues (p50 of 10, 40, 50, 60, 70 = 50); TTFT p99 comes from prefill.
    let fake = FakeProm::start(answering(vec![
        (
            gauge("sum", "vllm:num_requests_waiting", DECODE, 112.0),
            matrix(&[
                (112.0, "10"),
                (120.0, "40"),
                (130.0, "60"),
                (140.0, "50"),
                (157.0, "70"),
            ]),
        ),
        (
            format!(
                "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{PREFILL}[45s])))"
            ),
            vector(157.0, "2.5"),
        ),
        (
            format!(
                "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{DECODE}[45s])))"
            ),
            vector(157.0, "NaN"), // no first token on decode in the window
        ),
    ]))
    .await;
    let out = signals(&args(&fake.url(), "model-decode"), 100.0, 160.0).await;
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let roles: Vec<&str> = out.roles.iter().map(|r| r.role.as_str()).collect();
    assert_eq!(roles, ["prefill", "decode"]);
    assert_eq!(out.roles[1].waiting_requests_p50, 50.0);
    // No first token on decode while 50 requests waited there: a stall,
    // TTFT at least the steady window's 45 s.
    assert_eq!(out.roles[1].ttft_p99_seconds, 45.0);
    assert!(out.coverage[1].get("ttft_p99_seconds").unwrap().lower_bound);
    assert_eq!(out.roles[0].ttft_p99_seconds, 2.5);
    assert_eq!(out.roles[0].waiting_requests_p50, 0.0);

    // Every primary query was asked with the exact window; prefill's first.
    let reqs = fake.requests();
    let got = seen(&reqs);
    for q in primary_queries(PREFILL)
        .into_iter()
        .chain(primary_queries(DECODE))
    {
        assert!(got.contains(&q), "missing {q:?}\nin {got:#?}");
    }
    assert!(reqs[0].query().contains("vllm-prefill"), "{:?}", reqs[0]);
}

#[tokio::test]
async fn go_case_kv_pressure_with_preemptions() {
    let fake = FakeProm::start(answering(vec![
        (
            gauge("max", "vllm:kv_cache_usage_perc", DECODE, 112.0),
            matrix(&[(112.0, "0.5"), (130.0, "0.97"), (157.0, "0.9")]),
        ),
        (
            gauge("min", "vllm:kv_cache_usage_perc", DECODE, 112.0),
            matrix(&[(112.0, "0.25"), (157.0, "0.5")]),
        ),
        (
            format!("sum(increase(vllm:num_preemptions_total{DECODE}[60s]))"),
            vector(160.0, "3.0000000002"),
        ),
        (
            format!("sum(rate(vllm:generation_tokens_total{DECODE}[45s]))"),
            vector(157.0, "1234.5"),
        ),
        (
            gauge("sum", "vllm:num_requests_running", DECODE, 112.0),
            matrix(&[(112.0, "8"), (157.0, "12")]),
        ),
    ]))
    .await;
    let out = signals(&args(&fake.url(), "model-decode"), 100.0, 160.0).await;
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let d = &out.roles[1];
    assert_eq!(d.role, "decode");
    assert_eq!(d.kv_cache_usage_max, 0.97);
    assert_eq!(d.preemptions, 3.0000000002);
    assert_eq!(d.extra("kv_cache_usage_min"), Some(0.25));
    assert_eq!(d.extra("generation_tokens_per_second"), Some(1234.5));
    assert_eq!(d.extra("running_requests_p50"), Some(10.0));
    assert_eq!(out.roles[0].kv_cache_usage_max, 0.0);
}

#[tokio::test]
async fn missing_series_read_zero_after_all_fallbacks_and_are_recorded_missing() {
    let fake = FakeProm::start(answering(vec![])).await;
    let out = signals(&args(&fake.url(), "model-decode"), 100.0, 160.0).await;
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    for r in &out.roles {
        assert_eq!(r.waiting_requests_p50, 0.0);
        assert_eq!(r.ttft_p99_seconds, 0.0);
        assert_eq!(r.kv_cache_usage_max, 0.0);
        assert_eq!(r.preemptions, 0.0);
        assert!(r.extra.iter().all(|(_, v)| *v == 0.0));
        assert_eq!(r.extra.len(), 6);
    }
    // The zeros are not measurements: every signal of both roles is recorded
    // as missing, so each role as a whole found nothing.
    assert_eq!(out.coverage.len(), 2);
    for c in &out.coverage {
        assert_eq!(c.signals.len(), 10);
        assert!(c.nothing_found(), "{c:?}");
        assert!(c.signals.iter().all(|s| s.metric.is_none()));
    }
    // Each name of each family was tried, in order.
    let got: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| r.query().contains("vllm-decode") && r.query().starts_with("max("))
        .map(|r| r.query().to_string())
        .collect();
    assert_eq!(
        got,
        [
            gauge("max", "vllm:kv_cache_usage_perc", DECODE, 112.0),
            gauge("max", "vllm:gpu_cache_usage_perc", DECODE, 112.0),
            gauge("max", "vllm_kv_cache_usage_perc", DECODE, 112.0),
            gauge("max", "vllm_gpu_cache_usage_perc", DECODE, 112.0),
        ]
    );
    // 10 signals, 28 names in all, per role.
    assert_eq!(fake.requests().len(), 56);
}

#[tokio::test]
async fn fallback_name_with_data_is_used() {
    let fake = FakeProm::start(|req: &Req| {
        let body = if req.query()
            == gauge(
                "sum",
                "vllm_num_requests_waiting",
                r#"{job="vllm-aggregate",pod=~"m.*"}"#,
                12.0,
            ) {
            matrix(&[(1.0, "7")])
        } else {
            empty(req)
        };
        Answer::json(200, body)
    })
    .await;
    let out = signals(&args(&fake.url(), "m"), 0.0, 60.0).await;
    assert_eq!(out.roles.len(), 1);
    assert_eq!(out.roles[0].role, "aggregate");
    assert_eq!(out.roles[0].waiting_requests_p50, 7.0);
    let waiting = out.coverage[0].get("waiting_requests_p50").unwrap();
    assert_eq!(waiting.status, SeriesStatus::Found);
    assert_eq!(waiting.metric.as_deref(), Some("vllm_num_requests_waiting"));
    assert_eq!(out.coverage[0].status("preemptions"), SeriesStatus::Missing);
    assert!(!out.coverage[0].nothing_found());
}

#[tokio::test]
async fn short_stage_uses_whole_stage_and_ms_ranges() {
    let fake = FakeProm::start(answering(vec![])).await;
    let _ = signals(&args(&fake.url(), "m"), 10.0, 16.5).await;
    let reqs = fake.requests();
    let r = reqs
        .iter()
        .find(|r| r.query().starts_with("sum(vllm:num_requests_waiting"))
        .unwrap();
    assert_eq!(
        (r.num("start"), r.num("end"), r.num("step")),
        (10.0, 16.5, 0.2)
    );
    assert!(
        reqs.iter()
            .any(|r| r.query().contains("[6500ms]") && r.num("time") == 16.5),
        "{reqs:#?}"
    );
}

#[tokio::test]
async fn custom_selector_and_auth_headers_are_sent() {
    let fake = FakeProm::start(answering(vec![])).await;
    let mut a = args(&fake.url(), "m-decode");
    a.selectors = vec![
        r#"decode={namespace="ns",pod=~"isvc-predictor-.*"}"#
            .parse()
            .unwrap(),
    ];
    a.prometheus_bearer_token = Some("s3cret".into());
    a.prometheus_headers = vec![("X-Scope-OrgID".into(), "team-a".into())];
    let source = SignalSource::from_options(&a).await.unwrap().unwrap();
    assert_eq!(source.roles(), ["prefill", "decode"]);
    let described = source.describe();
    assert!(
        described.contains(r#"decode {namespace="ns",pod=~"isvc-predictor-.*"}"#),
        "{described}"
    );
    let _ = source.stage_signals(100.0, 160.0, Default::default()).await;
    let reqs = fake.requests();
    let waiting = gauge(
        "sum",
        "vllm:num_requests_waiting",
        r#"{namespace="ns",pod=~"isvc-predictor-.*"}"#,
        112.0,
    );
    assert!(reqs.iter().any(|r| r.query() == waiting));
    // Prometheus is told the per-query timeout too (default 10 s).
    assert!(reqs.iter().all(|r| r.params["timeout"] == "10.000"));
    assert!(
        reqs.iter()
            .all(|r| r.headers["authorization"] == "Bearer s3cret"
                && r.headers["x-scope-orgid"] == "team-a")
    );
}

#[tokio::test]
async fn settle_waits_until_the_stage_end_is_ingested() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    let fake = FakeProm::start(move |req: &Req| {
        if req.query().starts_with("max(timestamp(") {
            // The latest sample reaches the stage end (160) on the third poll.
            let n = c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let t = if n < 2 { "158" } else { "161" };
            return Answer::json(200, vector(1.0, t));
        }
        Answer::json(200, empty(req))
    })
    .await;
    let mut a = args(&fake.url(), "m");
    a.settle_wait = Duration::from_secs(20);
    let out = signals(&a, 100.0, 160.0).await;
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    let q = fake.requests()[0].query().to_string();
    assert_eq!(
        q,
        r#"max(timestamp({__name__=~"vllm:num_requests_waiting|vllm_num_requests_waiting",job="vllm-aggregate",pod=~"m.*"}))"#
    );

    // Never ingested: bounded wait, then an error naming the role.
    let fake = FakeProm::start(|req: &Req| {
        if req.query().starts_with("max(timestamp(") {
            return Answer::json(200, vector(1.0, "150"));
        }
        Answer::json(200, empty(req))
    })
    .await;
    a.prometheus_url = Some(fake.url());
    a.settle_wait = Duration::from_millis(600);
    let out = signals(&a, 100.0, 160.0).await;
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    assert!(
        out.errors[0].starts_with("aggregate: settle:"),
        "{:?}",
        out.errors
    );
}

/// Runs one stage against a fake that answers every query with `answer`,
/// and checks the fail-open contract: zero signals, errors naming the role
/// and the signal, each containing `expect`.
async fn fault(answer: impl Fn() -> Answer + Send + Sync + 'static, expect: &str) -> Vec<String> {
    let fake = FakeProm::start(move |_req: &Req| answer()).await;
    let mut a = args(&fake.url(), "m");
    a.prometheus_timeout = Duration::from_millis(300);
    fault_with(&a, expect).await
}

async fn fault_with(a: &SignalOptions, expect: &str) -> Vec<String> {
    let out = signals(a, 100.0, 160.0).await;
    assert_eq!(out.roles.len(), 1);
    let r = &out.roles[0];
    assert_eq!(
        (
            r.waiting_requests_p50,
            r.ttft_p99_seconds,
            r.kv_cache_usage_max,
            r.preemptions
        ),
        (0.0, 0.0, 0.0, 0.0)
    );
    assert!(r.extra.iter().all(|(_, v)| *v == 0.0), "{:?}", r.extra);
    assert!(!out.errors.is_empty());
    // A failure is recorded as such, not as a missing series.
    assert!(
        out.coverage[0].all(SeriesStatus::Failed),
        "{:?}",
        out.coverage
    );
    eprintln!("sample error: {}", out.errors[0]);
    for e in &out.errors {
        assert!(e.starts_with("aggregate: "), "{e}");
        assert!(e.contains(expect), "expected {expect:?} in {e}");
        assert!(e.len() < 700, "unbounded error: {e}");
    }
    out.errors
}

#[tokio::test]
async fn fault_http_500() {
    let errors = fault(
        || Answer::Now {
            status: 500,
            content_type: "text/plain",
            body: "internal server error".into(),
        },
        "prometheus: HTTP 500 with a non-API body: internal server error",
    )
    .await;
    assert_eq!(errors.len(), 10); // one per signal, naming it
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("aggregate: waiting_requests_p50: "))
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("aggregate: preemptions: "))
    );
}

#[tokio::test]
async fn fault_400_error_envelope() {
    fault(
        || {
            Answer::json(
                400,
                r#"{"status":"error","errorType":"bad_data","error":"parse error at 1:5: unexpected character"}"#,
            )
        },
        "prometheus: bad_data: parse error at 1:5: unexpected character (HTTP 400)",
    )
    .await;
}

/// A failed query is returned with the stage's signals, for the check to
/// say once with the stage's label: the source itself logs nothing of it
/// (each error was said twice).
#[test]
fn a_failed_query_is_returned_not_logged() {
    #[derive(Clone, Default)]
    struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .finish();
    let errors = tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let fake = FakeProm::start(|_: &Req| {
                Answer::json(
                    400,
                    r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
                )
            })
            .await;
            signals(&args(&fake.url(), "m"), 100.0, 160.0).await.errors
        })
    });
    assert!(errors.iter().any(|e| e.contains("bad_data")), "{errors:?}");
    let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(!logged.contains("bad_data"), "{logged}");
}

#[tokio::test]
async fn fault_503_timeout_envelope() {
    fault(
        || {
            Answer::json(
                503,
                r#"{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}"#,
            )
        },
        "prometheus: timeout: query timed out in expression evaluation (HTTP 503)",
    )
    .await;
}

#[tokio::test]
async fn fault_malformed_json() {
    fault(
        || {
            Answer::json(
                200,
                r#"{"status":"success","data":{"resultType":"matrix","result":[{"#,
            )
        },
        "prometheus: malformed response",
    )
    .await;
}

#[tokio::test]
async fn fault_html_502_is_excerpted() {
    let page = format!(
        "<html><head><title>502 Bad Gateway</title></head><body>{}</body></html>",
        "nginx ".repeat(2000)
    );
    let errors = fault(
        move || Answer::Now {
            status: 502,
            content_type: "text/html",
            body: page.clone(),
        },
        "prometheus: HTTP 502 with a non-API body: <html><head><title>502 Bad Gateway</title>",
    )
    .await;
    assert!(errors[0].contains("..."), "{}", errors[0]);
}

#[tokio::test]
async fn fault_hang_past_timeout() {
    let started = std::time::Instant::now();
    fault(
        || Answer::Hang,
        "no answer within 300ms (the query timeout)",
    )
    .await;
    // Bounded by the timeouts, nowhere near the 1 h hang.
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// With `--settle-wait 0s` nothing probes Prometheus first: once a query of
/// the check times out, the others fail at once instead of each waiting out
/// its own timeout (20 queries, 4 at a time, used to cost 5 timeouts).
#[tokio::test]
async fn a_hung_prometheus_costs_one_round_of_queries_per_check() {
    let fake = FakeProm::start(|_req: &Req| Answer::Hang).await;
    let mut a = args(&fake.url(), "m-decode");
    a.prometheus_timeout = Duration::from_millis(300);
    let out = signals(&a, 100.0, 160.0).await;
    // Only the first round of parallel queries was sent.
    let sent = fake.requests().len();
    assert!(sent <= MAX_PARALLEL_QUERIES, "{sent} queries sent");
    assert_eq!(out.errors.len(), 20, "{:?}", out.errors);
    let timed_out = out
        .errors
        .iter()
        .filter(|e| e.contains(": prometheus: no answer within 300ms"))
        .count();
    let skipped = out
        .errors
        .iter()
        .filter(|e| {
            e.contains(": prometheus: not queried: an earlier query of this check got no answer within 300ms")
        })
        .count();
    assert!(timed_out >= 1, "{:?}", out.errors);
    assert_eq!(timed_out + skipped, 20, "{:?}", out.errors);
    assert!(
        out.errors
            .iter()
            .any(|e| e.starts_with("decode: preemptions: "))
    );
}

/// The `/metrics` snapshot of a run's start and end (for `server.json`'s
/// fit) waits at most `SNAPSHOT_TIMEOUT` for a Prometheus that never
/// answers, all roles at once: it used to wait the query timeout (10 s)
/// per role, before the first stage and again after the last.
#[tokio::test]
async fn a_hung_prometheus_holds_the_metrics_snapshot_briefly() {
    let fake = FakeProm::start(|_req: &Req| Answer::Hang).await;
    let mut a = args(&fake.url(), "m-decode");
    a.prometheus_timeout = Duration::from_secs(10);
    let started = std::time::Instant::now();
    let texts = nyann_signals::metrics_texts(&a).await.unwrap();
    let took = started.elapsed();
    assert_eq!(texts.len(), 2, "one per role");
    for text in &texts {
        let err = text.text.as_ref().unwrap_err();
        assert!(err.contains("no answer within 2s"), "{err}");
    }
    // One snapshot timeout for both roles, far under one query timeout.
    assert!(took < nyann_signals::SNAPSHOT_TIMEOUT * 3, "{took:?}");
}

#[tokio::test]
async fn fault_connection_refused() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let a = args(&format!("http://127.0.0.1:{port}"), "m");
    let errors = fault_with(&a, &format!("request to http://127.0.0.1:{port}/api/v1/")).await;
    assert!(
        errors[0].to_lowercase().contains("connect"),
        "{}",
        errors[0]
    );
}

#[tokio::test]
async fn fault_nan_and_inf_values() {
    for v in ["NaN", "+Inf"] {
        let fake = FakeProm::start(move |req: &Req| {
            let body = if req.path.ends_with("query_range") {
                matrix(&[(112.0, v), (157.0, v)])
            } else {
                vector(157.0, v)
            };
            Answer::json(200, body)
        })
        .await;
        let a = args(&fake.url(), "m");
        let out = signals(&a, 100.0, 160.0).await;
        let r = &out.roles[0];
        assert_eq!(r.waiting_requests_p50, 0.0);
        assert_eq!(r.kv_cache_usage_max, 0.0);
        assert_eq!(r.preemptions, 0.0);
        // Gauges and counters: a non-finite value is an error. Quantiles:
        // NaN means "no observations" (idle here: nothing was seen waiting
        // or running), +Inf means "beyond the largest bucket" (here the
        // buckets cannot be read: the largest number).
        let errors: Vec<&String> = out
            .errors
            .iter()
            .filter(|e| e.contains(&format!("non-finite value {v}")))
            .collect();
        assert_eq!(errors.len(), 6, "{:?}", out.errors);
        assert_eq!(out.errors.len(), 6, "{:?}", out.errors);
        let expected_ttft = if v == "NaN" { 0.0 } else { f64::MAX };
        assert_eq!(r.ttft_p99_seconds, expected_ttft);
        assert_eq!(r.extra("itl_p50_seconds"), Some(expected_ttft));
        let ttft = out.coverage[0].get("ttft_p99_seconds").unwrap();
        let status = if v == "NaN" {
            SeriesStatus::NoObservations
        } else {
            SeriesStatus::Found
        };
        assert_eq!(ttft.status, status);
        assert_eq!(ttft.lower_bound, v == "+Inf");
    }
}

/// Answers the waiting requests and the TTFT quantiles of every stage with
/// `waiting` and NaN (no first token in the window), the rest empty.
fn no_first_token(waiting: &'static str) -> impl Fn(&Req) -> Answer + Send + Sync {
    move |req: &Req| {
        let q = req.query();
        let body = if q.starts_with("sum(vllm:num_requests_waiting{") {
            matrix(&[(112.0, waiting), (130.0, waiting), (157.0, waiting)])
        } else if q.starts_with("histogram_quantile(") {
            vector(157.0, "NaN")
        } else {
            empty(req)
        };
        Answer::json(200, body)
    }
}

/// A server so stalled that no request got its first token in the window
/// reads as the worst TTFT (at least the window's length, a lower bound),
/// never as an idle 0: 50 waiting requests and a NaN TTFT quantile.
#[tokio::test]
async fn no_first_token_while_requests_wait_is_a_stall_not_an_idle_server() {
    let fake = FakeProm::start(no_first_token("50")).await;
    let out = signals(&args(&fake.url(), "m"), 100.0, 160.0).await;
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let r = &out.roles[0];
    assert_eq!(r.waiting_requests_p50, 50.0);
    assert_eq!(r.ttft_p99_seconds, 45.0, "the steady window's length");
    assert_eq!(r.extra("ttft_p50_seconds"), Some(45.0));
    let ttft = out.coverage[0].get("ttft_p99_seconds").unwrap();
    assert_eq!(ttft.status, SeriesStatus::Found);
    assert!(ttft.lower_bound);
    // With the rule's thresholds (32 waiting, TTFT 2 s) the stage is congested.
    assert!(common::congested(&out.roles));
    // Inter-token latency is never read as a stall (prefill has none).
    assert_eq!(
        out.coverage[0].status("itl_p99_seconds"),
        SeriesStatus::NoObservations
    );

    // Idle: nothing waiting, nothing running, the client waited for nothing.
    let fake = FakeProm::start(no_first_token("0")).await;
    let out = signals(&args(&fake.url(), "m"), 100.0, 160.0).await;
    assert_eq!(out.roles[0].ttft_p99_seconds, 0.0);
    let ttft = out.coverage[0].get("ttft_p99_seconds").unwrap();
    assert_eq!(ttft.status, SeriesStatus::NoObservations);
    assert!(ttft.status.no_data() && !ttft.lower_bound);

    // Idle on the server's side, but a request of the client waited the
    // whole window for its first token (a server without queue metrics).
    let source = SignalSource::from_options(&args(&fake.url(), "m"))
        .await
        .unwrap()
        .unwrap();
    let client = nyann_signals::ClientEvidence {
        longest_first_token_wait_seconds: 50.0,
    };
    let out = source.stage_signals(100.0, 160.0, client).await;
    assert_eq!(out.roles[0].ttft_p99_seconds, 45.0);
    assert!(out.coverage[0].get("ttft_p99_seconds").unwrap().lower_bound);
}

/// A store that mishandles counter resets answers a negative increase: it
/// reads 0 like any fault, and is recorded as one (never silently).
#[tokio::test]
async fn a_negative_counter_increase_is_a_recorded_fault() {
    let fake = FakeProm::start(|req: &Req| {
        let q = req.query();
        let body = if q.starts_with("sum(increase(vllm:num_preemptions_total{") {
            vector(160.0, "-40")
        } else if q.starts_with("max(vllm:kv_cache_usage_perc{") {
            matrix(&[(112.0, "0.99"), (157.0, "0.99")])
        } else {
            empty(req)
        };
        Answer::json(200, body)
    })
    .await;
    let out = signals(&args(&fake.url(), "m"), 100.0, 160.0).await;
    assert_eq!(out.roles[0].kv_cache_usage_max, 0.99);
    assert_eq!(out.roles[0].preemptions, 0.0);
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    let e = &out.errors[0];
    assert!(
        e.starts_with("aggregate: preemptions: ")
            && e.contains("negative counter increase (-40)")
            && e.contains("mishandles counter resets"),
        "{e}"
    );
    assert_eq!(out.coverage[0].status("preemptions"), SeriesStatus::Failed);
}

/// A 10 MB answer of 400,000 points for one query: refused as beyond what a
/// range query can answer, in linear time, off the runtime, so that the
/// check's other queries, answered at once, are read (the quadratic reading
/// took about a minute per check, and the other queries were recorded as
/// unanswered within the timeout although they had been answered).
#[tokio::test]
async fn an_oversized_answer_is_refused_and_the_other_queries_are_read() {
    let huge = {
        let points: Vec<String> = (0..400_000)
            .map(|i| format!("[{:.3},\"7\"]", 1_700_000_000.0 + i as f64 * 0.001))
            .collect();
        format!(
            r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{}]}}]}}}}"#,
            points.join(",")
        )
    };
    assert!(huge.len() > 8_000_000, "{}", huge.len());
    let fake = FakeProm::start(move |req: &Req| {
        let q = req.query();
        let body = if q.starts_with("sum(vllm:num_requests_waiting{") {
            huge.clone()
        } else if q.starts_with("max(vllm:kv_cache_usage_perc{") {
            matrix(&[(112.0, "0.99"), (157.0, "0.99")])
        } else if q.starts_with("sum(increase(vllm:num_preemptions_total{") {
            vector(160.0, "12")
        } else {
            empty(req)
        };
        Answer::json(200, body)
    })
    .await;
    let mut a = args(&fake.url(), "m");
    a.prometheus_timeout = Duration::from_secs(30);
    let out = signals(&a, 100.0, 160.0).await;
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    assert!(
        out.errors[0].starts_with("aggregate: waiting_requests_p50: ")
            && out.errors[0].contains("400000 points"),
        "{:?}",
        out.errors
    );
    assert_eq!(out.roles[0].kv_cache_usage_max, 0.99);
    assert_eq!(out.roles[0].preemptions, 12.0);
}

/// A store answering `histogram_quantile` with +Inf (Prometheus answers the
/// largest finite bound instead): the signal reads the largest finite `le`
/// of the buckets, recorded as a lower bound, so the worst congestion cannot
/// read as none.
#[tokio::test]
async fn a_quantile_of_inf_reads_the_largest_bucket_bound_as_a_lower_bound() {
    let fake = FakeProm::start(|req: &Req| {
        let q = req.query();
        let body = if q.starts_with(
            "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{",
        ) {
            vector(157.0, "+Inf")
        } else if q.starts_with("histogram_quantile(") {
            vector(157.0, "0.25")
        } else if q.starts_with("count by (le) (vllm:time_to_first_token_seconds_bucket{") {
            labelled(&[
                (&[("le", "0.5")], "1"),
                (&[("le", "2560.0")], "1"),
                (&[("le", "+Inf")], "1"),
            ])
        } else {
            empty(req)
        };
        Answer::json(200, body)
    })
    .await;
    let out = signals(&args(&fake.url(), "m"), 100.0, 160.0).await;
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let r = &out.roles[0];
    assert_eq!(r.ttft_p99_seconds, 2560.0);
    assert_eq!(r.extra("ttft_p50_seconds"), Some(0.25));
    let c = &out.coverage[0];
    assert!(c.get("ttft_p99_seconds").unwrap().lower_bound);
    assert!(!c.get("ttft_p50_seconds").unwrap().lower_bound);
    // The bounds were asked at the end of the steady window.
    let bounds = fake
        .requests()
        .into_iter()
        .find(|r| r.query().starts_with("count by (le)"))
        .unwrap();
    assert_eq!(
        bounds.query(),
        r#"count by (le) (vllm:time_to_first_token_seconds_bucket{job="vllm-aggregate",pod=~"m.*"})"#
    );
    assert_eq!(bounds.num("time"), 157.0);
}

#[tokio::test]
async fn configuration_errors_are_typed() {
    let mut a = args("http://127.0.0.1:1", "m");
    a.scrape = vec!["127.0.0.1:2".parse().unwrap()];
    assert!(SignalSource::from_options(&a).await.is_err());
    let a = SignalOptions {
        prometheus_url: Some("http://127.0.0.1:1".into()),
        ..Default::default()
    };
    let e = SignalSource::from_options(&a).await.unwrap_err();
    assert_eq!(e, SignalError::NoRoles);
    let a = SignalOptions::default();
    assert!(SignalSource::from_options(&a).await.unwrap().is_none());
    let mut a = args("not a url", "m");
    assert!(SignalSource::from_options(&a).await.is_err());
    a.prometheus_url = Some("http://127.0.0.1:1".into());
    a.prometheus_headers = vec![("bad header".into(), "x".into())];
    assert!(SignalSource::from_options(&a).await.is_err());
}

#[tokio::test]
async fn unreachable_prometheus_is_probed_once_not_per_signal() {
    let fake = FakeProm::start(|_req: &Req| Answer::Hang).await;
    let mut a = args(&fake.url(), "m-decode");
    a.prometheus_timeout = Duration::from_millis(300);
    a.settle_wait = Duration::from_secs(5);
    let out = signals(&a, 100.0, 160.0).await;
    // One probe, then every signal of every role reported, none queried.
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(out.errors.len(), 20, "{:?}", out.errors);
    assert!(
        out.errors[0]
            .starts_with("prefill: waiting_requests_p50: prometheus: no answer within 300ms")
    );
    assert!(
        out.roles
            .iter()
            .all(|r| r.waiting_requests_p50 == 0.0 && r.preemptions == 0.0)
    );
}

/// The preflight's query of one role: `count by (__name__)` of every signal
/// name of the profile under the role's selector.
fn preflight_query(matchers: &str) -> String {
    format!(
        "count by (__name__) ({{__name__=~\"{}\",{matchers}}})",
        [
            "vllm:num_requests_waiting",
            "vllm_num_requests_waiting",
            "vllm:num_requests_running",
            "vllm_num_requests_running",
            "vllm:kv_cache_usage_perc",
            "vllm:gpu_cache_usage_perc",
            "vllm_kv_cache_usage_perc",
            "vllm_gpu_cache_usage_perc",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm_time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_bucket",
            "vllm:time_per_output_token_seconds_bucket",
            "vllm_inter_token_latency_seconds_bucket",
            "vllm_time_per_output_token_seconds_bucket",
            "vllm:num_preemptions_total",
            "vllm_num_preemptions_total",
            "vllm:generation_tokens_total",
            "vllm_generation_tokens_total",
        ]
        .join("|")
    )
}

/// Prefill finds every signal; decode's selector finds nothing, while the
/// targets Prometheus has include a decode pod under another name.
fn one_role_blind(req: &Req) -> Answer {
    let q = req.query();
    let body = if q == preflight_query(&PREFILL[1..PREFILL.len() - 1]) {
        every_vllm_series()
    } else if q.starts_with("count by (__name__, job, namespace, pod, instance) (") {
        labelled(&[
            (
                &[
                    ("__name__", "vllm:num_requests_waiting"),
                    ("job", "vllm-decode"),
                    ("pod", "mymodel-decode-0"),
                ],
                "1",
            ),
            (
                &[
                    ("__name__", "vllm:num_requests_waiting"),
                    ("job", "vllm-prefill"),
                    ("pod", "mymodel-prefill-0"),
                ],
                "1",
            ),
        ])
    } else {
        empty(req)
    };
    Answer::json(200, body)
}

#[tokio::test]
async fn preflight_refuses_a_role_that_finds_nothing_and_says_what_exists() {
    let fake = FakeProm::start(one_role_blind).await;
    let a = args(&fake.url(), "model-decode");
    let source = SignalSource::from_options(&a).await.unwrap().unwrap();
    let e = source.preflight().await.unwrap_err();
    let SignalError::NothingFound(nothing) = &e else {
        panic!("{e:?}");
    };
    assert_eq!(
        nothing.roles[0].hints[0],
        Hint {
            found:
                "found job=\"vllm-decode\", pod=\"mymodel-decode-0\" (vllm:num_requests_waiting)"
                    .into(),
            suggestions: vec![Suggestion::DeployName("mymodel-decode".into())],
        }
    );
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "role decode: no series of any signal in Prometheus {} at selector {DECODE} (vLLM names, e.g. vllm:num_requests_waiting, vllm_num_requests_waiting)",
            fake.url()
        )),
        "{text}"
    );
    assert!(
        text.contains(
            "\n  found job=\"vllm-decode\", pod=\"mymodel-decode-0\" (vllm:num_requests_waiting); did you mean deployment name mymodel-decode?"
        ),
        "{text}"
    );
    assert!(text.contains("allow missing signals"), "{text}");
    assert!(!text.contains("role prefill"), "{text}");
    // One query per role, then one for the candidates.
    let queries: Vec<String> = fake
        .requests()
        .iter()
        .map(|r| r.query().to_string())
        .collect();
    assert_eq!(queries.len(), 3, "{queries:#?}");
    assert_eq!(queries[1], preflight_query(&DECODE[1..DECODE.len() - 1]));

    // Missing signals allowed: the refusal becomes a warning.
    let mut a = a;
    a.allow_missing_signals = true;
    let source = SignalSource::from_options(&a).await.unwrap().unwrap();
    let warnings = source.preflight().await.unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let PreflightWarning::Blind(blind) = &warnings[0] else {
        panic!("{warnings:?}");
    };
    assert!(
        blind
            .summary
            .starts_with("role decode: no series of any signal")
    );
    assert!(warnings[0].to_string().contains("starting anyway"));
}

/// The server's series carry no label at all (a Prometheus scraping one
/// server under a relabelling that drops them): nothing can select them
/// apart, so no selector is suggested (`{}` would match everything).
#[tokio::test]
async fn preflight_suggests_no_selector_for_series_without_labels() {
    let fake = FakeProm::start(|req: &Req| {
        let body = if req
            .query()
            .starts_with("count by (__name__, job, namespace, pod, instance) (")
        {
            labelled(&[(&[("__name__", "vllm:num_requests_waiting")], "1")])
        } else {
            empty(req)
        };
        Answer::json(200, body)
    })
    .await;
    let source = SignalSource::from_options(&args(&fake.url(), "m"))
        .await
        .unwrap()
        .unwrap();
    let e = source.preflight().await.unwrap_err();
    let SignalError::NothingFound(nothing) = &e else {
        panic!("{e:?}");
    };
    assert_eq!(
        nothing.roles[0].hints,
        [Hint {
            found:
                "found vllm:num_requests_waiting without a job, namespace, pod or instance label"
                    .into(),
            suggestions: vec![],
        }]
    );
    let text = e.to_string();
    assert!(
        !text.contains("'{}'") && !text.contains("did you mean"),
        "{text}"
    );
}

#[tokio::test]
async fn preflight_warns_once_per_missing_signal() {
    let fake = FakeProm::start(|req: &Req| {
        let body = if req.query().starts_with("count by (__name__) (") {
            labelled(&[
                (&[("__name__", "vllm_num_requests_waiting")], "2"),
                (&[("__name__", "vllm_kv_cache_usage_perc")], "2"),
                (
                    &[("__name__", "vllm_time_to_first_token_seconds_bucket")],
                    "46",
                ),
                (
                    &[("__name__", "vllm_inter_token_latency_seconds_bucket")],
                    "40",
                ),
                (&[("__name__", "vllm_num_requests_running")], "2"),
                (&[("__name__", "vllm_generation_tokens_total")], "2"),
            ])
        } else {
            empty(req)
        };
        Answer::json(200, body)
    })
    .await;
    let source = SignalSource::from_options(&args(&fake.url(), "m"))
        .await
        .unwrap()
        .unwrap();
    let warnings = source.preflight().await.unwrap();
    assert_eq!(
        warnings,
        [PreflightWarning::Missing(format!(
            "role aggregate: no series for preemptions in Prometheus {} at selector {{job=\"vllm-aggregate\",pod=~\"m.*\"}} (tried vllm:num_preemptions_total, vllm_num_preemptions_total): preemptions read 0 at every stage, recorded as no data",
            fake.url()
        ))]
    );
}

#[tokio::test]
async fn preflight_fails_when_prometheus_is_down_or_refuses_the_query() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let source = SignalSource::from_options(&args(&url, "m"))
        .await
        .unwrap()
        .unwrap();
    let e = source.preflight().await.unwrap_err();
    assert!(matches!(e, SignalError::Unreachable { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "cannot read server signals from Prometheus {url} before the first stage: prometheus: request to {url}/api/v1/query failed: "
        )),
        "{text}"
    );

    // A selector Prometheus cannot parse is found now, not at every stage.
    let fake = FakeProm::start(|_req: &Req| {
        Answer::json(
            400,
            r#"{"status":"error","errorType":"bad_data","error":"1:40: parse error: unexpected character"}"#,
        )
    })
    .await;
    let mut a = args(&fake.url(), "m");
    a.selectors = vec!["aggregate={job=\"x\" pod=\"y\"}".parse().unwrap()];
    let source = SignalSource::from_options(&a).await.unwrap().unwrap();
    let text = source.preflight().await.unwrap_err().to_string();
    assert!(text.contains("bad_data: 1:40: parse error"), "{text}");
}
