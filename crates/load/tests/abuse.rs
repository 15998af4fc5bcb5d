//! The runner under abuse: a server that refuses connections, one that
//! sheds load (429/503), a request that never ends, a check interrupted
//! mid-way, and a client too busy to read its sockets at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Behaviour, Fault, TestServer};
use nyann_load::{FinishedStage, HookOutcome, NoHook, RunOptions, RunOutcome, StageHook};
use nyann_model::{Mode, Scenario, Stage, Step, Workload, WorkloadType};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn concurrent(duration_s: f64, c: u32) -> Step {
    Step::Stage(Stage {
        concurrency: Some(c),
        ..Stage::new(duration_s, Mode::Concurrent)
    })
}

fn scenario(steps: Vec<Step>, osl: u32) -> Scenario {
    Scenario {
        target: None,
        model: None,
        workload: Workload {
            kind: WorkloadType::Synthetic,
            isl: 16,
            osl,
            chars_per_token: 4.0,
            ..Workload::default()
        },
        steps,
    }
}

fn options(base: &str, dir: &Path) -> RunOptions {
    RunOptions {
        target: Some(base.to_string()),
        seed: 7,
        ready_timeout: Duration::from_secs(5),
        grace: Duration::from_secs(2),
        output_dir: Some(dir.to_path_buf()),
        ..RunOptions::default()
    }
}

/// The records of a run as JSON.
fn records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn count(records: &[Value], status: &str) -> usize {
    records.iter().filter(|r| r["status"] == status).count()
}

/// Answers GET /models once, then closes its listener: every later
/// connection is refused at once.
async fn ready_then_refusing() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        drop(listener);
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut piece = [0u8; 1024];
            let n = socket.read(&mut piece).await.unwrap();
            head.extend_from_slice(&piece[..n]);
        }
        let body = r#"{"data":[{"id":"m"}]}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(answer.as_bytes()).await.unwrap();
    });
    base
}

/// A failed request is not retried at once: each stream backs off, so
/// failures per second against a dead server stay few.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_against_a_refusing_server_back_off() {
    let base = ready_then_refusing().await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![concurrent(3.0, 4)], 4);
    let opts = RunOptions {
        max_consecutive_errors: 0,
        ..options(&base, dir.path())
    };
    let result = nyann_load::run(&sc, opts, NoHook).await.unwrap();
    assert_eq!(result.outcome, RunOutcome::Completed);
    let recs = records(dir.path());
    let failed = count(&recs, "failed");
    assert_eq!(failed, recs.len());
    // 4 streams for 3 s: a handful of attempts each with backoff (it was
    // tens of thousands without).
    assert!((4..=60).contains(&failed), "{failed} failures in 3 s");
    assert!(
        recs[0]["error"]
            .as_str()
            .unwrap()
            .contains("Connection refused"),
        "{:?}",
        recs[0]
    );
}

