//! The simulator as a twin of a real server, end to end: `sim fit`
//! recovers the profile a simulator ran with from its recorded sweeps; the
//! twin of the reference vLLM stops a queueing-rule sweep where the real
//! server did; a disaggregated simulator congests on its prefill engine;
//! profile files and recordings that cannot be used are refused with the
//! reason.

use std::path::Path;

use nyann_sim::engine::TimeModel;
use nyann_sim::profile::{EngineSpec, Limits, Role};
use nyann_sim::{Profile, RunningSim, ServerProfile, SimConfig};

use crate::support::{generate, nyann_bench, scrape_flags, serial, starlark_list};

/// The profile the round trip runs and fits back.
fn known_profile() -> ServerProfile {
    ServerProfile {
        name: "known".into(),
        description: String::new(),
        chat_template_tokens: 8,
        default_max_tokens: 256,
        engine: EngineSpec {
            limits: Limits {
                max_num_seqs: 32,
                max_num_batched_tokens: 2048,
                kv_blocks: 1023,
                block_size: 16,
                max_model_len: Some(4096),
                enable_prefix_caching: true,
            },
            time: TimeModel {
                step_overhead: 2000e-6,
                prefill_per_token: 30e-6,
                decode_per_seq: 200e-6,
                decode_per_context_token: 0.5e-6,
                request_overhead: 3000e-6,
                jitter: 0.1,
                drift: 0.0,
                drift_time: 0.0,
                kv_transfer: 0.0,
                kv_transfer_per_token: 0.0,
            },
        },
        prefill: None,
        decode: None,
        disaggregated: false,
    }
}

/// A plain sweep (no stop condition) of 4-second closed-loop stages.
fn levels(isl: u32, osl: u32, concurrencies: &[u32]) -> String {
    let levels = starlark_list(concurrencies);
    format!(
        "scenario(\n    workload = workload(\"synthetic\", isl={isl}, osl={osl}),\n    \
         stages = [stage(\"4s\", concurrency=c) for c in [{levels}]],\n)\n"
    )
}

async fn start(args: SimConfig) -> RunningSim {
    nyann_sim::start(args).await.expect("the simulator starts")
}

/// A simulator serving `profile` from its file in `work` (seed 1).
async fn serving(work: &Path, profile: &ServerProfile) -> RunningSim {
    let file = work.join("known.toml");
    std::fs::write(&file, profile.to_toml("the round trip's known profile")).unwrap();
    start(SimConfig {
        profile_file: Some(file),
        seed: 1,
        ..SimConfig::default()
    })
    .await
}

/// Record `scenarios` against `sim` with `scrape` flags, each run saving
/// `saved`, stop the simulator, and `sim fit` the runs with `extra` flags:
/// the profile written (in `work`) and what the fit printed.
async fn record_and_fit(
    sim: RunningSim,
    work: &Path,
    scenarios: &[String],
    scrape: &[String],
    saved: &[&str],
    extra: &[&str],
) -> (std::path::PathBuf, String) {
    let mut runs = Vec::new();
    for scenario in scenarios {
        let run = generate(&sim, scenario, scrape).await;
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        for file in saved {
            assert!(run.dir().join(file).is_file(), "{file}: {}", run.stderr());
        }
        runs.push(run);
    }
    sim.shutdown().await;
    let fitted = work.join("fitted.toml");
    let mut args = vec!["sim", "fit"];
    args.extend(runs.iter().map(|r| path(r.dir())));
    args.extend_from_slice(extra);
    args.extend(["-o", path(&fitted)]);
    let (code, stdout, stderr) = run(&args).await;
    assert_eq!(code, Some(0), "{stderr}");
    (fitted, stdout)
}

/// `nyann-bench ARGS` to completion: (exit code, stdout, stderr).
async fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = nyann_bench().args(args).output().await.unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// What a live simulator adds to the TTFT its time model gives, which a
/// recording cannot tell from the server's own request overhead: tokio's
/// timer rounds every step's end up to the next millisecond, then the
/// engine, HTTP and client tasks wake on a 2-core machine shared with the
/// client (the fit put 3-5 ms there on a busy machine). The fit on the
/// virtual clock, with none of it, recovers the overhead within 10%
/// (crates/sim/tests/fit.rs).
const LIVE_LATENCY_ROOM: f64 = 0.008;

