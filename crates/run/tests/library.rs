//! Runs through the library, as a service or a test would start one: no
//! command line, the built-in simulator (in-process, ephemeral loopback
//! ports, no jitter or drift) as the server, short stages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use nyann_fleet::{Coordinator, OnWorkerLoss};
use nyann_load::{RunOptions, StageStatus};
use nyann_policy_host::HostConfig;
use nyann_run::fleet::{Worker, WorkerSpec};
use nyann_run::{
    ExecuteError, LeadSpec, Notice, Output, PolicySpec, PrepareError, Report, Run, RunSpec,
};
use nyann_signals::SignalOptions;
use nyann_sim::{RunningSim, SimConfig};

/// A sweep the simulator's default profile (16 running sequences, 224 KV
/// blocks) takes at c=2 and is congested by at c=32: preemptions, a full
/// KV cache.
const SWEEP: &str = r#"
scenario(
    workload = workload("faker", isl=128, osl=256),
    stages = until_congested(
        [stage("1500ms", concurrency=c) for c in [2, 32, 64]],
        waiting_requests_p50=8,
        ttft_p99="1s",
        kv_cache_usage=0.95,
        preemptions=1,
    ),
)
"#;

/// One stage, judged by nothing.
const PLAIN: &str = r#"
scenario(
    workload = workload("faker", isl=64, osl=32),
    stages = [stage("1s", concurrency=4)],
)
"#;

async fn simulator(config: SimConfig) -> RunningSim {
    nyann_sim::start(SimConfig {
        seed: 1,
        jitter: Some(0.0),
        drift: Some(0.0),
        ..config
    })
    .await
    .expect("the simulator starts")
}

fn load(target: String) -> RunOptions {
    RunOptions {
        target: Some(target),
        seed: 7,
        ready_timeout: Duration::from_secs(10),
        ..RunOptions::default()
    }
}

/// The built-in policy, its compiled code kept nowhere (not in the
/// user's cache).
fn builtin_policy() -> PolicySpec {
    PolicySpec {
        host: HostConfig {
            cache_dir: None,
            ..HostConfig::default()
        },
        ..PolicySpec::default()
    }
}

