//! Ctrl-C with a real signal: this test binary re-runs itself as a child
//! process that runs a long stage and cancels the run's interrupt token on
//! SIGINT (as `nyann-bench generate` does); the parent sends SIGINT and
//! checks the exit status and that every completed record is kept.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Behaviour, TestServer};
use nyann_load::{NoHook, Phase, RequestRecord, RunOptions, Status};
use nyann_model::{Mode, Scenario, Stage, Step, Workload, WorkloadType};

const CHILD_ENV: &str = "NYANN_LOAD_SIGNAL_CHILD_DIR";
const TARGET_ENV: &str = "NYANN_LOAD_SIGNAL_CHILD_TARGET";

/// The child's body; a no-op unless started by the parent test.
#[test]
fn signal_child_entry() {
    let (Ok(dir), Ok(target)) = (std::env::var(CHILD_ENV), std::env::var(TARGET_ENV)) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let code = runtime.block_on(async move {
        let options = RunOptions {
            target: Some(target),
            seed: 1,
            grace: Duration::from_millis(500),
            output_dir: Some(dir.into()),
            ..RunOptions::default()
        };
        let interrupt = options.interrupt.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                interrupt.cancel();
            }
        });
        let stage = Stage {
            concurrency: Some(4),
            ..Stage::new(120.0, Mode::Concurrent)
        };
        let workload = Workload {
            kind: WorkloadType::Synthetic,
            isl: 8,
            osl: 5,
            chars_per_token: 4.0,
            ..Workload::default()
        };
        let scenario = Scenario {
            target: None,
            model: None,
            workload,
            steps: vec![Step::Stage(stage)],
        };
        let result = nyann_load::run(&scenario, options, NoHook).await.unwrap();
        result.exit_code()
    });
    std::process::exit(code as i32);
}

fn records(dir: &Path) -> Vec<RequestRecord> {
    std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_keeps_every_completed_record_and_exits_130() {
    // 5 tokens x 60 ms: ~0.3 s per request, so some are in flight at any time.
    let server = TestServer::start(Behaviour {
        token_delay: Duration::from_millis(60),
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "signal_child_entry",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .env(TARGET_ENV, &server.base)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    // Wait until some requests completed (bounded).
    let start = Instant::now();
    while records(dir.path()).len() < 8 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the child sent nothing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = records(dir.path());
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("child exits")
        .unwrap();
    assert_eq!(exit.code(), Some(130));

    let after = records(dir.path());
    // Nothing completed before the signal is lost.
    for r in &before {
        assert!(after.contains(r), "lost {r:?}");
    }
    // The requests in flight at the signal finished within the grace period
    // (0.3 s < 0.5 s) or were recorded as cancelled; nothing is left unrecorded.
    let server_saw = server.requests().len();
    assert_eq!(
        after.len(),
        server_saw,
        "one record per request the server received"
    );
    assert!(
        after
            .iter()
            .all(|r| matches!(r.status, Status::Ok | Status::Cancelled)
                && r.phase == Phase::Measured)
    );
    let summary: nyann_load::RunResult =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary.outcome, nyann_load::RunOutcome::Interrupted);
    assert_eq!(summary.requests_recorded as usize, after.len());
}
