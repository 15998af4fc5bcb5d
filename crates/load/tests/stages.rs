//! The stage runner end to end against a local test server: stage
//! transitions of closed-loop load, the load held between stages, the
//! hook's stop, warm-up and max_requests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::scenarios::*;
use common::{Behaviour, TestServer, records};
use nyann_load::{
    FinishedStage, HookOutcome, NoHook, Phase, RunOutcome, StageHook, StageStatus, Status,
};
use nyann_model::{Mode, Stage, Step};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_stages_grow_and_shrink_without_aborting_requests() {
    let server = TestServer::start(Behaviour {
        token_delay: Duration::from_millis(20),
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![
        concurrent(0.6, 2),
        concurrent(0.6, 6),
        concurrent(0.6, 3),
    ]);
    let mut hook = Recorder::default();
    let result = nyann_load::run(&sc, options(&server, dir.path()), &mut hook)
        .await
        .unwrap();

    assert_eq!(result.outcome, RunOutcome::Completed);
    assert_eq!(result.exit_code(), 0);
    // The hook saw every measured stage, in order, with its statistics.
    assert_eq!(
        hook.seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(hook.seen.iter().all(|s| s.1 > 0));
    let recs = records(dir.path());
    assert_eq!(recs.len() as u64, result.requests_recorded);
    // No request was aborted by a stage change.
    assert!(
        recs.iter().all(|r| r.status == Status::Ok),
        "{:?}",
        recs.iter().find(|r| r.status != Status::Ok)
    );
    // Each measured request was sent inside its stage's window.
    for r in recs.iter().filter(|r| r.phase == Phase::Measured) {
        let st = &result.stages[r.stage];
        let sent = r.sent_at.unwrap();
        assert!(
            sent >= st.start_unix.unwrap() - 1e-3 && sent <= st.end_unix.unwrap() + 1e-3,
            "{r:?}"
        );
    }
    // Stage statistics are exactly the measured records of the stage.
    for st in &result.stages {
        let n = recs
            .iter()
            .filter(|r| r.stage == st.index && r.phase == Phase::Measured)
            .count() as u64;
        assert_eq!(st.client.as_ref().unwrap().requests_ok, n);
        assert_eq!(st.status, StageStatus::Measured);
        assert_eq!(st.annotation, Some(serde_json::json!({ "seen": st.index })));
    }
    // The server never saw more streams than the largest stage.
    assert!(
        server
            .state
            .max_in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
            <= 6
    );
    // The outputs are on disk and agree with the result.
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("stages.json")).unwrap()).unwrap();
    assert_eq!(on_disk["schema_version"], nyann_results::SCHEMA_VERSION);
    let stages: Vec<nyann_load::StageResult> = nyann_results::RunDir::open(dir.path())
        .unwrap()
        .stages()
        .unwrap();
    assert_eq!(stages.len(), result.stages.len());
    for (file, mem) in stages.iter().zip(&result.stages) {
        assert_eq!(
            (
                file.index,
                file.status,
                &file.client.as_ref().unwrap().requests_ok
            ),
            (
                mem.index,
                mem.status,
                &mem.client.as_ref().unwrap().requests_ok
            )
        );
    }
    let summary: nyann_load::RunResult =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(
        summary.totals.requests_ok,
        result
            .stages
            .iter()
            .map(|s| s.client.as_ref().unwrap().requests_ok)
            .sum::<u64>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_holds_between_stages_and_hold_requests_count_nowhere() {
    let server = TestServer::start(Behaviour {
        token_delay: Duration::from_millis(10),
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();

    /// Takes its time, as a policy querying Prometheus would.
    struct Slow;
    impl StageHook for Slow {
        type Annotation = serde_json::Value;
        async fn after_stage(&mut self, _: &FinishedStage<'_>) -> HookOutcome {
            tokio::time::sleep(Duration::from_millis(400)).await;
            HookOutcome::proceed()
        }
    }
    let sc = scenario(vec![concurrent(0.4, 3), concurrent(0.4, 3)]);
    let result = nyann_load::run(&sc, options(&server, dir.path()), Slow)
        .await
        .unwrap();
    let recs = records(dir.path());
    let hold: Vec<_> = recs.iter().filter(|r| r.phase == Phase::Hold).collect();
    // Load went on while the hook ran: tagged hold, with the finished stage's index.
    assert!(hold.len() >= 3, "{}", hold.len());
    assert!(
        hold.iter().all(
            |r| r.stage == 0 && r.sent_at.unwrap() >= result.stages[0].end_unix.unwrap() - 1e-3
        )
    );
    let total_measured: u64 = result
        .stages
        .iter()
        .map(|s| s.client.as_ref().unwrap().requests_ok)
        .sum();
    assert_eq!(
        total_measured as usize,
        recs.iter().filter(|r| r.phase == Phase::Measured).count()
    );
    // The next stage started only after the hook returned.
    assert!(result.stages[1].start_unix.unwrap() >= result.stages[0].end_unix.unwrap() + 0.39);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_stop_skips_later_stages_and_keeps_the_stopping_stage() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![
        concurrent(0.3, 2),
        Step::Barrier { drain: false },
        concurrent(0.3, 4),
        concurrent(0.3, 8),
    ]);
    let mut hook = Recorder {
        stop_at: Some(2),
        ..Recorder::default()
    };
    let result = nyann_load::run(&sc, options(&server, dir.path()), &mut hook)
        .await
        .unwrap();
    assert!(
        matches!(&result.outcome, RunOutcome::Stopped { stage: 2, reason } if reason.contains("enough"))
    );
    assert_eq!(result.exit_code(), 0);
    let statuses: Vec<_> = result.stages.iter().map(|s| s.status).collect();
    assert_eq!(
        statuses,
        vec![
            StageStatus::Measured,
            StageStatus::Barrier,
            StageStatus::Measured,
            StageStatus::Skipped
        ]
    );
    assert!(
        result.stages[3]
            .skip_reason
            .as_deref()
            .unwrap()
            .contains("enough")
    );
    assert!(result.stages[2].client.as_ref().unwrap().requests_ok > 0);
    // Nothing was sent for the skipped stage.
    assert!(records(dir.path()).iter().all(|r| r.stage != 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_is_sent_tagged_and_excluded() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let warm = Step::Stage(Stage {
        concurrency: Some(2),
        warmup: true,
        ..Stage::new(0.3, Mode::Concurrent)
    });
    let sc = scenario(vec![warm, concurrent(0.3, 2)]);
    let mut hook = Recorder::default();
    let result = nyann_load::run(&sc, options(&server, dir.path()), &mut hook)
        .await
        .unwrap();
    assert_eq!(
        hook.seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![1],
        "warm-up is never judged"
    );
    assert_eq!(result.stages[0].status, StageStatus::Warmup);
    let recs = records(dir.path());
    let warm_n = recs
        .iter()
        .filter(|r| r.phase == Phase::Warmup && r.stage == 0)
        .count();
    assert!(warm_n > 0);
    let measured_n = recs.iter().filter(|r| r.phase == Phase::Measured).count() as u64;
    assert_eq!(result.totals.requests_ok, measured_n);
    assert!(
        recs.iter()
            .filter(|r| r.phase == Phase::Measured)
            .all(|r| r.stage == 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_requests_ends_the_stage_early() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let s = Step::Stage(Stage {
        concurrency: Some(3),
        max_requests: 7,
        ..Stage::new(60.0, Mode::Concurrent)
    });
    let sc = scenario(vec![s, concurrent(0.2, 1)]);
    let started = std::time::Instant::now();
    let result = nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the 60 s stage ended on max_requests"
    );
    let recs = records(dir.path());
    assert_eq!(
        recs.iter()
            .filter(|r| r.stage == 0 && r.phase == Phase::Measured)
            .count(),
        7
    );
    assert_eq!(result.stages[0].client.as_ref().unwrap().requests_ok, 7);
}

/// Judges a stage congested from level `knee` up, and remembers what it
/// was shown: (index, level, the stage it refines).
struct Knee {
    knee: u32,
    seen: Vec<(usize, u32, Option<usize>)>,
}

impl StageHook for Knee {
    type Annotation = serde_json::Value;
    async fn after_stage(&mut self, done: &FinishedStage<'_>) -> HookOutcome {
        let level = done.stage.concurrency.unwrap_or(0);
        self.seen.push((done.index, level, done.refines));
        if level >= self.knee {
            HookOutcome::stop(format!("c={level} >= {}", self.knee))
        } else {
            HookOutcome::proceed()
        }
    }
}

/// A sweep of `levels` (0.3 s each) with `refine` search stages.
fn refined_sweep(levels: &[u32], refine: u32) -> nyann_model::Scenario {
    let stop = nyann_model::StopCondition {
        params: Vec::new(),
        location: None,
        param_locations: Vec::new(),
        search: Some(nyann_model::CapacitySearch {
            stages: refine,
            resolution: None,
            confirm: 0,
        }),
    };
    let steps = levels
        .iter()
        .map(|&c| {
            Step::Stage(Stage {
                concurrency: Some(c),
                stop: Some(stop.clone()),
                ..Stage::new(0.3, Mode::Concurrent)
            })
        })
        .collect();
    scenario(steps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sweep_searches_its_capacity_between_the_levels() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut hook = Knee {
        knee: 23,
        seen: Vec::new(),
    };
    let sc = refined_sweep(&[8, 32, 128], 4);
    let result = nyann_load::run(&sc, options(&server, dir.path()), &mut hook)
        .await
        .unwrap();
    // The sweep stopped at c=32 (c=128 skipped), then bisected 8..32.
    assert_eq!(
        result.outcome,
        RunOutcome::Stopped {
            stage: 1,
            reason: "stopped after stage #1 c=32: c=32 >= 23".into()
        }
    );
    assert_eq!(
        hook.seen,
        [
            (0, 8, None),
            (1, 32, None),
            (3, 20, Some(1)),
            (4, 26, Some(1)),
            (5, 23, Some(1)),
            (6, 21, Some(1)),
        ]
    );
    let stages = &result.stages;
    assert_eq!(stages.len(), 7);
    assert_eq!(stages[2].status, StageStatus::Skipped);
    for (position, stage) in stages.iter().enumerate() {
        assert_eq!(stage.index, position, "{stage:?}");
    }
    for search in &stages[3..] {
        assert_eq!(search.status, StageStatus::Measured);
        assert_eq!(search.search, Some(nyann_load::SearchStage { refines: 1 }));
        assert!(search.client.as_ref().unwrap().requests_ok > 0);
    }
    // The search stages' requests are recorded under their own index.
    let recs = records(dir.path());
    for index in 3..7 {
        assert!(
            recs.iter()
                .any(|r| r.stage == index && r.phase == Phase::Measured)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_congested_first_stage_searches_down() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut hook = Knee {
        knee: 23,
        seen: Vec::new(),
    };
    let sc = refined_sweep(&[128, 256], 4);
    let result = nyann_load::run(&sc, options(&server, dir.path()), &mut hook)
        .await
        .unwrap();
    let levels: Vec<u32> = hook.seen.iter().map(|s| s.1).collect();
    assert_eq!(levels, [128, 64, 32, 16, 24]);
    assert_eq!(result.stages.len(), 6);
}

/// Stops at c=32 because it could not judge it (as a failed policy call
/// with `--on-policy-error stop` does).
struct FailsAt32;

impl StageHook for FailsAt32 {
    type Annotation = serde_json::Value;
    async fn after_stage(&mut self, done: &FinishedStage<'_>) -> HookOutcome {
        if done.stage.concurrency == Some(32) {
            HookOutcome::stop_on_failure("policy error at stage #1 c=32: trapped")
        } else {
            HookOutcome::proceed()
        }
    }
}

/// A sweep stopped by a failure to judge, not by congestion, has no
/// capacity to search: its stop level says nothing of the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_stopped_by_a_failed_judgement_is_not_searched() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let sc = refined_sweep(&[8, 32, 128], 4);
    let result = nyann_load::run(&sc, options(&server, dir.path()), FailsAt32)
        .await
        .unwrap();
    assert_eq!(result.outcome.stop_stage(), Some(1));
    assert_eq!(result.stages.len(), 3, "{:?}", result.stages);
    assert!(result.stages.iter().all(|s| s.search.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_json_holds_the_stages_so_far_while_the_run_goes_on() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();

    /// Reads the run directory's `stages.json` as each stage is judged.
    struct Watch {
        dir: std::path::PathBuf,
        seen: Vec<Vec<u64>>,
    }
    impl StageHook for Watch {
        type Annotation = serde_json::Value;
        async fn after_stage(&mut self, _: &FinishedStage<'_>) -> HookOutcome {
            let indexes = match std::fs::read(self.dir.join("stages.json")) {
                Ok(bytes) => {
                    let file: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                    file["stages"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|stage| stage["index"].as_u64().unwrap())
                        .collect()
                }
                Err(_) => Vec::new(),
            };
            self.seen.push(indexes);
            HookOutcome::proceed()
        }
    }
    let sc = scenario(vec![
        concurrent(0.2, 2),
        concurrent(0.2, 2),
        concurrent(0.2, 2),
    ]);
    let mut watch = Watch {
        dir: dir.path().to_path_buf(),
        seen: Vec::new(),
    };
    nyann_load::run(&sc, options(&server, dir.path()), &mut watch)
        .await
        .unwrap();
    // Each stage is judged before it is recorded: the file holds the
    // stages before it.
    assert_eq!(watch.seen, vec![vec![], vec![0], vec![0, 1]]);
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("stages.json")).unwrap()).unwrap();
    assert_eq!(file["stages"].as_array().unwrap().len(), 3);
    assert!(!dir.path().join(".stages.json.partial").exists());
}