/// Record two sweeps (short and long prompts) of a simulator running a known
/// profile with `--scrape` and without `--stream-usage`, as a user records
/// a real server, fit with no flag, and compare the written profile with
/// the known one: limits and chat template exactly (the KV cache from the
/// saved `/metrics`, `max_model_len` from `/v1/models`, the template's
/// tokens and the characters per token from `/tokenize`, all in the run
/// directories; `max_num_seqs` the highest level, which no stage queued
/// beyond); the step costs within 50%, the context cost only as fitted
/// (not held at 0). A live simulator keeps its time model only as
/// well as the machine lets it: on a quiet machine the costs came back
/// within 3% (13% for the weakly shown context cost), during the whole
/// suite on 2 shared cores `decode_per_seq` came back 36% high and the
/// context cost 60% low. The exact recovery is the virtual round trip's
/// (crates/sim/tests/fit.rs); this one checks the path through processes
/// and files, and catches a wrong unit, reader or parameter. The request
/// overhead takes what the live simulator adds to every TTFT (see
/// [`LIVE_LATENCY_ROOM`]): it is checked from below, and from above with
/// that much room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_fit_recovers_the_profile_a_simulator_ran() {
    let _serial = serial().await;
    let work = tempfile::tempdir().unwrap();
    let known = known_profile();
    let sim = serving(work.path(), &known).await;
    let scenarios = [
        levels(64, 128, &[1, 4, 16, 32]),
        levels(512, 64, &[1, 4, 16]),
    ];
    let saved = [
        "server.json",
        "metrics/aggregate-0-start.txt",
        "metrics/aggregate-0-end.txt",
    ];
    let scrape = scrape_flags(&sim);
    let (fitted, stdout) = record_and_fit(
        sim,
        work.path(),
        &scenarios,
        &scrape,
        &saved,
        &["--max-evaluations", "300"],
    )
    .await;
    assert!(
        stdout.contains("residual per stage") && stdout.contains("#3 c=32: output tok/s"),
        "{stdout}"
    );
    let profile = ServerProfile::read(&fitted).unwrap();
    assert_eq!(
        profile.engine.limits, known.engine.limits,
        "KV from /metrics, max_model_len from /v1/models"
    );
    assert_eq!(profile.chat_template_tokens, 8, "measured with /tokenize");
    assert!(
        stdout.contains("max_num_seqs 32 (the highest level recorded"),
        "{stdout}"
    );
    let (got, want) = (profile.engine.time, known.engine.time);
    for (name, got, want) in [
        ("step_overhead", got.step_overhead, want.step_overhead),
        (
            "prefill_per_token",
            got.prefill_per_token,
            want.prefill_per_token,
        ),
        ("decode_per_seq", got.decode_per_seq, want.decode_per_seq),
    ] {
        assert!(
            (got / want - 1.0).abs() <= 0.5,
            "{name}: fitted {got:.3e}, known {want:.3e}\n{stdout}"
        );
    }
    assert!(
        got.decode_per_context_token > 0.0,
        "two workloads: the context cost is fitted\n{stdout}"
    );
    let extra = got.request_overhead - want.request_overhead;
    assert!(
        (-0.001..=LIVE_LATENCY_ROOM).contains(&extra),
        "request_overhead: fitted {:.4}, known {:.4}\n{stdout}",
        got.request_overhead,
        want.request_overhead,
    );

    // The written file is what `sim --profile-file` serves.
    let (code, printed, stderr) =
        run(&["sim", "--profile-file", path(&fitted), "--print-profile"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        ServerProfile::from_toml(&printed, "printed").unwrap(),
        profile
    );
}

/// A disaggregated server the round trip runs and fits back: the engines'
/// step overheads and KV caches differ; what the fit holds alike (the
/// prompt cost, the decode costs, the request overhead; see
/// crates/sim/tests/fit.rs) is alike, and the KV transfer is `sim fit`'s
/// default.
fn known_disaggregated_profile() -> ServerProfile {
    let decode = known_profile().engine;
    ServerProfile {
        name: "known-pd".into(),
        prefill: Some(EngineSpec {
            limits: Limits {
                kv_blocks: 511,
                ..decode.limits
            },
            time: TimeModel {
                step_overhead: 1000e-6,
                ..decode.time
            },
        }),
        decode: Some(decode),
        disaggregated: true,
        engine: EngineSpec {
            time: TimeModel {
                kv_transfer: 1000e-6,
                kv_transfer_per_token: 2e-6,
                ..decode.time
            },
            ..decode
        },
        ..known_profile()
    }
}

