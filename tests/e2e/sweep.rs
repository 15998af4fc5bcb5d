//! The congestion-stopped sweep end to end: simulator, real
//! Prometheus or direct scraping, built-in and custom policies.
//!
//! The simulator's default profile (seed 1) with the default workload (isl
//! 128, osl 256) fills its KV cache and preempts from concurrency ~12-16 on;
//! at c=8 KV usage stays near 65-75% with no preemption, and client TTFT p99
//! near 50 ms against ~400 ms at c=16. Every threshold below sits well away
//! from those figures, so the stage a sweep stops at does not depend on luck.

use std::net::SocketAddr;
use std::time::Duration;

use nyann_testkit::exporter::{Engine, Exporter};
use nyann_testkit::{PrometheusServer, ScrapeJob};

use crate::support::{
    generate, nyann_bench, policy_wasm, refused, scrape_flags, serial, simulator, sweep,
};

/// Thresholds the simulator crosses at c=16 (KV pressure with preemptions)
/// and not before; the queueing rule is out of reach at c <= 16.
///
/// Preemptions tell the two apart: at c=8 the longest sequences fill at
/// most 8 x 24 of 224 KV blocks, so nothing can be preempted, while c=16
/// preempts dozens of times. The KV threshold is generous (0.8) because the
/// usage swings by a sequence's blocks at each preemption, and three 1-s
/// samples of a 3-s stage can miss every peak above 0.95 (one run read
/// 93.8% with 41 preemptions on a loaded machine).
pub const STOPS_AT_16: &str =
    r#"waiting_requests_p50=8, ttft_p99="1s", kv_cache_usage=0.8, preemptions=1"#;

/// Thresholds no stage reaches.
const NEVER: &str =
    r#"waiting_requests_p50=100000, ttft_p99="1h", kv_cache_usage=1.0, preemptions=1000000"#;

/// Concurrency 4, 8, 16, 32: index 2 is c=16.
pub const LEVELS: [u32; 4] = [4, 8, 16, 32];

fn assert_stopped_at_c16(run: &crate::support::Run) {
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    for earlier in 0..2 {
        assert_eq!(run.status(earlier), "measured");
        assert!(
            !run.congested(earlier),
            "stage {earlier}: {}",
            run.congestion(earlier)
        );
    }
    assert_eq!(
        run.status(2),
        "measured",
        "the congested stage stays in the results"
    );
    assert!(run.congested(2), "{}", run.congestion(2));
    let reasons = run.congestion(2)["verdict"]["reasons"].to_string();
    assert!(reasons.contains("KV cache on aggregate"), "{reasons}");
    assert_eq!(run.status(3), "skipped");
    assert!(
        run.stage(3)["skip_reason"]
            .as_str()
            .unwrap()
            .contains("congested")
    );
    assert!(run.stderr().contains("CONGESTED"), "{}", run.stderr());
}

