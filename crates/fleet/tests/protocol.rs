//! The coordination protocol over real loopback sockets: who is refused at
//! join and why, and a silent leader detected within the heartbeat timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use nyann_fleet::protocol::{ToLeader, ToWorker, receive, scenario_digest, send};
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
        coordinator: addr.parse().unwrap(),
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
            dataset_share: nyann_load::DatasetShare::whole(1),
            run: "r".into(),
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

/// A run result with no stage, as a worker uploads it.
fn empty_result() -> nyann_load::RunResult {
    serde_json::from_value(serde_json::json!({
        "outcome": {"kind": "completed"},
        "start_unix": 0.0, "end_unix": 1.0, "seed": 1, "models": [], "targets": [],
        "totals": nyann_model::ClientStats::default(),
        "totals_detail": nyann_load::StageDetail::default(),
        "requests_recorded": 0, "stages": [],
    }))
    .unwrap()
}

/// A fake leader's side of one upload: the header, then its bytes.
async fn read_upload(
    read: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> (bool, u64) {
    loop {
        match receive::<_, ToLeader>(read).await.unwrap() {
            ToLeader::Upload {
                records_bytes,
                shared,
                ..
            } => return (shared, records_bytes),
            ToLeader::Heartbeat | ToLeader::Rejoin { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// A records upload that fails is tried again: on the same connection
/// when the leader answered `UploadFailed`, on a new one (opened with
/// `Rejoin`) when the connection broke half-way; the bytes arrive whole.
#[tokio::test]
async fn a_failed_upload_is_tried_again_on_the_link_then_on_a_new_connection() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("requests.jsonl");
    let content: Vec<u8> = (0..200_000u32)
        .flat_map(|i| format!("{{\"id\":{i}}}\n").into_bytes())
        .collect();
    std::fs::write(&records, &content).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let expected = content.clone();
    let fake = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut read = tokio::io::BufReader::new(read);
        let _join: ToLeader = receive(&mut read).await.unwrap();
        let welcome = ToWorker::Welcome {
            scenario: Box::new(scenario(1)),
            seed: 1,
            first_id: 0,
            dataset_share: nyann_load::DatasetShare::whole(1),
            run: "r".into(),
        };
        send(&mut write, &welcome).await.unwrap();
        // 1: the leader could not store it (the bytes are read all the same).
        let (shared, bytes) = read_upload(&mut read).await;
        assert!(!shared);
        assert_eq!(bytes, expected.len() as u64);
        let mut sink = Vec::new();
        (&mut read)
            .take(bytes)
            .read_to_end(&mut sink)
            .await
            .unwrap();
        send(
            &mut write,
            &ToWorker::UploadFailed {
                reason: "disk full".into(),
            },
        )
        .await
        .unwrap();
        // 2: the connection breaks half-way.
        let (_, bytes) = read_upload(&mut read).await;
        let mut half = vec![0; (bytes / 2) as usize];
        read.read_exact(&mut half).await.unwrap();
        drop((read, write));
        // 3: a new connection, opened with Rejoin.
        let (stream, _) = listener.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut read = tokio::io::BufReader::new(read);
        let rejoin: ToLeader = receive(&mut read).await.unwrap();
        assert!(
            matches!(&rejoin, ToLeader::Rejoin { index: 1, run, .. } if run == "r"),
            "{rejoin:?}"
        );
        let (_, bytes) = read_upload(&mut read).await;
        let mut whole = Vec::new();
        (&mut read)
            .take(bytes)
            .read_to_end(&mut whole)
            .await
            .unwrap();
        assert!(whole == expected, "the bytes arrive whole");
        send(&mut write, &ToWorker::Received).await.unwrap();
    });
    let joined = join(&worker(addr, 1, 2, "v1")).await.unwrap();
    let gate = joined.start(CancellationToken::new(), CancellationToken::new());
    let shared = gate
        .upload(
            &empty_result(),
            Some(&records),
            Some(dir.path()),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    assert!(!shared);
    fake.await.unwrap();
}

/// An idle connection to the leader's port delays no join: each
/// connection is admitted on its own task.
#[tokio::test]
async fn an_idle_connection_delays_no_join() {
    let dir = tempfile::tempdir().unwrap();
    let leader = Leader::bind(
        "127.0.0.1:0".parse().unwrap(),
        LeaderConfig {
            workers: 2,
            // An idle connection would hold a one-at-a-time admission this long.
            heartbeat_timeout: Duration::from_secs(60),
            join_timeout: Duration::from_secs(30),
            on_loss: OnWorkerLoss::Continue,
            build: "v1".into(),
            output_dir: dir.path().into(),
        },
    )
    .await
    .unwrap();
    let addr = leader.local_addr().unwrap().to_string();
    let _idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let sc = scenario(2);
    let gathering = tokio::spawn(async move {
        leader
            .gather(
                &sc,
                1,
                NoHook,
                CancellationToken::new(),
                CancellationToken::new(),
            )
            .await
            .map(|_| ())
    });
    let config = WorkerConfig {
        join_timeout: Duration::from_secs(30),
        ..worker(addr, 1, 2, "v1")
    };
    join(&config).await.unwrap();
    gathering.await.unwrap().unwrap();
}

/// Forwards connections to `to`; the first one is cut (both ways) once
/// `cut_after` bytes went from the worker to the leader. Also returns the
/// count of connections made through it.
async fn cutting_proxy(
    to: String,
    cut_after: usize,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        for connection in 0.. {
            let (client, _) = listener.accept().await.unwrap();
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let server = tokio::net::TcpStream::connect(&to).await.unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let back = tokio::spawn(async move {
                let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
            });
            tokio::spawn(async move {
                let limit = if connection == 0 {
                    cut_after
                } else {
                    usize::MAX
                };
                let mut sent = 0;
                let mut buf = vec![0; 16 << 10];
                while sent < limit {
                    let n = match client_read.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n.min(limit - sent),
                    };
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    sent += n;
                }
                // Cut: both directions close.
                back.abort();
                drop(server_write);
            });
        }
    });
    (addr, count)
}

