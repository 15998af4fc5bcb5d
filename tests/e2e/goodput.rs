//! SLOs and goodput against the simulator: each request judged against its
//! stage's goals, each stage's goodput and attainment, and the same goodput
//! from the formula vLLM's `vllm bench serve --goodput` documents.

use serde_json::Value;

use crate::support::{generate, nyann_bench, serial, simulator};

/// The measured records of stage `index`.
fn records(dir: &std::path::Path, index: u64) -> Vec<Value> {
    std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["phase"] == "measured" && r["stage"] == index)
        .collect()
}

/// Goodput as `vllm bench serve --goodput ttft:T tpot:P e2el:E` documents
/// it: the completed requests whose TTFT, TPOT (time per output token,
/// excluding the first: `(e2el - ttft) / (output_len - 1)`) and E2EL (all
/// in milliseconds) are each at most the goal, per second of the run.
/// Written from that definition, not from vLLM's code.
fn vllm_goodput(records: &[Value], goals_ms: (f64, f64, f64), seconds: f64) -> f64 {
    let good = records
        .iter()
        .filter(|r| r["status"] == "ok")
        .filter(|r| {
            let ttft = 1000.0 * r["ttft_s"].as_f64().unwrap();
            let e2el = 1000.0 * r["e2e_s"].as_f64().unwrap();
            let output_len = r["output_tokens"].as_u64().unwrap();
            let tpot = if output_len > 1 {
                (e2el - ttft) / (output_len - 1) as f64
            } else {
                0.0
            };
            ttft <= goals_ms.0 && tpot <= goals_ms.1 && e2el <= goals_ms.2
        })
        .count();
    good as f64 / seconds
}

/// A sweep past the simulator's KV cache (it saturates around 12-16
/// streams) under a TTFT goal: goodput rises with the load, then falls when
/// requests queue, while throughput still climbs; each record and each
/// stage say so, the stage table shows it, and vLLM's formula gives the
/// same goodput from the same records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodput_rises_then_falls_while_throughput_climbs() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let scenario = "scenario(\n    workload = workload(\"faker\", isl=128, osl=256),\n    \
                    slo = slo(ttft=\"200ms\", tpot=\"20ms\", e2e=\"3s\"),\n    \
                    stages = [stage(\"3s\", concurrency=c) for c in [2, 8, 32]],\n)\n";
    let run = generate(&sim, scenario, &[]).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let mut goodput = Vec::new();
    let mut throughput = Vec::new();
    for (index, stage) in run.stages().iter().enumerate() {
        let slo = &stage["client"]["slo"];
        let records = records(run.dir(), index as u64);
        // Every record is judged, and its verdict is its times against the goals.
        for r in &records {
            let ttft = r["ttft_s"].as_f64().unwrap();
            let e2e = r["e2e_s"].as_f64().unwrap();
            let tokens = r["output_tokens"].as_u64().unwrap();
            let tpot = r["tpot_s"].as_f64().unwrap();
            assert!(
                (tpot - (e2e - ttft) / (tokens - 1) as f64).abs() < 1e-9,
                "{r}"
            );
            let met = ttft <= 0.2 && tpot <= 0.02 && e2e <= 3.0;
            assert_eq!(r["slo_met"], met, "{r}");
            assert_eq!(r["slo_missed"].is_null(), met, "{r}");
        }
        let met = records.iter().filter(|r| r["slo_met"] == true).count();
        assert_eq!(slo["requests"], records.len(), "{slo}");
        assert_eq!(slo["met"], met, "{slo}");
        let seconds = stage["end_unix"].as_f64().unwrap() - stage["start_unix"].as_f64().unwrap();
        let ours = slo["goodput_per_second"].as_f64().unwrap();
        let theirs = vllm_goodput(&records, (200.0, 20.0, 3000.0), seconds);
        // The same requests are good; the rates differ only in how the
        // stage's seconds were rounded into stages.json.
        assert_eq!(
            (ours * seconds).round(),
            (theirs * seconds).round(),
            "{ours} vs vLLM's {theirs}"
        );
        assert!(
            (ours - theirs).abs() <= 1e-6 * theirs,
            "{ours} vs vLLM's {theirs}"
        );
        goodput.push(ours);
        throughput.push(stage["client"]["requests_per_second"].as_f64().unwrap());
    }
    // Measured on a 2-core box: goodput 5.3, 12.7, 2.7 req/s, throughput
    // 5.3, 12.7, 21.0, attainment 100%, 100%, 13%.
    assert!(
        goodput[0] < goodput[1] && goodput[2] < goodput[1],
        "goodput {goodput:?}"
    );
    assert!(throughput[2] > throughput[1], "throughput {throughput:?}");
    let congested = &run.stage(2)["client"]["slo"];
    assert!(
        congested["attainment"].as_f64().unwrap() < 0.5,
        "{congested}"
    );
    assert!(congested["goals"][0]["missed"].as_u64().unwrap() > 0);
    let stderr = run.stderr();
    assert!(stderr.contains("goodput"), "{stderr}");
    assert!(
        stderr.contains("SLO ttft≤200ms, tpot≤20ms, e2e≤3s"),
        "{stderr}"
    );
    assert!(run.summary["totals"]["slo"]["requests"].as_u64().unwrap() > 0);
    crate::support::validate_against_schema(run.dir());
}