/// 429 (and 503 with Retry-After) is a server shedding load: recorded as
/// `rejected`, counted per stage, waited out per Retry-After, never an
/// abort. A 503 without Retry-After is an error like any 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_are_counted_waited_out_and_never_abort() {
    for status in [429, 503] {
        let server = TestServer::start(Behaviour {
            fault: Fault::Reject {
                status,
                retry_after: Some(1),
            },
            ..Behaviour::default()
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let sc = scenario(vec![concurrent(2.5, 2)], 4);
        // The default --max-consecutive-errors (5) stays in force.
        let result = nyann_load::run(&sc, options(&server.base, dir.path()), NoHook)
            .await
            .unwrap();
        assert_eq!(result.outcome, RunOutcome::Completed, "HTTP {status}");
        let recs = records(dir.path());
        let rejected = count(&recs, "rejected");
        assert_eq!(rejected, recs.len(), "HTTP {status}: {:?}", recs.first());
        assert!(recs.iter().all(|r| r["http_status"] == status));
        // Retry-After: 1 on each of 2 streams over 2.5 s: 3 each at most.
        assert!((2..=6).contains(&rejected), "HTTP {status}: {rejected}");
        let stage = serde_json::to_value(&result.stages[0]).unwrap();
        assert_eq!(stage["client"]["requests_rejected"], rejected as u64);
        assert_eq!(stage["client"]["requests_failed"], 0);
        assert!(stage["client"]["rejected_per_second"].as_f64().unwrap() > 0.0);
    }

    let server = TestServer::start(Behaviour {
        fault: Fault::Reject {
            status: 503,
            retry_after: None,
        },
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![concurrent(30.0, 1)], 4);
    let opts = RunOptions {
        max_consecutive_errors: 3,
        ..options(&server.base, dir.path())
    };
    let result = nyann_load::run(&sc, opts, NoHook).await.unwrap();
    assert!(
        matches!(&result.outcome, RunOutcome::Aborted { reason } if reason.contains("HTTP 503")),
        "{:?}",
        result.outcome
    );
    assert_eq!(count(&records(dir.path()), "failed"), 3);
}

/// One request that never ends holds the next stage back for the drain
/// time only; it is recorded as `late`, outside the latency statistics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_ends_is_late_and_the_next_stage_starts() {
    let server = TestServer::start(Behaviour {
        fault: Fault::HangFirst,
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![concurrent(1.0, 2), concurrent(1.0, 2)], 4);
    let mut opts = options(&server.base, dir.path());
    opts.client.request_timeout = Duration::from_secs(120);
    opts.drain_timeout = Duration::from_millis(500);
    let result = tokio::time::timeout(Duration::from_secs(60), nyann_load::run(&sc, opts, NoHook))
        .await
        .expect("the drain is bounded")
        .unwrap();
    assert_eq!(result.outcome, RunOutcome::Completed);
    let first = serde_json::to_value(&result.stages[0]).unwrap();
    assert_eq!(first["client"]["requests_late"], 1, "{first}");
    assert_eq!(first["status"], "measured");
    let second = &result.stages[1];
    assert_eq!(second.status, nyann_load::StageStatus::Measured);
    // The next stage started after the drain time, not the request timeout.
    let gap = second.start_unix.unwrap() - result.stages[0].end_unix.unwrap();
    assert!(gap < 20.0, "{gap} s between the stages");
    let recs = records(dir.path());
    let late: Vec<_> = recs.iter().filter(|r| r["status"] == "late").collect();
    assert_eq!(late.len(), 1, "of {} records", recs.len());
    assert_eq!(late[0]["stage"], 0);
    assert!(
        late[0]["error"]
            .as_str()
            .unwrap()
            .contains("drain time ran out"),
        "{:?}",
        late[0]
    );
    // The late request counts in no latency: every other request was ok.
    assert_eq!(
        first["client"]["requests_ok"].as_u64().unwrap() as usize,
        recs.iter()
            .filter(|r| r["stage"] == 0 && r["phase"] == "measured" && r["status"] == "ok")
            .count()
    );
}

/// A warm-up request that never ends is cut at a draining barrier; the
/// stages after it run normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_drain_is_bounded_too_and_later_stages_are_untouched() {
    let server = TestServer::start(Behaviour {
        fault: Fault::HangFirst,
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut warmup = Stage {
        concurrency: Some(2),
        ..Stage::new(0.5, Mode::Concurrent)
    };
    warmup.warmup = true;
    let sc = scenario(
        vec![
            Step::Stage(warmup),
            Step::Barrier { drain: true },
            concurrent(1.0, 2),
        ],
        4,
    );
    let mut opts = options(&server.base, dir.path());
    opts.client.request_timeout = Duration::from_secs(120);
    opts.drain_timeout = Duration::from_millis(500);
    let result = tokio::time::timeout(Duration::from_secs(60), nyann_load::run(&sc, opts, NoHook))
        .await
        .expect("the barrier's drain is bounded")
        .unwrap();
    assert_eq!(result.outcome, RunOutcome::Completed);
    let recs = records(dir.path());
    let late: Vec<_> = recs.iter().filter(|r| r["status"] == "late").collect();
    assert_eq!(late.len(), 1, "of {} records", recs.len());
    assert_eq!(late[0]["phase"], "warmup");
    let last = result.stages[2].client.as_ref().unwrap();
    assert!(last.requests_ok > 0 && last.requests_late == 0, "{last:?}");
}

/// Interrupted while the stage hook (the congestion check) runs: the stage
/// says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_interrupted_mid_way_is_recorded_on_its_stage() {
    struct Forever(nyann_load::CancellationToken);
    impl StageHook for Forever {
        type Annotation = serde_json::Value;
        async fn after_stage(&mut self, _: &FinishedStage<'_>) -> HookOutcome {
            self.0.cancel();
            std::future::pending().await
        }
    }
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![concurrent(0.5, 1), concurrent(0.5, 1)], 4);
    let opts = options(&server.base, dir.path());
    let result = nyann_load::run(&sc, opts.clone(), Forever(opts.interrupt.clone()))
        .await
        .unwrap();
    assert_eq!(result.outcome, RunOutcome::Interrupted);
    let first = serde_json::to_value(&result.stages[0]).unwrap();
    assert_eq!(first["status"], "measured", "{first}");
    assert_eq!(first["check_interrupted"], true, "{first}");
    let stages: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("stages.json")).unwrap()).unwrap();
    assert_eq!(stages["stages"][0]["check_interrupted"], true);
    assert_eq!(stages["stages"][1]["status"], "skipped");
}