/// Stages of 1.5 s judged by thresholds no stage reaches: a judged stage
/// records each role's signals, which tell the fit the server was
/// disaggregated and what each engine did.
fn judged_levels(isl: u32, osl: u32, concurrencies: &[u32]) -> String {
    let levels = starlark_list(concurrencies);
    format!(
        "scenario(\n    workload = workload(\"synthetic\", isl={isl}, osl={osl}),\n    \
         stages = until_congested(\n        \
         [stage(\"1500ms\", concurrency=c) for c in [{levels}]],\n        \
         waiting_requests_p50=100000, ttft_p99=\"1h\", kv_cache_usage=1.0, \
         preemptions=1000000,\n    ),\n)\n"
    )
}

/// The round trip of a disaggregated server: a simulator serving a known
/// prefill/decode profile (its file says `disaggregated = true`), two short
/// sweeps scraped from each engine's /metrics as roles `prefill` and
/// `decode` (short prompts, and long ones that queue on the prefill
/// engine), then `sim fit` with no flag. It writes a disaggregated profile:
/// each engine's KV cache from its role's saved /metrics, the prefill
/// engine's prompt cost and the decode engine's step costs within 50% (the
/// bounds and the reasons of the single engine's round trip above; the
/// prefill engine's step overhead, which its steps show only beside the
/// prompts' cost, came back 5 times too high in a run by hand and is not
/// checked). The exact recovery is the virtual round trip's
/// (crates/sim/tests/fit.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_fit_recovers_each_engine_of_a_disaggregated_simulator() {
    let _serial = serial().await;
    let work = tempfile::tempdir().unwrap();
    let known = known_disaggregated_profile();
    let sim = serving(work.path(), &known).await;
    let mut scrape = scrape_flags(&sim);
    scrape.extend(["--scrape-interval".to_string(), "250ms".to_string()]);
    let scenarios = [
        judged_levels(64, 128, &[1, 16]),
        judged_levels(1024, 32, &[1, 16]),
    ];
    let saved = ["metrics/prefill-0-end.txt", "metrics/decode-0-end.txt"];
    let (fitted, stdout) = record_and_fit(sim, work.path(), &scenarios, &scrape, &saved, &[]).await;
    assert!(
        stdout.contains("prefill     decode") && stdout.contains("prefill waiting p50"),
        "{stdout}"
    );
    let profile = ServerProfile::read(&fitted).unwrap();
    assert!(profile.disaggregated, "{stdout}");
    let (prefill, decode) = (profile.engine(Role::Prefill), profile.engine(Role::Decode));
    let (known_prefill, known_decode) = (known.engine(Role::Prefill), known.engine(Role::Decode));
    assert_eq!(
        prefill.limits.kv_blocks, 511,
        "from metrics/prefill-0-end.txt"
    );
    assert_eq!(
        decode.limits.kv_blocks, 1023,
        "from metrics/decode-0-end.txt"
    );
    for (name, got, want) in [
        (
            "prefill prefill_per_token",
            prefill.time.prefill_per_token,
            known_prefill.time.prefill_per_token,
        ),
        (
            "decode step_overhead",
            decode.time.step_overhead,
            known_decode.time.step_overhead,
        ),
        (
            "decode decode_per_seq",
            decode.time.decode_per_seq,
            known_decode.time.decode_per_seq,
        ),
    ] {
        assert!(
            (got / want - 1.0).abs() <= 0.5,
            "{name}: fitted {got:.3e}, known {want:.3e}\n{stdout}"
        );
    }
    // `sim --profile-file` serves it disaggregated without the flag.
    let (code, printed, stderr) =
        run(&["sim", "--profile-file", path(&fitted), "--print-profile"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(printed.contains("\ndisaggregated = true\n"), "{printed}");
}

/// The issue's example: with `waiting_requests_p50=8, ttft_p99="1s"` and the
/// KV rule off, the real vLLM stopped at c=24 (the default profile, at
/// c=64). The twin runs at twice its speed (`--time-scale 0.5`) so that
/// 15-second stages hold what 30-second ones would, with the TTFT threshold
/// halved to match; the waiting threshold is 6 rather than 8 for margin (c=16
/// waits 0-5, c=24 9-13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_twin_stops_a_queueing_sweep_where_the_real_server_did() {
    let _serial = serial().await;
    let sim = start(SimConfig {
        profile: Profile::VllmCpuRef,
        time_scale: 0.5,
        seed: 1,
        ..SimConfig::default()
    })
    .await;
    let scenario = "scenario(\n    workload = workload(\"synthetic\", isl=60, osl=128),\n    \
                    stages = until_congested(\n        \
                    [stage(\"15s\", concurrency=c) for c in [16, 24, 32]],\n        \
                    waiting_requests_p50=6, ttft_p99=\"500ms\", kv_cache_usage=1.0, \
                    preemptions=1000000,\n    ),\n)\n";
    let run = generate(&sim, scenario, &scrape_flags(&sim)).await;
    sim.shutdown().await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(1), "{}", run.stderr());
    assert!(!run.congested(0), "{}", run.congestion(0));
    let roles = &run.congestion(1)["roles"][0];
    assert!(
        roles["kv_cache_usage_max"].as_f64().unwrap() >= 0.95
            && roles["preemptions"].as_f64().unwrap() > 0.0,
        "the KV cache is full and preempting, as on the real server: {roles}"
    );
    let reasons = run.congestion(1)["verdict"]["reasons"].to_string();
    assert!(reasons.contains("queueing"), "{reasons}");
}