fn output(dir: &Path) -> Option<Output> {
    Some(Output {
        dir: dir.to_path_buf(),
        overwrite: false,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_stops_at_congestion_and_leaves_its_run_directory() {
    let sim = simulator(SimConfig::default()).await;
    let (_, metrics) = sim.metrics_endpoints().into_iter().next().unwrap();
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("run");
    let spec = RunSpec {
        source: Some(SWEEP.to_string()),
        load: load(sim.base_url()),
        signals: SignalOptions {
            scrape: vec![nyann_signals::ScrapeTarget {
                role: "aggregate".into(),
                url: format!("http://{metrics}/metrics"),
            }],
            scrape_interval: Duration::from_millis(250),
            ..SignalOptions::default()
        },
        policy: builtin_policy(),
        output: output(&dir),
        ..RunSpec::new(nyann_scenario::compile_str("sweep.star", SWEEP).unwrap())
    };
    let notices = Mutex::new(Vec::new());
    let prepared = Run::new(spec)
        .prepare(&|notice| notices.lock().unwrap().push(notice))
        .await
        .unwrap();
    assert!(notices.lock().unwrap().is_empty(), "{notices:?}");

    // The progress channel: the live figures, read while the load runs.
    let live = prepared.live();
    let watched = tokio::spawn(async move {
        let mut stages = Vec::new();
        for _ in 0..200 {
            let now = live.snapshot();
            if let Some(index) = now.stage_index
                && stages.last() != Some(&index)
            {
                stages.push(index);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stages
    });
    let executed = prepared.execute().await.unwrap();
    let finished = executed.finish().await;
    sim.shutdown().await;

    let outcome = &finished.result.outcome;
    assert!(
        matches!(outcome, nyann_load::RunOutcome::Stopped { .. }),
        "{outcome:?}"
    );
    let statuses: Vec<StageStatus> = finished.result.stages.iter().map(|s| s.status).collect();
    assert_eq!(
        statuses,
        [
            StageStatus::Measured,
            StageStatus::Measured,
            StageStatus::Skipped
        ],
        "c=64 is not run"
    );
    let knee = finished.conclusion.lines();
    assert!(
        knee.contains("knee (congested from #1 c=32): #0 c=2"),
        "{knee}"
    );
    assert_eq!(finished.report, Report::Written);
    assert_eq!(finished.exit_code(), 0);
    let summary: serde_json::Value =
        serde_json::from_str(&finished.summary_json().unwrap()).unwrap();
    assert!(summary["conclusion"].is_object(), "{summary}");
    for file in [
        "summary.json",
        "stages.json",
        "requests.jsonl",
        "report.html",
        "scenario.star",
        "server.json",
        "metrics/aggregate-0-start.txt",
        "metrics/aggregate-0-end.txt",
    ] {
        assert!(dir.join(file).is_file(), "{file} is written");
    }
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(written["conclusion"], summary["conclusion"]);
    let seen = watched.await.unwrap();
    assert_eq!(seen, vec![0, 1], "the live figures follow the stages");
}

#[tokio::test]
async fn a_run_directory_holding_a_run_is_refused_unless_overwritten() {
    let temp = tempfile::tempdir().unwrap();
    std::fs::write(temp.path().join("summary.json"), "{}").unwrap();
    let plain = || nyann_scenario::compile_str("plain.star", PLAIN).unwrap();
    let refused = Run::new(RunSpec {
        output: output(temp.path()),
        ..RunSpec::new(plain())
    })
    .prepare(&|_| {})
    .await;
    let Err(PrepareError::PreviousRun(previous)) = refused else {
        panic!("refused: {:?}", refused.err());
    };
    assert_eq!(previous.file, "summary.json");
    assert_eq!(previous.dir, temp.path());
    assert!(previous.written.is_some());

    let notices = Mutex::new(Vec::new());
    let overwrite = RunSpec {
        output: Some(Output {
            dir: temp.path().to_path_buf(),
            overwrite: true,
        }),
        // Signals no stage reads: said, not refused.
        signals: SignalOptions {
            scrape: vec!["127.0.0.1:9/metrics".parse().unwrap()],
            ..SignalOptions::default()
        },
        ..RunSpec::new(plain())
    };
    let prepared = Run::new(overwrite)
        .prepare(&|notice| notices.lock().unwrap().push(notice))
        .await;
    assert!(prepared.is_ok(), "{:?}", prepared.err());
    assert!(matches!(
        notices.lock().unwrap().as_slice(),
        [Notice::SignalsUnread]
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_before_the_server_answers_sends_no_load() {
    // A server that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let run = Run::new(RunSpec {
        load: load(format!("http://{addr}/v1")),
        ..RunSpec::new(nyann_scenario::compile_str("plain.star", PLAIN).unwrap())
    });
    let stop = run.stop();
    let prepared = run.prepare(&|_| {}).await.unwrap();
    let executing = tokio::spawn(prepared.execute());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(stop.request(), 1);
    let ended = tokio::time::timeout(Duration::from_secs(5), executing)
        .await
        .expect("the stop ends the wait for the server")
        .unwrap();
    let Err(err) = ended else {
        panic!("a run without a server ran");
    };
    assert!(err.is_interrupted(), "{err}");
    assert!(matches!(err, ExecuteError::Load(_)));
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_and_a_worker_run_one_sweep_and_merge_it() {
    let sim = simulator(SimConfig::fast()).await;
    let temp = tempfile::tempdir().unwrap();
    let (lead_dir, work_dir) = (temp.path().join("lead"), temp.path().join("work"));
    let plain = || nyann_scenario::compile_str("plain.star", PLAIN).unwrap();
    let leading = RunSpec {
        load: load(sim.base_url()),
        output: output(&lead_dir),
        lead: Some(LeadSpec {
            workers: 2,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            heartbeat_timeout: Duration::from_secs(5),
            join_timeout: Duration::from_secs(30),
            on_loss: OnWorkerLoss::Continue,
            build: "test".into(),
        }),
        ..RunSpec::new(plain())
    };
    let prepared = Run::new(leading).prepare(&|_| {}).await.unwrap();
    let port = prepared.coordinator().expect("the leader listens").port();
    let worker = Worker::new(WorkerSpec {
        load: load(sim.base_url()),
        // Its own directory: its records travel to the leader.
        output: output(&work_dir).unwrap(),
        scenario: Some(plain()),
        coordinator: Coordinator {
            host: "127.0.0.1".into(),
            port,
        },
        index: 1,
        workers: 2,
        heartbeat_timeout: Duration::from_secs(5),
        join_timeout: Duration::from_secs(30),
        build: "test".into(),
    });
    let working = tokio::spawn(async move {
        let joined = worker.join().await.unwrap();
        let ran = joined.execute().await.unwrap();
        assert!(ran.own_dir.join("requests.jsonl").is_file());
        ran.upload().await
    });
    let executed = prepared.execute().await.unwrap();
    assert!(executed.departed().is_empty());
    assert!(executed.missing_records().is_empty());
    let finished = executed.finish().await;
    let uploaded = working.await.unwrap();
    sim.shutdown().await;

    assert!(uploaded.upload.is_ok(), "{:?}", uploaded.upload);
    assert_eq!(uploaded.exit_code(), 0);
    assert_eq!(finished.exit_code(), 0);
    let records = std::fs::read_to_string(lead_dir.join("requests.jsonl")).unwrap();
    assert_eq!(
        records.lines().count() as u64,
        finished.result.requests_recorded
    );
    let workers: std::collections::BTreeSet<u64> = records
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .map(|record| record["worker"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(workers.len(), 2, "both workers' records are merged");
    for file in ["fleet.json", "report.html", "worker-0/requests.jsonl"] {
        assert!(lead_dir.join(file).is_file(), "{file} is written");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&finished.summary_json().unwrap()).unwrap();
    let fleet = &summary["stages"][0]["annotation"]["fleet"];
    assert_eq!(
        fleet["judged_workers"],
        serde_json::json!([0, 1]),
        "{summary}"
    );
}
