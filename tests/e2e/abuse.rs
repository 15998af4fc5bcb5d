//! The load engine under abuse, with the real binary as a child process:
//! resource limits checked before any request (a low `RLIMIT_NOFILE`, a
//! memory cap), and interrupts that always leave results (real SIGINT and
//! SIGTERM).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{serial, simulator};

/// `nyann-bench ARGS` started by `sh` after `ulimit LIMITS` (both the soft
/// and the hard limit: the binary cannot raise them back).
fn limited(limits: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit {limits} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_nyann-bench"))
        .args(args)
        .kill_on_drop(true);
    command
}

/// The peak resident memory (VmHWM, KiB) of a running process, if readable.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Waits for `child` (at most `limit`), sampling its peak RSS meanwhile;
/// returns its output and the largest peak seen (KiB).
async fn wait_sampling_rss(
    mut child: tokio::process::Child,
    limit: Duration,
) -> (std::process::Output, u64) {
    let pid = child.id().expect("the child runs");
    let mut peak = 0;
    let started = Instant::now();
    loop {
        if let Some(kib) = peak_rss_kib(pid) {
            peak = peak.max(kib);
        }
        if child.try_wait().unwrap().is_some() || started.elapsed() > limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("the child ends")
        .unwrap();
    (output, peak)
}

fn generate_args<'a>(base: &'a str, dir: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "generate",
        "--target",
        base,
        "--workload",
        "synthetic",
        "--isl",
        "16",
        "--seed",
        "1",
        "--output-dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args
}

/// `generate --concurrency C --duration 1s` under `ulimit LIMITS` against
/// the simulator: the child's output and peak RSS (KiB), after checking
/// that it sent no request and wrote no record.
async fn refused_run(limits: &str, concurrency: &str) -> (std::process::Output, u64) {
    let sim = simulator(false).await;
    let base = sim.base_url();
    let dir = tempfile::tempdir().unwrap();
    let args = generate_args(
        &base,
        dir.path(),
        &["--concurrency", concurrency, "--duration", "1s"],
    );
    let child = limited(limits, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (output, peak_kib) = wait_sampling_rss(child, Duration::from_secs(60)).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(sim.requests().is_empty(), "no request was sent");
    assert!(!dir.path().join("requests.jsonl").exists());
    (output, peak_kib)
}

/// More streams than open files: refused before any request, with the
/// numbers and the fixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_streams_than_open_files_are_refused_up_front() {
    let _serial = serial().await;
    let (output, _) = refused_run("-n 256", "1000").await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    for needle in ["1000 connections", "open-file limit", "256", "ulimit -n"] {
        assert!(stderr.contains(needle), "{needle:?} not in:\n{stderr}");
    }
}

/// A billion streams in a one-second stage: refused up front, in little
/// memory, even under a memory cap (it used to spawn a task per stream and
/// grow until killed, or abort under the cap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_concurrency_stays_small_in_memory() {
    let _serial = serial().await;
    // 4 GiB of address space: plenty for the binary, far less than a task
    // per stream.
    let (output, peak_kib) = refused_run("-v 4194304", "1000000000").await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("1000000000 connections"),
        "refused with the numbers:\n{stderr}"
    );
    assert!(peak_kib < 200 * 1024, "peak RSS {peak_kib} KiB");
}

/// Lines of the child's stderr, read as they come; the test waits for the
/// one saying the first signal was seen before it sends the second.
async fn wait_for_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    needle: &str,
    seen: &mut String,
) {
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(needle) {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(found, Ok(true)),
        "no line with {needle:?} in:\n{seen}"
    );
}