/// Long prompts against the disaggregated simulator, signals scraped from
/// each engine's /metrics as roles `prefill` and `decode`: the prefill
/// engine queues (one 2048-token prompt per step) while the decode engine,
/// with its large KV cache, does not; the sweep stops on the queueing rule,
/// naming the prefill role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_sweep_stops_on_prefill_queueing() {
    let _serial = serial().await;
    let sim = start(SimConfig {
        disaggregated: true,
        seed: 1,
        ..SimConfig::default()
    })
    .await;
    let scenario = "scenario(\n    workload = workload(\"synthetic\", isl=2048, osl=32),\n    \
                    stages = until_congested(\n        \
                    [stage(\"4s\", concurrency=c) for c in [2, 4, 16, 32]],\n        \
                    waiting_requests_p50=8, ttft_p99=\"600ms\",\n    ),\n)\n";
    let run = generate(&sim, scenario, &scrape_flags(&sim)).await;
    sim.shutdown().await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    let record = run.congestion(2);
    let role = |name: &str| {
        record["roles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["role"] == name)
            .unwrap_or_else(|| panic!("no role {name}: {record}"))
            .clone()
    };
    assert!(role("prefill")["waiting_requests_p50"].as_f64().unwrap() >= 8.0);
    assert!(role("decode")["waiting_requests_p50"].as_f64().unwrap() < 2.0);
    let reasons = record["verdict"]["reasons"].to_string();
    assert!(reasons.contains("on prefill"), "{reasons}");
    for earlier in 0..2 {
        assert!(!run.congested(earlier), "{}", run.congestion(earlier));
    }
}

/// Minimal results directory: one measured stage of c=4 with its requests,
/// their prompt tokens reported (`usage`) or not.
fn recording(dir: &Path, with_usage: bool) {
    let client = r#"{"requests_ok":2,"requests_failed":0,"requests_per_second":1.0,
        "output_tokens_per_second":200.0,"ttft_p50_seconds":0.02,"ttft_p99_seconds":0.03,
        "itl_p50_seconds":0.004,"itl_p99_seconds":0.006,"e2e_p50_seconds":0.4,"e2e_p99_seconds":0.5}"#;
    let stages = format!(
        r#"[{{"index":0,"label":"c=4","status":"measured","mode":"concurrent","concurrency":4,
        "duration_s":4.0,"client":{client}}}]"#
    );
    std::fs::write(dir.join("stages.json"), stages).unwrap();
    let prompt = if with_usage { "64" } else { "null" };
    let line = format!(
        r#"{{"stage":0,"phase":"measured","status":"ok","prompt_tokens":{prompt},"output_tokens":100,"prompt_chars":256}}"#
    );
    std::fs::write(dir.join("requests.jsonl"), format!("{line}\n{line}\n")).unwrap();
}