/// `generate --slo` judges a single stage; with `--config` it is refused
/// saying how to write it in the scenario, and a malformed one names the
/// goals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slo_flag_judges_a_single_stage() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let dir = tempfile::tempdir().unwrap();
    let output = nyann_bench()
        .args(["generate", "--target", &sim.base_url(), "--seed", "1"])
        .args([
            "--concurrency",
            "2",
            "--max-requests",
            "6",
            "--duration",
            "30s",
        ])
        .args(["--slo", "ttft=500ms,tpot=50ms"])
        .arg("--output-dir")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap())
            .unwrap();
    let slo = &summary["stages"][0]["client"]["slo"];
    assert_eq!(slo["slo"]["ttft_s"], 0.5, "{slo}");
    assert_eq!(slo["requests"], 6, "{slo}");
    assert_eq!(slo["met"], 6, "{slo}");
    assert!(stderr.contains("SLO ttft≤500ms, tpot≤50ms"), "{stderr}");

    let config = dir.path().join("one.star");
    std::fs::write(&config, "scenario(stages = [stage(\"1s\")])\n").unwrap();
    for (args, says) in [
        (
            vec!["--config", config.to_str().unwrap(), "--slo", "ttft=500ms"],
            "--slo is for a single stage (without --config): in a scenario, give \
             scenario(..., slo=slo(ttft=\"500ms\"))",
        ),
        (
            vec!["--slo", "itl=5ms"],
            "unknown goal \"itl\": the goals are ttft, tpot and e2e",
        ),
    ] {
        let output = nyann_bench()
            .args(["generate", "--target", &sim.base_url()])
            .args(&args)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_ne!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// The capacity under an SLO in one scenario line: the example policy
/// `goodput-floor` (client figures only: no signal source) stops the sweep
/// 2, 8, 32 where fewer than 90% of the requests meet the SLO, with 95%
/// confidence (c=32: measured 13% met), and `refine=6` bisects 8..32 until
/// the clean and the congested level are adjacent. Every verdict is the
/// stage's own figures against the floor; the closing lines say the
/// capacity under the SLO and the level of most goodput.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodput_floor_finds_the_capacity_under_an_slo() {
    let _serial = serial().await;
    let sim = nyann_sim::start(nyann_sim::SimConfig {
        seed: 1,
        jitter: Some(0.0),
        ..nyann_sim::SimConfig::default()
    })
    .await
    .unwrap();
    let policy = crate::support::policy_wasm("goodput-floor-policy");
    let scenario = "scenario(\n    workload = workload(\"faker\", isl=128, osl=256),\n    \
                    slo = slo(ttft=\"200ms\", tpot=\"20ms\"),\n    \
                    stages = until_congested(\n        \
                    [stage(\"2s\", concurrency=c) for c in [2, 8, 32]],\n        \
                    floor=0.9, refine=6,\n    ),\n)\n";
    let args = ["--policy".to_string(), policy.display().to_string()];
    let run = generate(&sim, scenario, &args).await;
    let stderr = run.stderr();
    assert_eq!(run.code(), Some(0), "{stderr}");
    assert_eq!(run.stopped_at(), Some(2), "{stderr}");
    // Each verdict is the floor against the upper bound of the stage's
    // attainment interval.
    for (index, stage) in run.stages().iter().enumerate() {
        if stage["status"] != "measured" {
            continue;
        }
        let slo = &stage["client"]["slo"];
        let high = slo["attainment_high"].as_f64().unwrap();
        assert_eq!(run.congested(index), high < 0.9, "stage {index}: {slo}");
        assert_eq!(run.congestion(index)["policy"]["name"], "goodput-floor");
    }
    let reason = run.congestion(2)["verdict"]["reasons"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        reason.starts_with("SLO ttft≤200ms, tpot≤20ms met by "),
        "{reason}"
    );
    // The search ends with adjacent levels, under the SLO.
    let sweep = &run.summary["conclusion"]["sweeps"][0];
    let capacity = &sweep["capacity"];
    let clean = capacity["clean"]["concurrency"].as_u64().unwrap();
    let congested = capacity["congested"]["concurrency"].as_u64().unwrap();
    assert_eq!(congested, clean + 1, "{capacity}");
    assert!((8..32).contains(&clean), "{capacity}");
    assert_eq!(capacity["under_slo"]["slo"], "ttft≤200ms, tpot≤20ms");
    let met = capacity["under_slo"]["attainment"].as_f64().unwrap();
    let said = format!(
        "capacity under SLO ttft≤200ms, tpot≤20ms ({}% met): concurrency={clean} ",
        (met * 100.0 + 1e-9).floor()
    );
    assert!(stderr.contains(&said), "{said}\n{stderr}");
    // The level of most goodput is a measured stage's, and no stage had more.
    let most = &sweep["most_goodput"];
    let best = run
        .stages()
        .iter()
        .filter_map(|s| s["client"]["slo"]["goodput_per_second"].as_f64())
        .fold(0.0, f64::max);
    assert_eq!(most["goodput_per_second"].as_f64(), Some(best), "{most}");
    assert!(stderr.contains("most goodput: "), "{stderr}");
    crate::support::validate_against_schema(run.dir());
}
