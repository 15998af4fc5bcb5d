//! The stage runner end to end against a local test server: modes, stage
//! transitions, warm-up, max_requests, the hook, aborts, interrupts,
//! multi-turn replay and ISL calibration.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Behaviour, Fault, TestServer, records};
use nyann_load::{
    FinishedStage, HookOutcome, NoHook, Phase, RunOptions, RunOutcome, StageHook, StageStatus,
    Status,
};
use nyann_model::{CacheSalt, Mode, Scenario, Stage, Step, Workload, WorkloadType};

fn concurrent(duration_s: f64, c: u32) -> Step {
    Step::Stage(Stage {
        concurrency: Some(c),
        ..Stage::new(duration_s, Mode::Concurrent)
    })
}

fn open(duration_s: f64, mode: Mode, rate: f64) -> Step {
    Step::Stage(Stage {
        rate: Some(rate),
        ..Stage::new(duration_s, mode)
    })
}

fn workload() -> Workload {
    Workload {
        kind: WorkloadType::Synthetic,
        isl: 16,
        osl: 4,
        turns: 1,
        chars_per_token: 4.0,
        ..Workload::default()
    }
}

fn scenario(steps: Vec<Step>) -> Scenario {
    Scenario {
        target: None,
        model: None,
        workload: workload(),
        steps,
    }
}

/// One stream that sends two requests, one after the other.
fn two_requests() -> Scenario {
    scenario(vec![Step::Stage(Stage {
        concurrency: Some(1),
        max_requests: 2,
        ..Stage::new(30.0, Mode::Concurrent)
    })])
}

fn options(server: &TestServer, dir: &Path) -> RunOptions {
    RunOptions {
        target: Some(server.base.clone()),
        seed: 7,
        ready_timeout: Duration::from_secs(5),
        grace: Duration::from_secs(2),
        output_dir: Some(dir.to_path_buf()),
        ..RunOptions::default()
    }
}

/// Remembers what it was shown; stops after `stop_at` if set.
#[derive(Default)]
struct Recorder {
    seen: Vec<(usize, u64, f64, f64)>,
    stop_at: Option<usize>,
}