/// Run `nyann-bench ARGS`, expecting exit status 1 and `expected` on stderr.
async fn refused(args: Vec<String>, expected: &str) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = run(&args).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in:\n{stderr}"
    );
}

#[tokio::test]
async fn sim_fit_refuses_what_it_cannot_use_and_says_what_to_do() {
    let work = tempfile::tempdir().unwrap();
    let run_dir = work.path().join("run");
    std::fs::create_dir(&run_dir).unwrap();
    let out = work.path().join("out.toml");
    let fit = |extra: &[&str]| {
        let mut args = vec!["sim", "fit", path(&run_dir), "-o", path(&out)];
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    refused(
        fit(&["--kv-blocks", "64", "--block-size", "32"]),
        "holds no stages.json or summary.json: give the results directory of a run \
         (`nyann-bench generate --output-dir DIR` writes one)",
    )
    .await;
    // A run recorded before runs saved what the server said: every input
    // it lacks is named at once, with how to get it.
    recording(&run_dir, true);
    refused(
        fit(&[]),
        "the fit needs what the run(s) did not record (a run recorded by this version with \
         --scrape saves it):\n  - the tokens the chat template adds: give \
         --chat-template-tokens N",
    )
    .await;
    refused(
        fit(&[]),
        "\n  - the server's KV cache: give --metrics-file FILE",
    )
    .await;
    recording(&run_dir, false);
    refused(
        fit(&["--chat-template-tokens", "0"]),
        "the fit needs what the run(s) did not record (a run recorded by this version with \
         --scrape saves it):\n  - the prompts' tokens",
    )
    .await;
    recording(&run_dir, true);
    let not_metrics = work.path().join("not-metrics.txt");
    std::fs::write(&not_metrics, "hello 1\n").unwrap();
    refused(
        fit(&["--metrics-file", path(&not_metrics)]),
        "has no vllm:cache_config_info",
    )
    .await;
    refused(
        fit(&[
            "--kv-blocks",
            "2",
            "--block-size",
            "16",
            "--chat-template-tokens",
            "0",
        ]),
        "do not fit the KV cache (32 tokens)",
    )
    .await;
    recording(&run_dir, false);
    refused(
        fit(&[
            "--kv-blocks",
            "64",
            "--block-size",
            "32",
            "--chat-template-tokens",
            "0",
        ]),
        "record with --stream-usage, or give --chars-per-token K",
    )
    .await;
    std::fs::write(&out, "keep me").unwrap();
    refused(
        fit(&["--kv-blocks", "64", "--block-size", "32"]),
        "exists: give another --output, or --force",
    )
    .await;
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");

    // With the characters per token, the same recording fits.
    let (code, stdout, stderr) = run(&fit(&[
        "--kv-blocks",
        "64",
        "--block-size",
        "32",
        "--chars-per-token",
        "4",
        "--chat-template-tokens",
        "0",
        "--max-evaluations",
        "30",
        "--force",
    ])
    .iter()
    .map(String::as_str)
    .collect::<Vec<_>>())
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("wrote "), "{stdout}");
    assert!(ServerProfile::read(&out).is_ok());
}