async fn prometheus_for(jobs: &[(&str, SocketAddr, &str)]) -> PrometheusServer {
    let jobs: Vec<ScrapeJob> = jobs
        .iter()
        .map(|(job, addr, pod)| ScrapeJob::new(job).target(*addr, &[("pod", pod)]))
        .collect();
    PrometheusServer::start(&jobs)
        .await
        .expect("Prometheus starts (apt-get install prometheus)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregate_with_prometheus_stops_at_the_known_stage() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let prom = prometheus_for(&[("vllm-aggregate", sim.endpoint(), "sim-0")]).await;
    let run = generate(
        &sim,
        &sweep(&LEVELS, STOPS_AT_16),
        &[
            "--prometheus-url".into(),
            prom.url(),
            "--deploy-name".into(),
            "sim".into(),
        ],
    )
    .await;
    assert_stopped_at_c16(&run);
    let roles = &run.congestion(2)["roles"];
    assert_eq!(roles[0]["role"], "aggregate");
    assert!(roles[0]["preemptions"].as_f64().unwrap() >= 1.0, "{roles}");
    assert_eq!(run.congestion(2)["signal_errors"], serde_json::json!([]));
    // The engine's configuration, as Prometheus has it, saved for `sim fit`.
    for moment in ["start", "end"] {
        let saved = run.dir().join(format!("metrics/aggregate-0-{moment}.txt"));
        let text = std::fs::read_to_string(&saved).unwrap_or_else(|e| panic!("{saved:?}: {e}"));
        assert!(
            text.starts_with("vllm:cache_config_info{") && text.contains("num_gpu_blocks=\""),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_source_stops_at_the_same_stage() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let run = generate(&sim, &sweep(&LEVELS, STOPS_AT_16), &scrape_flags(&sim)).await;
    assert_stopped_at_c16(&run);
    assert_eq!(run.congestion(2)["policy"]["name"], "builtin");
    assert!(run.congestion(2)["check_seconds"].as_f64().unwrap() >= 0.0);
}

/// Scripted prefill and decode exporters scraped by a real Prometheus as
/// jobs `vllm-prefill` and `vllm-decode`, with `--deploy-name sim-decode`:
/// the built-in policy's role rules with exactly known signals. The load itself
/// goes to the simulator.
async fn disaggregated_run(
    prefill: Engine,
    decode: Engine,
    ticks: impl Fn(&mut Engine, &mut Engine) + Send + 'static,
) -> crate::support::Run {
    let sim = simulator(false).await;
    let prefill = Exporter::start(prefill).await;
    let decode = Exporter::start(decode).await;
    let prom = prometheus_for(&[
        ("vllm-prefill", prefill.addr, "sim-prefill-0"),
        ("vllm-decode", decode.addr, "sim-decode-0"),
    ])
    .await;
    // Counters and histograms move every 100 ms, bounded to 2 minutes.
    let (p, d) = (prefill.engine.clone(), decode.engine.clone());
    let driver = tokio::spawn(async move {
        for _ in 0..1200 {
            ticks(&mut p.lock().unwrap(), &mut d.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let run = generate(
        &sim,
        &sweep(
            &[2, 2, 2],
            r#"waiting_requests_p50=32, ttft_p99="2s", kv_cache_usage=0.95, preemptions=2"#,
        ),
        &[
            "--prometheus-url".into(),
            prom.url(),
            "--deploy-name".into(),
            "sim-decode".into(),
        ],
    )
    .await;
    driver.abort();
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disaggregated_queueing_on_prefill_and_ttft_on_decode_stops() {
    let _serial = serial().await;
    let mut prefill = Engine::new();
    prefill.waiting = 40.0;
    let run = disaggregated_run(prefill, Engine::new(), |_, decode| decode.observe_ttft(3.0)).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(0), "{}", run.stderr());
    let record = run.congestion(0);
    let roles: Vec<&str> = record["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["prefill", "decode"]);
    let reasons = record["verdict"]["reasons"].to_string();
    assert!(
        reasons.contains("waiting p50 40 on prefill") && reasons.contains("on decode"),
        "{reasons}"
    );
    assert_eq!(run.status(1), "skipped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disaggregated_kv_on_decode_with_preemptions_on_prefill_does_not_stop() {
    let _serial = serial().await;
    let mut decode = Engine::new();
    decode.kv = 0.99;
    let run = disaggregated_run(Engine::new(), decode, |prefill, _| {
        prefill.preemptions += 1.0
    })
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), None, "{}", run.stderr());
    for stage in 0..3 {
        assert_eq!(run.status(stage), "measured");
        assert!(!run.congested(stage), "{}", run.congestion(stage));
        let roles = &run.congestion(stage)["roles"];
        assert!(
            roles[0]["preemptions"].as_f64().unwrap() >= 2.0,
            "prefill preempts: {roles}"
        );
        assert!(
            roles[1]["kv_cache_usage_max"].as_f64().unwrap() >= 0.95,
            "decode KV: {roles}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_policies_stop_where_their_rules_say() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    // client-slo: client TTFT p99 over 200 ms (c=8 ~50 ms, c=16 ~400 ms).
    let slo = policy_wasm("client-slo-policy");
    let mut args = scrape_flags(&sim);
    args.extend(["--policy".into(), slo.display().to_string()]);
    let run = generate(&sim, &sweep(&LEVELS, r#"ttft_p99="200ms""#), &args).await;
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    assert_eq!(run.congestion(2)["policy"]["name"], "client-slo");
    assert!(
        run.congestion(2)["verdict"]["reasons"]
            .to_string()
            .contains("client TTFT p99")
    );

    // throughput-knee: output tokens/s grew < 50% while TTFT p99 more than
    // doubled; at c=8 TTFT barely moves, at c=16 it grows ~8x and throughput
    // ~25%.
    let knee = policy_wasm("throughput-knee-policy");
    let mut args = scrape_flags(&sim);
    args.extend(["--policy".into(), knee.display().to_string()]);
    let run = generate(
        &sim,
        &sweep(
            &LEVELS,
            "min_throughput_gain_pct=50, max_ttft_growth_pct=100",
        ),
        &args,
    )
    .await;
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    assert_eq!(run.congestion(2)["policy"]["name"], "throughput-knee");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_killed_mid_run_fails_open() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let prom = prometheus_for(&[("vllm-aggregate", sim.endpoint(), "sim-0")]).await;
    let url = prom.url();
    let config = crate::support::sweep(&[4, 4, 4, 4], NEVER);
    // Prometheus dies during the second stage; the sweep must go on.
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(4)).await;
        drop(prom);
    });
    let run = generate(
        &sim,
        &config,
        &[
            "--prometheus-url".into(),
            url,
            "--deploy-name".into(),
            "sim".into(),
            "--settle-wait".into(),
            "2s".into(),
        ],
    )
    .await;
    killer.await.unwrap();
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), None);
    for stage in 0..4 {
        assert_eq!(run.status(stage), "measured");
    }
    let last = run.congestion(3);
    assert!(
        !last["signal_errors"].as_array().unwrap().is_empty(),
        "errors recorded: {last}"
    );
    assert_eq!(
        last["verdict"]["congested"], false,
        "missing signals read as zero: {last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trapping_policy_is_recorded_and_fails_open_unless_told_to_stop() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let hostile = policy_wasm("hostile-policy");
    let mut args = scrape_flags(&sim);
    args.extend(["--policy".into(), hostile.display().to_string()]);
    let config = sweep(&[2, 2, 2], r#"mode="panic""#);

    let run = generate(&sim, &config, &args).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), None);
    for stage in 0..3 {
        let error = run.congestion(stage)["policy_error"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            error.contains("policy hostile") && error.contains("panicked"),
            "stage {stage}: {error}"
        );
    }

    args.extend(["--on-policy-error".into(), "stop".into()]);
    let run = generate(&sim, &config, &args).await;
    assert_eq!(
        run.code(),
        Some(1),
        "a policy error that stops the sweep is an error: {}",
        run.stderr()
    );
    assert_eq!(run.stopped_at(), Some(0));
    assert_eq!(run.status(1), "skipped");
    assert_eq!(run.congestion(0)["stopped"], true);

    // Two sweeps: the first stopped by the failed call, the second (later)
    // by a congested verdict. The run's outcome names the later stop; the
    // exit code still reports the failed call.
    let two_sweeps = "scenario(\n    workload = workload(\"faker\", isl=128, osl=256),\n    stages = \
        until_congested([stage(\"2s\", concurrency=2) for _ in range(2)], mode=\"panic\")\n        \
        + until_congested([stage(\"2s\", concurrency=2) for _ in range(2)], mode=\"congested\"),\n)\n";
    let run = generate(&sim, two_sweeps, &args).await;
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    assert_eq!(run.status(1), "skipped");
    assert_eq!(run.status(3), "skipped");
    assert_eq!(
        run.code(),
        Some(1),
        "a policy error that stopped an earlier sweep is an error: {}",
        run.stderr()
    );
}

/// `refine=3`: after the sweep stops at c=32, three more stages between
/// c=8 (clean) and c=32, each judged like the sweep's; the first, c=20, is
/// past the simulator's knee (~12-16) by far. Where the search ends inside
/// 8..20 depends on the stages near the knee, so the bounds are checked,
/// not their exact values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sweep_searches_its_capacity_with_refine() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let scenario = sweep(&[8, 32, 128], &format!("{STOPS_AT_16}, refine=3"));
    let run = generate(&sim, &scenario, &scrape_flags(&sim)).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(1), "{}", run.stderr());
    assert_eq!(run.status(2), "skipped");
    let stages = run.stages();
    assert_eq!(stages.len(), 6, "{}", run.stderr());
    for (index, stage) in stages.iter().enumerate().skip(3) {
        assert_eq!(stage["index"], index);
        assert_eq!(stage["search"]["refines"], 1);
        assert_eq!(run.status(index), "measured");
        assert!(run.congestion(index)["verdict"].is_object());
    }
    assert_eq!(run.stage(3)["concurrency"], 20);
    assert!(run.congested(3), "{}", run.congestion(3));
    let capacity = &run.summary["conclusion"]["sweeps"][0]["capacity"];
    let level = |which: &str| capacity[which]["concurrency"].as_u64().unwrap();
    let (clean, congested) = (level("clean"), level("congested"));
    assert!(
        8 <= clean && clean < congested && congested <= 20,
        "{capacity}"
    );
    assert_eq!(capacity["stages"].as_array().unwrap().len(), 3);
    // One answer: the clean bound is the knee, its figures said with it.
    let knee = &run.summary["conclusion"]["sweeps"][0]["knee"];
    assert_eq!(knee["concurrency"].as_u64(), Some(clean), "{knee}");
    let line = format!(" not congested, concurrency={congested} congested (3 search stages, ");
    assert!(run.stderr().contains(&line), "{}", run.stderr());
    assert!(
        run.stderr()
            .contains(&format!("capacity: concurrency={clean} (#")),
        "{}",
        run.stderr()
    );
    assert!(
        !run.stderr().contains("knee (congested from"),
        "{}",
        run.stderr()
    );
    crate::support::validate_against_schema(run.dir());
}

/// A server with 22 slots and 500 ms of service (`nyann_testkit::queue`):
/// at concurrency c, `c - 22` requests wait, so the queueing rule (waiting
/// p50 >= 1; the TTFT threshold is below any reply's 500 ms) congests it
/// from c=23 up and at no level below, on any machine. Scraped every
/// 200 ms: a 2-second stage's steady window holds about 7 samples, and a
/// sample misses the one waiting request at c=23 only in the instant
/// between a reply and the client's next request (one in ~23 ms).
async fn search_against_22_slots(levels: &[u32], refine: &str) -> crate::support::Run {
    use nyann_testkit::queue::{Queue, QueueServer};
    let server = QueueServer::start(Queue {
        slots: 22,
        service: Duration::from_millis(500),
        serves_abandoned: false,
    })
    .await;
    let scenario = format!(
        "scenario(\n    workload = workload(\"faker\", isl=16, osl=1),\n    stages = until_congested(\n        \
         [stage(\"2s\", concurrency=c) for c in [{}]],\n        \
         waiting_requests_p50=1, ttft_p99=\"5ms\", {refine},\n    ),\n)\n",
        crate::support::starlark_list(levels)
    );
    let args = [
        "--scrape".to_string(),
        format!("aggregate={}", server.metrics_url()),
        "--scrape-interval".into(),
        "200ms".into(),
    ];
    crate::support::generate_at(&server.base_url(), &scenario, &args).await
}

/// A search whose bounds the sweep set already (c=16 clean, c=32
/// congested, `resolution=16`) runs no stage, and its capacity is said all
/// the same, in `summary.json` and on the terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_that_needs_no_stage_says_the_capacity() {
    use nyann_testkit::queue::{Queue, QueueServer};
    let _serial = serial().await;
    let server = QueueServer::start(Queue {
        slots: 22,
        service: Duration::from_millis(500),
        serves_abandoned: false,
    })
    .await;
    let scenario = "scenario(\n    workload = workload(\"faker\", isl=16, osl=1),\n    \
                    stages = until_congested([stage(\"2s\", concurrency=c) for c in [16, 32]],\n        \
                    waiting_requests_p50=1, ttft_p99=\"5ms\", refine=4, resolution=16),\n)\n";
    let args = [
        "--scrape".to_string(),
        format!("aggregate={}", server.metrics_url()),
        "--scrape-interval".into(),
        "200ms".into(),
    ];
    let run = crate::support::generate_at(&server.base_url(), scenario, &args).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(1), "{}", run.stderr());
    assert_eq!(searched(&run), (vec![], 16, 32), "{}", run.stderr());
    let capacity = &run.summary["conclusion"]["sweeps"][0]["capacity"];
    assert_eq!(capacity["gap"], 16.0, "{capacity}");
    assert_eq!(capacity["resolution"], 16.0, "{capacity}");
    assert_eq!(run.congestion(1)["refine"]["stages"], 4);
    assert!(
        run.stderr().contains(
            " not congested, concurrency=32 congested (no search stage needed: the sweep's \
             levels are within the resolution)"
        ),
        "{}",
        run.stderr()
    );
    crate::support::validate_against_schema(run.dir());
}

/// The levels a run's search stages tried, and its capacity's bounds.
fn searched(run: &crate::support::Run) -> (Vec<u64>, u64, u64) {
    let tried = run
        .stages()
        .iter()
        .filter(|stage| stage["search"].is_object())
        .map(|stage| stage["concurrency"].as_u64().unwrap())
        .collect();
    let capacity = &run.summary["conclusion"]["sweeps"][0]["capacity"];
    let level = |which: &str| capacity[which]["concurrency"].as_u64().unwrap_or(0);
    (tried, level("clean"), level("congested"))
}

/// Issue 27's scripted case: grid [8, 32, 128] stops at 32; `refine=5`
/// bisects 8..32 (20 clean, 26 and 23 congested, 21 and 22 clean) to the
/// exact capacity: 22 streams, congested from 23, through the built-in
/// policy, scraped signals and the real binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_search_finds_the_exact_level_a_server_congests_at() {
    let _serial = serial().await;
    let run = search_against_22_slots(&[8, 32, 128], "refine=5").await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(1), "{}", run.stderr());
    assert_eq!(
        searched(&run),
        (vec![20, 26, 23, 21, 22], 22, 23),
        "{}",
        run.stderr()
    );
    assert!(
        run.stderr()
            .contains(" not congested, concurrency=23 congested (5 search stages, "),
        "{}",
        run.stderr()
    );
    // One waiting request against a threshold of one: the verdict at 23
    // sits on the threshold, and the result says so.
    assert!(
        run.stderr()
            .contains("close call: concurrency=23 was judged congested at a threshold; "),
        "{}",
        run.stderr()
    );
    let capacity = &run.summary["conclusion"]["sweeps"][0]["capacity"];
    assert_eq!(capacity["congested"]["margin"], 0.0, "{capacity}");
    assert_eq!(capacity["clean"]["margin"], -1.0, "{capacity}");
    crate::support::validate_against_schema(run.dir());
}

