//! The runner against the real simulator (`nyann-sim`, started in-process on
//! an ephemeral port): stage transitions as the server sees them, open-loop
//! arrival counts, ISL calibration with the simulator's `/tokenize`, and
//! injected faults.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::records;
use nyann_load::{NoHook, Phase, RunOptions, RunOutcome, Status};
use nyann_model::{Mode, Scenario, Stage, Step, Workload, WorkloadType};
use nyann_sim::SimConfig;

fn stage(duration_s: f64, mode: Mode, concurrency: Option<u32>, rate: Option<f64>) -> Step {
    Step::Stage(Stage {
        concurrency,
        rate,
        ..Stage::new(duration_s, mode)
    })
}

fn scenario(steps: Vec<Step>, isl: u32, osl: u32) -> Scenario {
    let workload = Workload {
        kind: WorkloadType::Faker,
        isl,
        osl,
        turns: 1,
        ..Workload::default()
    };
    Scenario {
        target: None,
        model: None,
        workload,
        steps,
    }
}

fn options(base: String, dir: &Path) -> RunOptions {
    RunOptions {
        target: Some(base),
        seed: 3,
        ready_timeout: Duration::from_secs(10),
        output_dir: Some(dir.to_path_buf()),
        ..RunOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stage_changes_abort_nothing_on_the_server() {
    let sim = nyann_sim::start(SimConfig::fast()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(
        vec![
            stage(0.5, Mode::Concurrent, Some(4), None),
            stage(0.5, Mode::Concurrent, Some(16), None),
            stage(0.5, Mode::Constant, None, Some(100.0)),
            stage(0.5, Mode::Concurrent, Some(2), None),
        ],
        64,
        16,
    );
    let result = nyann_load::run(&sc, options(sim.base_url(), dir.path()), NoHook)
        .await
        .unwrap();
    assert_eq!(result.outcome, RunOutcome::Completed);
    let recs = records(dir.path());
    assert!(
        recs.iter().all(|r| r.status == Status::Ok),
        "{:?}",
        recs.iter().find(|r| r.status != Status::Ok)
    );
    // The server saw every request complete: none was abandoned by the client.
    let seen = sim.requests();
    assert_eq!(seen.len(), recs.len());
    assert!(
        seen.iter().all(|r| r.status == "ok"),
        "{:?}",
        seen.iter().find(|r| r.status != "ok")
    );
    // Each record names the server's response, one to one.
    let mut client_ids: Vec<_> = recs
        .iter()
        .map(|r| r.response_id.clone().unwrap())
        .collect();
    let mut server_ids: Vec<_> = seen.iter().map(|r| r.id.clone()).collect();
    client_ids.sort();
    server_ids.sort();
    assert_eq!(client_ids, server_ids);
    // Output lengths are what the workload asked for (ignore_eos/min_tokens).
    assert!(recs.iter().all(|r| r.output_tokens == Some(16)));
    for st in &result.stages {
        assert!(st.client.as_ref().unwrap().requests_ok > 0, "{}", st.label);
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_counts_match_rate_times_duration() {
    let sim = nyann_sim::start(SimConfig::fast()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(
        vec![
            stage(2.0, Mode::Constant, None, Some(50.0)),
            stage(2.0, Mode::Poisson, None, Some(50.0)),
        ],
        32,
        8,
    );
    let result = nyann_load::run(&sc, options(sim.base_url(), dir.path()), NoHook)
        .await
        .unwrap();
    let recs = records(dir.path());
    let constant = recs
        .iter()
        .filter(|r| r.stage == 0 && r.phase == Phase::Measured)
        .count();
    let poisson = recs
        .iter()
        .filter(|r| r.stage == 1 && r.phase == Phase::Measured)
        .count();
    assert!((99..=102).contains(&constant), "constant: {constant}");
    // Poisson mean 100, sd 10: 5 sd.
    assert!((50..=150).contains(&poisson), "poisson: {poisson}");
    assert!(
        recs.iter()
            .filter(|r| r.phase == Phase::Measured)
            .all(|r| r.scheduled_at.is_some())
    );
    assert_eq!(
        result.stages[0].client.as_ref().unwrap().requests_ok as usize,
        constant
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isl_calibrated_with_the_simulators_tokenize() {
    let sim = nyann_sim::start(SimConfig::fast()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut sc = scenario(vec![stage(30.0, Mode::Concurrent, Some(1), None)], 200, 4);
    if let Step::Stage(s) = &mut sc.steps[0] {
        s.max_requests = 3;
    }
    nyann_load::run(&sc, options(sim.base_url(), dir.path()), NoHook)
        .await
        .unwrap();
    for r in sim.requests() {
        // The simulator counts the prompt; the calibrated prompt is within 2% of isl.
        assert!(
            (196..=204).contains(&r.prompt_tokens),
            "{}",
            r.prompt_tokens
        );
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_fail_requests_with_reasons_and_abort_the_run() {
    let args = SimConfig {
        fault_cut_rate: 1.0,
        fault_cut_after: 2,
        ..SimConfig::fast()
    };
    let sim = nyann_sim::start(args).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![stage(30.0, Mode::Concurrent, Some(2), None)], 32, 16);
    let result = nyann_load::run(&sc, options(sim.base_url(), dir.path()), NoHook)
        .await
        .unwrap();
    assert!(
        matches!(result.outcome, RunOutcome::Aborted { .. }),
        "{:?}",
        result.outcome
    );
    assert_eq!(result.exit_code(), 1);
    let recs = records(dir.path());
    assert!(recs.len() >= 5);
    for r in recs.iter().filter(|r| r.status != Status::Cancelled) {
        assert_eq!(r.status, Status::Failed);
        let error = r.error.as_deref().unwrap();
        assert!(
            error.contains("truncated")
                || error.contains("stream broken")
                || error.contains("unreadable"),
            "{error}"
        );
    }
    sim.shutdown().await;

    let args = SimConfig {
        fault_error_rate: 1.0,
        ..SimConfig::fast()
    };
    let sim = nyann_sim::start(args).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let result = nyann_load::run(&sc, options(sim.base_url(), dir.path()), NoHook)
        .await
        .unwrap();
    let RunOutcome::Aborted { reason } = &result.outcome else {
        panic!("{:?}", result.outcome)
    };
    assert!(
        reason.contains("HTTP 5") || reason.contains("HTTP 4"),
        "{reason}"
    );
    sim.shutdown().await;
}
