//! What the runner checks before any load: the scenario's rules, headers
//! and targets, the readiness wait and the output directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::scenarios::*;
use nyann_load::{NoHook, RunOptions};
use nyann_model::{Mode, Stage, Step};

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
    let err = nyann_load::run(&sc, opts, NoHook).await.unwrap_err();
    // The binary adds the flags to it (start the server, check the target,
    // raise the wait): the error says which server did not answer.
    assert!(
        matches!(
            &err,
            nyann_load::RunError::Client(nyann_load::client::ClientError::NotReady { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

/// A server that accepts connections and never answers: the readiness wait
/// gives up at the ready timeout, and its message does not claim an inner
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

/// A model the server does not list would only collect 404s: refused
/// before any request, naming what the server serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_the_server_does_not_serve_is_refused_before_load() {
    let server = common::TestServer::start(common::Behaviour::default()).await;
    let sc = scenario(vec![concurrent(1.0, 1)]);
    let opts = RunOptions {
        target: Some(server.base.clone()),
        model: Some("llama-typo".into()),
        ..RunOptions::default()
    };
    let err = nyann_load::run(&sc, opts, NoHook).await.unwrap_err();
    assert!(
        matches!(
            &err,
            nyann_load::RunError::Client(nyann_load::client::ClientError::UnknownModel { served, .. })
                if served == &["test-model".to_string()]
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "model \"llama-typo\" is not served at {}/models (it serves test-model)",
            server.base
        )
    );
    assert_eq!(
        server
            .state
            .received
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

/// A target without the API's `/v1`: its `/models` is not found, and that
/// is said at once with the fix, instead of retrying 404s for the whole
/// readiness wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_without_v1_is_told_at_once() {
    let server = common::TestServer::start(common::Behaviour::default()).await;
    let sc = scenario(vec![concurrent(1.0, 1)]);
    let root = format!("http://{}", server.addr);
    let opts = RunOptions {
        target: Some(root.clone()),
        ready_timeout: Duration::from_secs(120),
        ..RunOptions::default()
    };
    let err = tokio::time::timeout(Duration::from_secs(60), nyann_load::run(&sc, opts, NoHook))
        .await
        .expect("said before the readiness wait ends")
        .unwrap_err();
    assert!(
        matches!(
            &err,
            nyann_load::RunError::Client(nyann_load::client::ClientError::MissingV1 { suggested, .. })
                if suggested == &server.base
        ),
        "{err}"
    );
}