/// `confirm=1`: the verdict at c=23 sits on the threshold (one waiting
/// request against 1), so it is judged once more before the search moves
/// on; both say congested, and the answer says the level was confirmed.
/// Clear verdicts (20, 26, 21, 22) are judged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_call_in_a_search_is_judged_again_with_confirm() {
    let _serial = serial().await;
    let run = search_against_22_slots(&[8, 32, 128], "refine=5, confirm=1").await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(
        searched(&run),
        (vec![20, 26, 23, 23, 21, 22], 22, 23),
        "{}",
        run.stderr()
    );
    let capacity = &run.summary["conclusion"]["sweeps"][0]["capacity"];
    assert_eq!(
        capacity["confirmed"],
        serde_json::json!([{"concurrency": 23, "verdicts": 2, "congested_verdicts": 2, "congested": true}]),
        "{capacity}"
    );
    assert!(
        run.stderr().contains(
            "(6 search stages, 12s of load; concurrency=23 judged 2 times (2 congested): congested)"
        ),
        "{}",
        run.stderr()
    );
    // Confirmed: no close call is said of it.
    assert!(!run.stderr().contains("close call"), "{}", run.stderr());
    crate::support::validate_against_schema(run.dir());
}

/// The first stage (c=32) is already congested: the search halves down to
/// a clean level (16), then bisects up to the same 22/23.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_congested_first_stage_searches_down_to_the_capacity() {
    let _serial = serial().await;
    let run = search_against_22_slots(&[32, 64], "refine=5").await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(0), "{}", run.stderr());
    assert_eq!(
        searched(&run),
        (vec![16, 24, 20, 22, 23], 22, 23),
        "{}",
        run.stderr()
    );
}

