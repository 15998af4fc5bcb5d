//! The commonest failures as a user meets them, snapshotted whole (exit
//! code, stdout, stderr): each cause said once, with what to do next. A
//! substring test would pass a message that says its OS error three times;
//! these do not. Paths and addresses that differ per run are replaced by
//! names (`DIR`, `TARGET`, ...) before the comparison.
//!
//! `INSTA_UPDATE=always cargo test --release --test e2e failures` rewrites
//! the snapshots (`tests/e2e/snapshots/`); review the diff.

use std::path::Path;
use std::process::Output;

use nyann_sim::RunningSim;

use crate::support::{nyann_bench, scrape_flags, simulator};

/// Exit code, stdout and stderr of `output` as one text, with each
/// `(from, to)` of `names` replaced.
pub fn failure(output: &Output, names: &[(&str, &str)]) -> String {
    let name = |text: &[u8]| {
        names.iter().fold(
            String::from_utf8_lossy(text).into_owned(),
            |text, (from, to)| text.replace(from, to),
        )
    };
    format!(
        "exit code: {}\n--- stdout\n{}--- stderr\n{}",
        output
            .status
            .code()
            .map_or_else(|| "none (a signal)".to_string(), |c| c.to_string()),
        name(&output.stdout),
        name(&output.stderr)
    )
}

/// `nyann-bench ARGS` run in `dir`, quiet (errors only: no timestamps).
async fn run_in(dir: &Path, args: &[&str]) -> Output {
    nyann_bench()
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .arg("-q")
        .args(args)
        .output()
        .await
        .unwrap()
}

/// `generate ARGS --target SIM` in `dir`, which must fail before sending
/// any request.
async fn refused_in(dir: &Path, sim: &RunningSim, args: &[&str]) -> String {
    let mut all = vec!["generate", "--target"];
    let target = sim.base_url();
    all.push(&target);
    all.extend_from_slice(args);
    let output = run_in(dir, &all).await;
    assert!(sim.requests().is_empty(), "no request may be sent");
    failure(&output, &[(&target, "TARGET")])
}

/// A two-stage sweep stopped by `until_congested` with `params`.
const SWEEP: &str = r#"scenario(
    workload = workload("synthetic", isl=60, osl=128),
    stages = until_congested([stage("5s", concurrency=c) for c in [1, 2]], PARAMS),
)
"#;

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// A copy of a run recorded against the real vLLM (reference/).
fn recorded_run(into: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../reference/vllm-cpu-runs/kv-A");
    std::fs::create_dir_all(into).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), into.join(entry.file_name())).unwrap();
    }
}

#[tokio::test]
async fn report_of_a_directory_that_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let output = run_in(dir.path(), &["report", "no-such-run"]).await;
    insta::assert_snapshot!(failure(&output, &[]));
}

/// The OS error once, not three times (the report's error chained the
/// records' error, which said it already).
#[tokio::test]
async fn report_of_a_run_whose_requests_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    recorded_run(&dir.path().join("run"));
    let requests = dir.path().join("run/requests.jsonl");
    std::fs::remove_file(&requests).unwrap();
    std::fs::create_dir(&requests).unwrap();
    let output = run_in(dir.path(), &["report", "run"]).await;
    insta::assert_snapshot!(failure(&output, &[]));
}

#[tokio::test]
async fn an_output_directory_that_holds_a_run() {
    let dir = tempfile::tempdir().unwrap();
    recorded_run(&dir.path().join("run"));
    let sim = simulator(false).await;
    let stdout = refused_in(
        dir.path(),
        &sim,
        &["--duration", "1s", "--output-dir", "run"],
    )
    .await;
    // The date the summary was copied at.
    let stdout = match stdout.find(", written ") {
        Some(at) => {
            let end = stdout[at..].find(')').map_or(stdout.len(), |e| at + e);
            format!("{}, written DATE{}", &stdout[..at], &stdout[end..])
        }
        None => stdout,
    };
    insta::assert_snapshot!(stdout);
}

#[tokio::test]
async fn a_scenario_file_that_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(false).await;
    insta::assert_snapshot!(refused_in(dir.path(), &sim, &["--config", "sweep.star"]).await);
}

#[tokio::test]
async fn an_unknown_workload_type() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "sweep.star",
        r#"scenario(workload = workload("sharegtp"), stages = [stage("5s", concurrency=1)])"#,
    );
    let sim = simulator(false).await;
    insta::assert_snapshot!(refused_in(dir.path(), &sim, &["--config", "sweep.star"]).await);
}

#[tokio::test]
async fn a_mistyped_policy_parameter() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "sweep.star",
        &SWEEP.replace("PARAMS", "waiting_p50=8"),
    );
    let sim = simulator(false).await;
    let mut args = vec!["--config".to_string(), "sweep.star".to_string()];
    args.extend(scrape_flags(&sim));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    insta::assert_snapshot!(refused_in(dir.path(), &sim, &args).await);
}

#[tokio::test]
async fn until_congested_without_a_signal_source() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "sweep.star",
        &SWEEP.replace("PARAMS", "waiting_requests_p50=8"),
    );
    let sim = simulator(false).await;
    insta::assert_snapshot!(refused_in(dir.path(), &sim, &["--config", "sweep.star"]).await);
}

#[tokio::test]
async fn a_policy_file_that_is_not_a_component() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "sweep.star",
        &SWEEP.replace("PARAMS", "waiting_requests_p50=8"),
    );
    write(dir.path(), "policy.wasm", "not a component\n");
    let sim = simulator(false).await;
    let mut args = vec![
        "--config".to_string(),
        "sweep.star".to_string(),
        "--policy".to_string(),
        "policy.wasm".to_string(),
    ];
    args.extend(scrape_flags(&sim));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    insta::assert_snapshot!(refused_in(dir.path(), &sim, &args).await);
}

#[tokio::test]
async fn a_ca_certificate_that_does_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(false).await;
    let args = ["--duration", "1s", "--ca-cert", "ca.pem"];
    insta::assert_snapshot!(refused_in(dir.path(), &sim, &args).await);
}

#[tokio::test]
async fn a_ca_certificate_file_with_no_certificate() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ca.pem", "not a certificate\n");
    let sim = simulator(false).await;
    let args = ["--duration", "1s", "--ca-cert", "ca.pem"];
    insta::assert_snapshot!(refused_in(dir.path(), &sim, &args).await);
}

/// A target nothing listens on (a port just released), with a short wait.
#[tokio::test]
async fn a_target_that_does_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let target = format!("http://127.0.0.1:{port}/v1");
    let args = [
        "generate",
        "--target",
        &target,
        "--duration",
        "1s",
        "--ready-timeout",
        "1s",
    ];
    let output = run_in(dir.path(), &args).await;
    let port = port.to_string();
    insta::assert_snapshot!(failure(&output, &[(&port, "PORT")]));
}