/// The real leader: a worker whose upload's connection breaks half-way
/// reconnects (`Rejoin`) and uploads again; the leader keeps the records
/// of the attempt that arrived whole, under a name no worker writes.
#[tokio::test]
async fn the_leader_takes_a_retried_upload_on_a_new_connection() {
    let dir = tempfile::tempdir().unwrap();
    let leader_dir = dir.path().join("leader");
    let worker_dir = dir.path().join("worker");
    std::fs::create_dir_all(&worker_dir).unwrap();
    let records = worker_dir.join("requests.jsonl");
    let content: Vec<u8> = (0..100_000u32)
        .flat_map(|i| format!("{{\"id\":{i}}}\n").into_bytes())
        .collect();
    std::fs::write(&records, &content).unwrap();
    let leader = Leader::bind(
        "127.0.0.1:0".parse().unwrap(),
        LeaderConfig {
            workers: 2,
            heartbeat_timeout: Duration::from_secs(5),
            join_timeout: Duration::from_secs(30),
            on_loss: OnWorkerLoss::Abort,
            build: "v1".into(),
            output_dir: leader_dir.clone(),
        },
    )
    .await
    .unwrap();
    let (proxy, connections) =
        cutting_proxy(leader.local_addr().unwrap().to_string(), 300_000).await;
    let sc = Scenario {
        steps: vec![Step::Barrier { drain: false }],
        ..scenario(1)
    };
    let gathering = tokio::spawn(async move {
        leader
            .gather(
                &sc,
                1,
                NoHook,
                CancellationToken::new(),
                CancellationToken::new(),
            )
            .await
            .map_err(|e| e.to_string())
    });
    let joined = join(&worker(proxy, 1, 2, "v1")).await.unwrap();
    let gate = gathering.await.unwrap().unwrap();
    let worker_gate = joined.start(CancellationToken::new(), CancellationToken::new());
    let uploading = tokio::spawn(async move {
        worker_gate
            .upload(
                &empty_result(),
                Some(&records),
                Some(&worker_dir),
                Duration::from_secs(20),
            )
            .await
            .map_err(|e| e.to_string())
    });
    let fleet = gate
        .finish(empty_result(), None, Duration::from_secs(30))
        .await;
    assert_eq!(uploading.await.unwrap(), Ok(false));
    assert_eq!(fleet.aborted, None, "a broken upload is no lost worker");
    assert!(fleet.departed.is_empty(), "{:?}", fleet.departed);
    let run = &fleet.runs[0];
    let stored = run.records.as_ref().expect("the records arrived");
    assert_eq!(
        stored.path,
        leader_dir.join("worker-1/requests.uploaded.jsonl")
    );
    assert!(std::fs::read(&stored.path).unwrap() == content, "whole");
    assert!(
        !leader_dir
            .join("worker-1/requests.uploaded.jsonl.partial")
            .exists()
    );
    let connections = connections.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(connections, 2, "the cut one, then the retry");
}