fn kill(signal: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Ctrl-C then SIGTERM: the second signal skips the grace period, yet every
/// request in flight is recorded as cancelled and stages.json and
/// summary.json are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_skips_the_grace_period_and_still_writes_every_result() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let base = sim.base_url();
    let dir = tempfile::tempdir().unwrap();
    // Long outputs (512 tokens at c=32: seconds each) and a grace period
    // far longer than the test waits: only the second signal ends the run.
    let args = generate_args(
        &base,
        dir.path(),
        &[
            "--concurrency",
            "32",
            "--duration",
            "5m",
            "--osl",
            "512",
            "--grace",
            "10m",
        ],
    );
    let mut child = crate::support::nyann_bench()
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    wait_for_line(&mut lines, "stage #0 c=32: started", &mut seen).await;
    // Some requests complete, others are in flight.
    let started = Instant::now();
    while sim.requests().iter().filter(|r| r.status == "ok").count() < 4 {
        assert!(started.elapsed() < Duration::from_secs(60), "{seen}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill("-INT", pid);
    wait_for_line(&mut lines, "interrupted", &mut seen).await;
    kill("-TERM", pid);
    let rest = tokio::spawn(async move {
        let mut rest = String::new();
        while let Ok(Some(line)) = lines.next_line().await {
            rest.push_str(&line);
            rest.push('\n');
        }
        rest
    });
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the second signal ends the run long before the grace period")
        .unwrap();
    seen.push_str(&rest.await.unwrap());
    assert_eq!(status.code(), Some(130), "{seen}");

    let read = |name: &str| -> Value {
        let text = std::fs::read_to_string(dir.path().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}\n{seen}"));
        serde_json::from_str(&text).unwrap()
    };
    let summary = read("summary.json");
    let stages = read("stages.json")["stages"].clone();
    assert_eq!(summary["outcome"]["kind"], "interrupted");
    assert_eq!(stages[0]["status"], "interrupted");
    let records: Vec<Value> = std::fs::read_to_string(dir.path().join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        summary["requests_recorded"].as_u64(),
        Some(records.len() as u64)
    );
    let cancelled = records
        .iter()
        .filter(|r| r["status"] == "cancelled")
        .count();
    assert!(cancelled > 0, "requests in flight are recorded cancelled");
    assert!(
        records
            .iter()
            .all(|r| r["status"] == "ok" || r["status"] == "cancelled"),
        "{records:?}"
    );
    // One record per request the simulator received: none lost. (It logs
    // a request the client abandoned once it notices, maybe a little later.)
    let started = Instant::now();
    while sim.requests().len() < records.len() && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(records.len(), sim.requests().len());
    assert_eq!(
        stages[0]["detail"]["cancelled"].as_u64(),
        Some(cancelled as u64)
    );
}

/// An open loop whose requests last far longer than the estimate runs out
/// of open files: the stage names the client as the cause, not the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_open_files_is_named_as_the_clients_own_failure() {
    let _serial = serial().await;
    // Every request stalls 2 s: 150 arrivals a second keep ~300 in flight,
    // where the estimate (150/s x 1.03 s) fits the limit of 256 files.
    let sim = nyann_sim::start(nyann_sim::SimConfig {
        seed: 1,
        profile: nyann_sim::Profile::Fast,
        fault_stall_rate: 1.0,
        fault_stall: Duration::from_secs(2),
        ..nyann_sim::SimConfig::default()
    })
    .await
    .unwrap();
    let base = sim.base_url();
    let dir = tempfile::tempdir().unwrap();
    let args = generate_args(
        &base,
        dir.path(),
        &[
            "--rate",
            "150",
            "--duration",
            "3s",
            "--osl",
            "1",
            "--max-consecutive-errors",
            "0",
        ],
    );
    let output = limited("-n 256", &args).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("errors were the client's own")
            && stderr.contains("the client is the cause"),
        "{stderr}"
    );
    let records = std::fs::read_to_string(dir.path().join("requests.jsonl")).unwrap();
    let own = records
        .lines()
        .filter(|l| l.contains("\"client_error\":true") && l.contains("Too many open files"))
        .count();
    assert!(own > 0, "no record of the client's own failure");
}

/// A disk that fills during the run (here `requests.jsonl` is `/dev/full`,
/// whose every write fails with ENOSPC): the load stops at the first failed
/// write instead of running its stages for nothing, and the run still
/// ends in full: the stage table on stderr, the summary on stdout (and in
/// `summary.json`, whose disk had room), the path and the error named, a
/// non-zero exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_load_and_the_run_still_ends_in_full() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("requests.jsonl");
    std::os::unix::fs::symlink("/dev/full", &records).unwrap();
    let config = dir.path().join("stages.star");
    std::fs::write(
        &config,
        "scenario(stages = [stage(\"4s\", concurrency=c) for c in [4, 8, 16]])\n",
    )
    .unwrap();
    let output = crate::support::nyann_bench()
        .arg("generate")
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.path())
        .args(["--target", &sim.base_url(), "--overwrite"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot write {}: ", records.display()))
            && stderr.contains("No space left on device"),
        "{stderr}"
    );
    // The table and the ending are there.
    assert!(stderr.contains("#0 c=4"), "{stderr}");
    assert!(stderr.contains("the load stopped there"), "{stderr}");
    // The last line names what was written, and only that.
    let results = stderr.lines().last().unwrap();
    assert_eq!(
        results,
        format!(
            "results: {} (summary.json, stages.json)",
            dir.path().display()
        )
    );
    let summary: Value = serde_json::from_slice(&output.stdout).expect("the summary on stdout");
    assert_eq!(summary["outcome"]["kind"], "aborted", "{summary}");
    let stages = summary["stages"].as_array().unwrap();
    assert_eq!(stages[2]["status"], "skipped", "{summary}");
    assert!(
        stages[2]["skip_reason"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{summary}"
    );
    let saved: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(saved["outcome"], summary["outcome"]);
}

/// Ctrl-C while `report.html` is written (here a named pipe nobody reads,
/// so writing it waits forever): the run ends at once with 130, not 0, and
/// its last line does not name the report it did not write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_the_report_exits_130_and_does_not_claim_it() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let base = sim.base_url();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("report.html");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let args = generate_args(&base, dir.path(), &["--duration", "1s", "-v"]);
    let mut child = crate::support::nyann_bench()
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    wait_for_line(&mut lines, "building the HTML report", &mut seen).await;
    kill("-INT", pid);
    while let Some(line) = lines.next_line().await.unwrap() {
        seen.push_str(&line);
        seen.push('\n');
    }
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the run ends")
        .unwrap();
    assert_eq!(status.code(), Some(130), "{seen}");
    assert!(
        seen.contains("the HTML report was not written: interrupted; the results are saved"),
        "{seen}"
    );
    let last = seen.lines().last().unwrap();
    assert!(
        last.starts_with("results: ") && !last.contains("report.html"),
        "{seen}"
    );
}
