//! Failures end to end against a local test server: consecutive errors
//! abort the run, an interrupt keeps what completed, faults of a stream
//! are failed requests with their reasons.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::scenarios::*;
use common::{Behaviour, Fault, TestServer, records};
use nyann_load::{NoHook, Phase, RunOptions, RunOutcome, StageStatus, Status};

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
async fn stream_faults_are_failed_requests_with_reasons() {
    for (fault, reason) in [
        (Fault::ErrorEvent, "out of memory"),
        (Fault::Truncate, "unreadable stream event"),
        (
            Fault::WholeJson,
            "the server answered with a whole completion in one JSON body, not an event \
             stream: it ignored \"stream\": true",
        ),
        (
            Fault::JsonError,
            "the server answered with an error in a JSON body, not an event stream: model \
             not loaded",
        ),
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