/// A server that serves what its clients gave up on (4 slots, 250 ms each,
/// no abort on disconnect) against a client that gives up after 400 ms:
/// every congested stage leaves a queue on the server that outlives the
/// client's own drain. Each search stage waits for that queue to drain, so
/// c=4 (no request waits) is judged clean, and the capacity is 4/5. Without
/// the wait (`--server-drain-wait 0s`), c=4 is judged on the queue c=8 left
/// and the search finds nothing clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_stage_waits_for_the_server_to_drain_what_the_stage_before_left() {
    use nyann_testkit::queue::{Queue, QueueServer};
    let _serial = serial().await;
    let server = QueueServer::start(Queue {
        slots: 4,
        service: Duration::from_millis(250),
        serves_abandoned: true,
    })
    .await;
    let scenario = "scenario(\n    workload = workload(\"faker\", isl=16, osl=1),\n    \
                    stages = until_congested([stage(\"2s\", concurrency=16)],\n        \
                    waiting_requests_p50=1, ttft_p99=\"5ms\", refine=4),\n)\n";
    let args = [
        "--scrape".to_string(),
        format!("aggregate={}", server.metrics_url()),
        "--scrape-interval".into(),
        "100ms".into(),
        "--request-timeout".into(),
        "400ms".into(),
        "--drain-timeout".into(),
        "100ms".into(),
        "--max-consecutive-errors".into(),
        "0".into(),
    ];
    let run = crate::support::generate_at(&server.base_url(), scenario, &args).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(searched(&run), (vec![8, 4, 6, 5], 4, 5), "{}", run.stderr());
    assert!(
        run.stderr().contains(
            "capacity search: waiting (at most 1m) for the requests waiting on the server to drain"
        ),
        "{}",
        run.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_mode_records_every_verdict_and_never_stops() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let mut args = scrape_flags(&sim);
    args.extend(["--policy-mode".into(), "monitor".into()]);
    let run = generate(&sim, &sweep(&[16, 32, 32], STOPS_AT_16), &args).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), None);
    for stage in 0..3 {
        assert_eq!(run.status(stage), "measured");
        assert!(
            run.congested(stage),
            "stage {stage}: {}",
            run.congestion(stage)
        );
        assert_eq!(run.congestion(stage)["mode"], "monitor");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_condition_without_a_signal_source_fails_before_any_load() {
    let stderr = refused(&sweep(&[4], STOPS_AT_16), false, &[]).await;
    assert!(
        stderr.contains("--prometheus-url") && stderr.contains("--scrape"),
        "{stderr}"
    );
}

/// The error points at the keyword (line 5, column 33: `ttft=`), not at
/// the `until_congested(` line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_policy_parameters_point_at_the_keyword() {
    let stderr = refused(
        &sweep(&[4], r#"waiting_requests_p50=8, ttft="1s""#),
        true,
        &[],
    )
    .await;
    assert!(
        stderr.contains("bad.star:5:33: until_congested(...): unknown parameter `ttft`"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_ca_certificate_fails_before_any_load() {
    let stderr = refused(
        &sweep(&[4], STOPS_AT_16),
        true,
        &["--ca-cert", "/nonexistent/ca.pem"],
    )
    .await;
    assert!(
        stderr.contains("invalid --ca-cert: cannot read /nonexistent/ca.pem: "),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_and_names_the_congested_stage() {
    let _serial = serial().await;
    let out = nyann_bench().arg("demo").output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("CONGESTED"), "{stderr}");
    assert!(
        stderr.contains("sweep stopped after stage #2 c=16: congested"),
        "{stderr}"
    );
    // A log, not a terminal: no escape codes, a line per stage start and end.
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
    for stage in ["#0 c=4", "#1 c=8", "#2 c=16"] {
        assert!(
            stderr.contains(&format!("stage {stage}: started for 4s")),
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!("stage {stage}: ended: ")),
            "{stderr}"
        );
    }

    // -q: the verdict line alone.
    let quiet = nyann_bench().args(["demo", "-q"]).output().await.unwrap();
    assert_eq!(quiet.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&quiet.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("sweep stopped after stage #2 c=16: congested"),
        "{stderr}"
    );
}

/// Two workloads characterised in one run: each `until_congested(...)` is
/// a sweep of its own. The first stops at its c=16 and skips only its own
/// c=32; the second still runs, from its c=4 up to its own stop.
///
/// Between them, a drained barrier and a 2-second rest at c=1: a 3-second
/// stage is judged over its whole length, and a signal's first point is
/// the last sample at or before the stage's start (Prometheus's range-query
/// rule, which both sources follow). Straight after the first sweep's c=16,
/// that sample is its preempting tail, and the second sweep's c=4 read
/// 8 preemptions and 86% KV usage that were not its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sweep_stops_on_its_own() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let scenario = format!(
        "chat = workload(\"faker\", isl=128, osl=256)\n\
         scenario(\n    workload = chat,\n    stages = \
         until_congested([stage(\"3s\", concurrency=c) for c in [4, 8, 16, 32]], {STOPS_AT_16})\n        \
         + [barrier(drain=True), stage(\"2s\", concurrency=1, name=\"rest\")]\n        \
         + until_congested([stage(\"3s\", concurrency=c, workload=chat) for c in [4, 16, 32]], {STOPS_AT_16}),\n)\n"
    );
    let run = generate(&sim, &scenario, &scrape_flags(&sim)).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let statuses: Vec<_> = (0..9).map(|i| run.status(i)).collect();
    assert_eq!(
        statuses,
        [
            "measured", "measured", "measured", "skipped", "barrier", "measured", "measured",
            "measured", "skipped"
        ],
        "{}",
        run.stderr()
    );
    let congested: Vec<_> = [0, 1, 2, 6, 7].map(|i| run.congested(i)).to_vec();
    assert_eq!(
        congested,
        [false, false, true, false, true],
        "{}",
        run.stderr()
    );
    assert!(
        run.stage(3)["skip_reason"]
            .as_str()
            .unwrap()
            .contains("#2 c=16"),
        "{}",
        run.stage(3)
    );
    let sweeps: Vec<_> = run.stages().iter().map(|s| s["sweep"].as_u64()).collect();
    let (first, second) = (Some(0), Some(1));
    assert_eq!(
        sweeps,
        [
            first, first, first, first, None, None, second, second, second
        ],
        "stages.json names each stage's sweep"
    );
    assert!(
        run.stage(8)["skip_reason"]
            .as_str()
            .unwrap()
            .contains("#7 c=16"),
        "{}",
        run.stage(8)
    );
    assert_eq!(run.stopped_at(), Some(7), "the last stop: {}", run.stderr());
}