impl StageHook for Recorder {
    type Annotation = serde_json::Value;
    async fn after_stage(&mut self, done: &FinishedStage<'_>) -> HookOutcome {
        self.seen.push((
            done.index,
            done.client.requests_ok,
            done.start_unix,
            done.end_unix,
        ));
        let annotation = serde_json::json!({ "seen": done.index });
        if Some(done.index) == self.stop_at {
            HookOutcome::stop("enough").with_annotation(annotation)
        } else {
            HookOutcome::proceed().with_annotation(annotation)
        }
    }
}

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
    let stages: Vec<nyann_load::StageResult> =
        serde_json::from_slice(&std::fs::read(dir.path().join("stages.json")).unwrap()).unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consecutive_errors_abort_with_every_result_written() {
    let server = TestServer::start(Behaviour {
        fault: Fault::Http500,
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![concurrent(30.0, 2), concurrent(30.0, 2)]);
    let opts = RunOptions {
        max_consecutive_errors: 4,
        ..options(&server, dir.path())
    };
    let result = nyann_load::run(&sc, opts, NoHook).await.unwrap();
    let RunOutcome::Aborted { reason } = &result.outcome else {
        panic!("{:?}", result.outcome)
    };
    assert!(
        reason.contains("4 consecutive")
            && reason.contains("HTTP 500")
            && reason.contains("engine dead"),
        "{reason}"
    );
    assert_eq!(result.exit_code(), 1);
    assert_eq!(result.stages[0].status, StageStatus::Interrupted);
    assert_eq!(result.stages[1].status, StageStatus::Skipped);
    let recs = records(dir.path());
    assert_eq!(recs.len() as u64, result.requests_recorded);
    assert!(recs.len() >= 4);
    assert!(
        recs.iter()
            .all(|r| r.status == Status::Failed && r.http_status == Some(500))
    );
    assert!(dir.path().join("summary.json").exists() && dir.path().join("stages.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_keeps_completed_records_and_cancels_the_rest() {
    // Slow tokens: requests are still in flight when the interrupt comes.
    let server = TestServer::start(Behaviour {
        token_delay: Duration::from_millis(200),
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut w = workload();
    w.osl = 40; // 8 s per request: longer than the grace period
    let mut sc = scenario(vec![concurrent(60.0, 3)]);
    sc.workload = w;
    let mut opts = options(&server, dir.path());
    opts.grace = Duration::from_millis(300);
    let token = opts.interrupt.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        token.cancel();
    });
    let result = nyann_load::run(&sc, opts, NoHook).await.unwrap();
    assert_eq!(result.outcome, RunOutcome::Interrupted);
    assert_eq!(result.exit_code(), 130);
    let recs = records(dir.path());
    assert_eq!(recs.len(), 3);
    assert!(recs.iter().all(
        |r| r.status == Status::Cancelled && r.error.as_deref().unwrap().contains("cancelled")
    ));
    assert_eq!(result.stages[0].detail.as_ref().unwrap().cancelled, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constant_rate_sends_rate_times_duration_with_schedule_times() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![open(2.0, Mode::Constant, 40.0)]);
    let result = nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let recs = records(dir.path());
    let mut measured: Vec<_> = recs.iter().filter(|r| r.phase == Phase::Measured).collect();
    // The file is in completion order; arrivals are numbered in schedule order.
    measured.sort_by(|a, b| a.scheduled_at.partial_cmp(&b.scheduled_at).unwrap());
    // 40/s for 2 s = 80 arrivals (+1 for the one at t=0); timer granularity only.
    assert!((78..=82).contains(&measured.len()), "{}", measured.len());
    let start = result.stages[0].start_unix.unwrap();
    for (k, r) in measured.iter().enumerate() {
        let due = r.scheduled_at.unwrap();
        // Arrivals are on the absolute timeline: k/rate after the start.
        assert!(
            (due - start - k as f64 / 40.0).abs() < 0.01,
            "arrival {k} due {}",
            due - start
        );
        assert!(r.sent_at.unwrap() >= due - 1e-3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poisson_rate_count_within_tolerance() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![open(3.0, Mode::Poisson, 100.0)]);
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let n = records(dir.path())
        .iter()
        .filter(|r| r.phase == Phase::Measured)
        .count();
    // Mean 300, sd ~17: 5 sd.
    assert!((215..=385).contains(&n), "{n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_inflight_drops_arrivals_instead_of_delaying_them() {
    let server = TestServer::start(Behaviour {
        token_delay: Duration::from_millis(100),
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    // 100/s with requests of ~0.4 s would need ~40 in flight; the cap is 5.
    let s = Step::Stage(Stage {
        rate: Some(100.0),
        max_inflight: 5,
        ..Stage::new(1.0, Mode::Constant)
    });
    let result = nyann_load::run(&scenario(vec![s]), options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let recs = records(dir.path());
    let dropped = recs.iter().filter(|r| r.status == Status::Dropped).count();
    let sent = recs.iter().filter(|r| r.status == Status::Ok).count();
    assert!(dropped > 50, "{dropped}");
    assert!(sent >= 5, "{sent}");
    assert_eq!(
        result.stages[0].detail.as_ref().unwrap().dropped as usize,
        dropped
    );
    assert!(
        server
            .state
            .max_in_flight
            .load(std::sync::atomic::Ordering::SeqCst)
            <= 5
    );
    // Every arrival is accounted for on schedule: sent or dropped, none delayed.
    assert!((99..=102).contains(&(dropped + sent)), "{}", dropped + sent);
    assert!(
        recs.iter()
            .filter(|r| r.status == Status::Dropped)
            .all(|r| r.sent_at.is_none() && r.scheduled_at.is_some())
    );
}

fn pool_stage(concurrency: u32, size: u32, max_requests: u64) -> Stage {
    Stage {
        concurrency: Some(concurrency),
        conversation_pool_size: size,
        max_requests,
        ..Stage::new(30.0, Mode::ConversationPool)
    }
}

/// (conversation, turn) of each measured record of stage `stage`, in send order.
fn turns_of(dir: &Path, stage: usize) -> Vec<(u64, u32)> {
    let mut recs: Vec<_> = records(dir)
        .into_iter()
        .filter(|r| r.stage == stage && r.phase == Phase::Measured)
        .collect();
    recs.sort_by_key(|r| r.id);
    recs.iter().map(|r| (r.conversation, r.turn)).collect()
}

/// One stream over a pool of three: the working set fills first (three
/// fresh conversations), then the least recently used comes back, one turn
/// at a time, carrying the model's real replies; max_requests counts turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_pool_runs_one_turn_of_the_least_recently_used() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut sc = scenario(vec![Step::Stage(pool_stage(1, 3, 7))]);
    sc.workload.turns = 10;
    let result = nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let turns = turns_of(dir.path(), 0);
    let ids: Vec<u64> = turns.iter().take(3).map(|t| t.0).collect();
    let expected: Vec<(u64, u32)> = [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2), (0, 3)]
        .iter()
        .map(|&(i, turn)| (ids[i], turn))
        .collect();
    assert_eq!(turns, expected);
    assert_eq!(result.stages[0].detail.as_ref().unwrap().sent, 7);
    let detail = result.stages[0].detail.as_ref().unwrap();
    assert_eq!(
        detail.later_turns_ok, 4,
        "first and later turns counted apart"
    );
    // The fourth request is the first conversation's second turn: its
    // first prompt and the server's reply to it, then a new prompt.
    let reqs = server.requests();
    let (first, fourth) = (&reqs[0]["messages"], &reqs[3]["messages"]);
    assert_eq!(fourth.as_array().unwrap().len(), 3, "{fourth}");
    assert_eq!(fourth[0], first[0]);
    assert_eq!(fourth[1]["role"], "assistant");
    assert_eq!(fourth[1]["content"], "m1t0 m1t1 m1t2 m1t3 ");
}

/// Consecutive pool stages of one workload share the pool (the working
/// set grows with the load); a stage of another workload starts afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_persists_across_pool_stages_of_one_workload() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let other = Workload {
        isl: 8,
        ..workload()
    };
    let mut sc = scenario(vec![
        Step::Stage(pool_stage(1, 2, 2)),
        Step::Stage(pool_stage(2, 0, 4)),
        Step::Stage(Stage {
            workload: Some(Workload { turns: 10, ..other }),
            ..pool_stage(1, 1, 1)
        }),
    ]);
    sc.workload.turns = 100;
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let first = turns_of(dir.path(), 0);
    let second = turns_of(dir.path(), 1);
    let third = turns_of(dir.path(), 2);
    assert_eq!(first.iter().map(|t| t.1).collect::<Vec<_>>(), [1, 1]);
    assert_eq!(second.len(), 4);
    assert!(
        second
            .iter()
            .all(|(conv, turn)| first.iter().any(|f| f.0 == *conv) && *turn > 1),
        "the second stage goes on with the first's conversations: {first:?} then {second:?}"
    );
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].1, 1, "another workload: a fresh pool");
    assert!(first.iter().all(|f| f.0 != third[0].0));
}

/// The runner holds a scenario to the very rules (and words) the scenario
/// language does: a hand-built IR is no way around them.
#[tokio::test]
async fn stage_rules_are_the_scenario_languages() {
    let cases = [
        (
            Stage {
                concurrency: Some(1),
                rampup_s: Some(0.0),
                ..Stage::new(1.0, Mode::Concurrent)
            },
            "rampup must be > 0 (or None for no ramp), got 0s",
        ),
        (
            Stage {
                concurrency: Some(0),
                ..Stage::new(1.0, Mode::Concurrent)
            },
            "concurrency must be an int >= 1, got 0",
        ),
    ];
    for (stage, expected) in cases {
        let err = nyann_load::run(
            &scenario(vec![Step::Stage(stage)]),
            RunOptions::default(),
            NoHook,
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_replays_the_real_replies() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut sc = scenario(vec![Step::Stage(Stage {
        concurrency: Some(1),
        max_requests: 3,
        ..Stage::new(30.0, Mode::Concurrent)
    })]);
    sc.workload.turns = 3;
    sc.workload.subsequent_isl = Some(4);
    sc.workload.cache_salt = Some(CacheSalt::Fixed("abc".into()));
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let reqs = server.requests();
    let first = &reqs[0]["messages"];
    let third = &reqs[2]["messages"];
    assert_eq!(first.as_array().unwrap().len(), 1);
    assert_eq!(third.as_array().unwrap().len(), 5, "{third}");
    // The server's reply to turn 1 (1 message in) is replayed as the assistant turn.
    assert_eq!(third[1]["role"], "assistant");
    assert_eq!(third[1]["content"], "m1t0 m1t1 m1t2 m1t3 ");
    assert_eq!(third[3]["content"], "m3t0 m3t1 m3t2 m3t3 ");
    assert_eq!(third[0], first[0], "history is kept verbatim");
    assert_eq!(
        third[4]["content"].as_str().unwrap().len(),
        16,
        "subsequent_isl 4 tokens x 4.0 chars"
    );
    assert!(
        reqs.iter()
            .all(|r| r["cache_salt"] == "abc" && r["ignore_eos"] == true && r["min_tokens"] == 4)
    );
    let recs = records(dir.path());
    assert_eq!(
        recs.iter()
            .filter(|r| r.phase == Phase::Measured)
            .map(|r| r.turn)
            .collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isl_is_calibrated_with_tokenize_when_the_server_has_it() {
    let server = TestServer::start(Behaviour {
        tokenize_chars_per_token: Some(3.0),
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut sc = scenario(vec![Step::Stage(Stage {
        concurrency: Some(1),
        max_requests: 1,
        ..Stage::new(30.0, Mode::Concurrent)
    })]);
    sc.workload.isl = 100;
    sc.workload.chars_per_token = 0.0;
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let prompt = server.requests()[0]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .len();
    assert!(
        (297..=303).contains(&prompt),
        "100 tokens x 3.0 chars: {prompt}"
    );

    // Without /tokenize: the workload's chars_per_token, else 4.0.
    let plain = TestServer::start(Behaviour::default()).await;
    for (cpt, want) in [(2.5, 250), (0.0, 400)] {
        sc.workload.chars_per_token = cpt;
        nyann_load::run(&sc, options(&plain, dir.path()), NoHook)
            .await
            .unwrap();
        let len = plain.requests().last().unwrap()["messages"][0]["content"]
            .as_str()
            .unwrap()
            .len();
        assert_eq!(len, want, "chars_per_token {cpt}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_faults_are_failed_requests_with_reasons() {
    for (fault, reason) in [
        (Fault::ErrorEvent, "out of memory"),
        (Fault::Truncate, "unreadable stream event"),
    ] {
        let server = TestServer::start(Behaviour {
            fault,
            ..Behaviour::default()
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let mut sc = two_requests();
        sc.workload.osl = 6;
        let result = nyann_load::run(&sc, options(&server, dir.path()), NoHook)
            .await
            .unwrap();
        let recs = records(dir.path());
        let measured: Vec<_> = recs.iter().filter(|r| r.phase == Phase::Measured).collect();
        assert_eq!(measured.len(), 2);
        for r in measured {
            assert_eq!(r.status, Status::Failed);
            assert!(
                r.error.as_deref().unwrap().contains(reason),
                "{fault:?}: {:?}",
                r.error
            );
        }
        assert_eq!(result.stages[0].client.as_ref().unwrap().requests_failed, 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_tokens_completions_api_and_model_autodetect() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let sc = two_requests();
    let mut opts = options(&server, dir.path());
    opts.client.api = nyann_load::Api::Completions;
    opts.client.stream_usage = true;
    let result = nyann_load::run(&sc, opts, NoHook).await.unwrap();
    assert_eq!(result.models, vec!["test-model".to_string()]);
    let reqs = server.requests();
    assert_eq!(reqs[0]["model"], "test-model");
    assert!(reqs[0]["prompt"].is_string());
    let r = &records(dir.path())[0];
    assert_eq!(r.status, Status::Ok);
    assert_eq!(r.output_tokens, Some(4));
    assert_eq!(r.output_tokens_source, Some(nyann_load::TokenSource::Usage));
    assert_eq!(r.itl_s.len(), 3);
    assert!(r.ttft_s.unwrap() > 0.0 && r.e2e_s.unwrap() >= r.ttft_s.unwrap());
    assert_eq!(r.finish_reason.as_deref(), Some("length"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_headers_are_sent_with_every_request() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let sc = two_requests();
    let mut opts = options(&server, dir.path());
    opts.client.api_key = Some("sk-test".into());
    opts.client.headers = vec![
        ("X-Team".into(), "perf".into()),
        ("User-Agent".into(), "sweep/1".into()),
    ];
    nyann_load::run(&sc, opts, NoHook).await.unwrap();
    let heads = server.heads();
    assert_eq!(heads.len(), 2);
    for head in heads {
        let lines: Vec<String> = head.lines().map(str::to_ascii_lowercase).collect();
        assert_eq!(lines[0], "post /v1/chat/completions http/1.1", "{head}");
        for expected in [
            format!("host: {}", server.addr),
            "authorization: bearer sk-test".into(),
            "x-team: perf".into(),
            "user-agent: sweep/1".into(),
            "content-type: application/json".into(),
            "accept: text/event-stream".into(),
        ] {
            assert!(lines.contains(&expected), "{expected:?} missing in {head}");
        }
        // The user's User-Agent replaces nyann-bench's own.
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.starts_with("user-agent:"))
                .count(),
            1,
            "{head}"
        );
    }
}

#[tokio::test]
async fn bad_headers_and_targets_are_refused_before_any_load() {
    let sc = scenario(vec![concurrent(1.0, 1)]);
    let mut opts = RunOptions {
        target: Some("localhost:8000/v1".into()),
        ..RunOptions::default()
    };
    let err = nyann_load::run(&sc, opts.clone(), NoHook)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("invalid target URL") && err.contains("http://host:port/v1"),
        "{err}"
    );
    opts.client.headers = vec![("Bad Name".into(), "x".into())];
    let err = nyann_load::run(&sc, opts, NoHook)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Bad Name: x") && err.contains("'Name: value'"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_timeout_says_what_to_do() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener); // nothing listens there now
    let sc = scenario(vec![concurrent(1.0, 1)]);
    let opts = RunOptions {
        target: Some(format!("http://{addr}/v1")),
        ready_timeout: Duration::from_millis(600),
        ..RunOptions::default()
    };
    let err = nyann_load::run(&sc, opts, NoHook)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--ready-timeout") && err.contains(&addr.to_string()),
        "{err}"
    );
}

/// A server that accepts connections and never answers: the readiness wait
/// gives up at --ready-timeout, and its message does not claim an inner
/// wait longer than the whole wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_timeout_bounds_a_silent_server() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let sc = scenario(vec![concurrent(1.0, 1)]);
    let opts = RunOptions {
        target: Some(format!("http://{addr}/v1")),
        ready_timeout: Duration::from_secs(1),
        ..RunOptions::default()
    };
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(30), nyann_load::run(&sc, opts, NoHook))
        .await
        .expect("the readiness wait ends")
        .unwrap_err()
        .to_string();
    silent.abort();
    assert!(err.contains("within 1s"), "{err}");
    assert!(!err.contains("10 s"), "{err}");
    // Generous: the wait is 1 s; before the fix it was 10 s.
    assert!(started.elapsed() < Duration::from_secs(5), "{err}");
}

/// An output directory that cannot be created is refused before the
/// readiness wait, not after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_output_directory_is_checked_before_waiting_for_the_server() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener); // nothing listens there: the readiness wait would fail
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let sc = scenario(vec![concurrent(1.0, 1)]);
    let opts = RunOptions {
        target: Some(format!("http://{addr}/v1")),
        ready_timeout: Duration::from_secs(2),
        output_dir: Some(file.join("results")),
        ..RunOptions::default()
    };
    let err = nyann_load::run(&sc, opts, NoHook).await.unwrap_err();
    assert!(matches!(err, nyann_load::RunError::Output { .. }), "{err}");
    assert!(err.to_string().contains("a-file/results"), "{err}");
}