/// The repository's reference runs of a real vLLM: a twin fitted on the
/// queueing sweep predicts the KV sweep it never saw, stage by stage, and
/// where each standard rule stops it (the run's own thresholds: its
/// queueing rule out of reach, the KV rule at the defaults). The KV cache
/// and the preemptions are the server's limits at work, which the twin
/// shares: the KV rule stops both at c=12 (a short search keeps the test
/// quick; docs/simulator.md gives the full fit's figures).
#[tokio::test]
async fn a_twin_predicts_a_run_it_was_not_fitted_to() {
    let runs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../reference/vllm-cpu-runs");
    let work = tempfile::tempdir().unwrap();
    let out = work.path().join("twin.toml");
    let (code, stdout, stderr) = run(&[
        "sim",
        "fit",
        path(&runs.join("queueing-B")),
        "--metrics-file",
        path(&runs.join("metrics-before-A.txt")),
        "--models-file",
        path(&runs.join("models.json")),
        "--max-num-seqs",
        "16",
        "--chars-per-token",
        "3.125",
        "--chat-template-tokens",
        "3",
        "--max-evaluations",
        "40",
        "--held-out",
        path(&runs.join("kv-A")),
        "-o",
        path(&out),
    ])
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    let prediction = stdout
        .split("prediction of ")
        .nth(1)
        .unwrap_or_else(|| panic!("no prediction in\n{stdout}"));
    for stage in ["#0 c=4", "#1 c=8", "#2 c=12"] {
        assert!(
            prediction.contains(&format!("\n  {stage} ")),
            "{stage}: {prediction}"
        );
    }
    assert!(
        prediction.contains("stop by queueing (waiting p50 >= 1000, server TTFT p99 >= 60s): predicted none, recorded none"),
        "{prediction}"
    );
    assert!(
        prediction.contains("stop by KV cache (usage >= 0.95, preemptions >= 1): predicted #2 c=12, recorded #2 c=12"),
        "{prediction}"
    );
}

#[tokio::test]
async fn profile_files_are_checked_with_the_place_of_the_mistake() {
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("p.toml");
    let print = || ["sim", "--profile-file", path(&file), "--print-profile"];
    let cases = [
        (
            "name = \"x\"\n[limits]\nmax_num_seqs = 16\n",
            "missing field `time`",
        ),
        (
            "name = \"x\"\n[limits]\nmax_num_seqs = 16\nmax_num_batched_tokens = 2048\n\
             kv_blocks = 64\nblock_size = 16\n[time]\nstep_overhead_us = 1000.0\n\
             prefill_per_token_us = 20.0\ndecode_per_seq_us = -1.0\n",
            "time.decode_per_seq_us must be a number >= 0",
        ),
        ("name = \"x\"\nspeed = 3\n", "unknown field `speed`"),
        (
            "name = \"x\"\n[limits]\nmax_num_seqs = 16\nmax_num_batched_tokens = 2048\n\
             kv_blocks = 64\nblock_size = 16\n[time]\nstep_overhead_us = 1000.0\n\
             prefill_per_token_us = 20.0\ndecode_per_seq_us = 100.0\n[prefill.limits]\nkv_blocks = 0\n",
            "prefill.limits.kv_blocks must be at least 1",
        ),
    ];
    for (text, expected) in cases {
        std::fs::write(&file, text).unwrap();
        let (code, _, stderr) = run(&print()).await;
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains(expected) && stderr.contains("p.toml"),
            "expected {expected:?} naming the file in:\n{stderr}"
        );
    }
    let (code, _, stderr) = run(&[
        "sim",
        "--profile-file",
        "/nonexistent/p.toml",
        "--print-profile",
    ])
    .await;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("cannot read profile file /nonexistent/p.toml"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["sim", "--profile", "fast", "--print-profile"]).await;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("the fast profile has no engine"),
        "{stderr}"
    );

    // A role section overrides only what it names; printing keeps it so.
    std::fs::write(
        &file,
        "name = \"x\"\n[limits]\nmax_num_seqs = 16\nmax_num_batched_tokens = 2048\n\
         kv_blocks = 64\nblock_size = 16\n[time]\nstep_overhead_us = 1000.0\n\
         prefill_per_token_us = 20.0\ndecode_per_seq_us = 100.0\n[decode.limits]\nkv_blocks = 4096\n",
    )
    .unwrap();
    let (code, printed, stderr) = run(&print()).await;
    assert_eq!(code, Some(0), "{stderr}");
    let profile = ServerProfile::from_toml(&printed, "printed").unwrap();
    assert_eq!(profile.decode.unwrap().limits.kv_blocks, 4096);
    assert_eq!(profile.decode.unwrap().limits.max_num_seqs, 16);
    assert_eq!(profile.prefill, None);
    assert!(
        printed.contains("[decode.limits]\nkv_blocks = 4096\n"),
        "{printed}"
    );
}
