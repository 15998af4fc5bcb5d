//! The coordination protocol over real loopback sockets: who is refused at
//! join and why, and a silent leader detected within the heartbeat timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use nyann_fleet::protocol::{ToWorker, scenario_digest, send};
use nyann_fleet::{FleetError, Leader, LeaderConfig, OnWorkerLoss, WorkerConfig, join};
use nyann_load::{CancellationToken, NoHook};
use nyann_model::{Mode, Scenario, Stage, Step, Workload};

fn scenario(concurrency: u32) -> Scenario {
    Scenario {
        target: None,
        model: None,
        workload: Workload::default(),
        steps: vec![Step::Stage(Stage {
            concurrency: Some(concurrency),
            ..Stage::new(1.0, Mode::Concurrent)
        })],
    }
}

fn worker(addr: String, index: usize, workers: usize, build: &str) -> WorkerConfig {
    WorkerConfig {
        coordinator: addr,
        index,
        workers,
        heartbeat_timeout: Duration::from_secs(2),
        join_timeout: Duration::from_secs(10),
        build: build.into(),
        scenario_digest: None,
    }
}

#[tokio::test]
async fn workers_that_do_not_fit_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let leader = Leader::bind(
        "127.0.0.1:0".parse().unwrap(),
        LeaderConfig {
            workers: 3,
            heartbeat_timeout: Duration::from_secs(2),
            join_timeout: Duration::from_secs(20),
            on_loss: OnWorkerLoss::Continue,
            build: "v1".into(),
            output_dir: dir.path().into(),
        },
    )
    .await
    .unwrap();
    let addr = leader.local_addr().unwrap().to_string();
    let sc = scenario(7);
    let gathering = {
        let sc = sc.clone();
        tokio::spawn(async move {
            leader
                .gather(
                    &sc,
                    42,
                    NoHook,
                    CancellationToken::new(),
                    CancellationToken::new(),
                )
                .await
                .map(|_| ())
        })
    };
    let refused = |r: Result<nyann_fleet::worker::Joined, FleetError>| match r {
        Err(FleetError::Refused(reason)) => reason,
        Err(other) => panic!("not refused: {other}"),
        Ok(_) => panic!("admitted"),
    };
    let reason = refused(join(&worker(addr.clone(), 1, 3, "v2")).await);
    assert!(
        reason.contains("build is v2") && reason.contains("same image"),
        "{reason}"
    );
    let reason = refused(join(&worker(addr.clone(), 1, 4, "v1")).await);
    assert!(reason.contains("started for 4 workers"), "{reason}");
    let reason = refused(join(&worker(addr.clone(), 3, 3, "v1")).await);
    assert!(reason.contains("its index 3 is not a worker"), "{reason}");
    let wrong = WorkerConfig {
        scenario_digest: Some(scenario_digest(&scenario(8))),
        ..worker(addr.clone(), 1, 3, "v1")
    };
    let reason = refused(join(&wrong).await);
    assert!(reason.contains("scenario"), "{reason}");

    // The right ones get their share: 7 streams are 3 + 2 + 2.
    let same = WorkerConfig {
        scenario_digest: Some(scenario_digest(&sc)),
        ..worker(addr.clone(), 1, 3, "v1")
    };
    let one = join(&same).await.unwrap();
    let reason = refused(join(&worker(addr.clone(), 1, 3, "v1")).await);
    assert!(reason.contains("already joined"), "{reason}");
    let two = join(&worker(addr.clone(), 2, 3, "v1")).await.unwrap();
    gathering.await.unwrap().unwrap();
    for (joined, seed_differs) in [(&one, true), (&two, true)] {
        let Step::Stage(stage) = &joined.assignment.scenario.steps[0] else {
            unreachable!()
        };
        assert_eq!(stage.concurrency, Some(2));
        assert_eq!(joined.assignment.seed != 42, seed_differs);
    }
    assert_ne!(one.assignment.seed, two.assignment.seed);
    assert_ne!(one.assignment.first_id, two.assignment.first_id);
}

/// A leader that welcomes a worker and then says nothing: the worker
/// counts it lost after the heartbeat timeout and interrupts its run.
#[tokio::test]
async fn a_silent_leader_is_lost_within_the_heartbeat_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let welcome = ToWorker::Welcome {
            scenario: Box::new(scenario(1)),
            seed: 1,
            first_id: 0,
        };
        send(&mut stream, &welcome).await.unwrap();
        // Keep the connection open, silent.
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(stream);
    });
    let config = WorkerConfig {
        heartbeat_timeout: Duration::from_millis(500),
        ..worker(addr, 1, 2, "v1")
    };
    let joined = join(&config).await.unwrap();
    let interrupt = CancellationToken::new();
    let started = Instant::now();
    let gate = joined.start(interrupt.clone(), CancellationToken::new());
    tokio::time::timeout(Duration::from_secs(5), interrupt.cancelled())
        .await
        .expect("the run is interrupted");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    let lost = gate.leader_lost().unwrap();
    assert!(lost.contains("no message from the leader"), "{lost}");
    fake.abort();
}