/// An OpenAI-like server that answers in bursts: every 200 ms, each waiting
/// request gets its whole stream (8 text chunks in two writes 5 ms apart,
/// the second ending with `[DONE]`), so that a thousand responses arrive at
/// once and the client reads the last of them well after they arrived.
async fn burst_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let tick = Arc::new(tokio::sync::Notify::new());
    let ticker = tick.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            ticker.notify_waiters();
        }
    });
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve_bursts(socket, tick.clone()));
        }
    });
    base
}

async fn serve_bursts(mut socket: tokio::net::TcpStream, tick: Arc<tokio::sync::Notify>) {
    let chunk =
        |i: usize| format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n");
    let first: String = (0..4).map(chunk).collect();
    let second = format!(
        "{}data: {{\"choices\":[{{\"delta\":{{}},\"finish_reason\":\"length\"}}]}}\n\ndata: [DONE]\n\n",
        (4..8).map(chunk).collect::<String>()
    );
    let mut buffer = Vec::new();
    loop {
        // One request: its head, then its body (Content-Length).
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut piece = [0u8; 4096];
            match socket.read(&mut piece).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&piece[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut piece = [0u8; 4096];
            match socket.read(&mut piece).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&piece[..n]),
            }
        }
        buffer.drain(..head_end + length);
        if head.starts_with("get /v1/models") {
            let body = r#"{"data":[{"id":"m"}]}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            if socket.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        if !head.starts_with("post /v1/chat/completions") {
            let answer = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
            if socket.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
            continue;
        }
        tick.notified().await;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{first}",
            first.len() + second.len()
        );
        if socket.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        if socket.write_all(second.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn percentile(mut xs: Vec<f64>, q: f64) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() - 1) as f64 * q) as usize]
}

/// E2E is dated by the same clock as TTFT and the inter-chunk latencies
/// (when the bytes arrived, not when a busy client read them): at c=1024,
/// E2E - (TTFT + sum of ITL) is ~0, never negative.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_is_dated_like_ttft_and_itl_at_c1024() {
    // 1024 client and 1024 server sockets in this process.
    let limit = nyann_load::raise_fd_limit().unwrap_or(0);
    assert!(
        limit >= 2300,
        "this test needs 2300 open files; the hard limit allows {limit}"
    );
    let base = burst_server().await;
    let dir = tempfile::tempdir().unwrap();
    let sc = scenario(vec![concurrent(2.0, 1024)], 8);
    let opts = RunOptions {
        max_consecutive_errors: 0,
        ..options(&base, dir.path())
    };
    let result = nyann_load::run(&sc, opts, NoHook).await.unwrap();
    assert_eq!(result.outcome, RunOutcome::Completed);
    let gaps: Vec<f64> = records(dir.path())
        .iter()
        .filter(|r| r["status"] == "ok")
        .map(|r| {
            let itl: f64 = r["itl_s"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .sum();
            r["e2e_s"].as_f64().unwrap() - r["ttft_s"].as_f64().unwrap() - itl
        })
        .collect();
    assert!(gaps.len() >= 1024, "{} requests", gaps.len());
    let (low, median) = (percentile(gaps.clone(), 0.01), percentile(gaps, 0.5));
    assert!(
        low >= -0.001 && median <= 0.001,
        "E2E - (TTFT + sum ITL): p1 {low:.6} s, p50 {median:.6} s"
    );
}
