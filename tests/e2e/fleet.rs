//! Scale-out: a leader and workers, each a real `nyann-bench
//! generate --workers N` process on 127.0.0.1 standing in for a pod, against
//! the simulator. The sweep stops at the same stage everywhere, fleet counts
//! are the sum of the records, and every fault (a worker or the leader
//! killed, Ctrl-C) ends every process within its bounds with records kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nyann_sim::{RunningSim, SimConfig};
use nyann_testkit::{PrometheusServer, ScrapeJob};
use serde_json::Value;
use tempfile::TempDir;

use crate::support::{
    kubernetes_validate, policy_wasm, scrape_flags, serial, simulator, sweep,
    validate_against_schema,
};
use crate::sweep::STOPS_AT_16;

/// The binary under test; `NYANN_FLEET_BIN` runs these tests against
/// another build (to show that a test fails before its fix).
fn nyann_bench() -> tokio::process::Command {
    match std::env::var_os("NYANN_FLEET_BIN") {
        Some(bin) => {
            let mut command = tokio::process::Command::new(bin);
            command.kill_on_drop(true);
            command
        }
        None => crate::support::nyann_bench(),
    }
}

/// How a fleet is laid out.
#[derive(Debug, Clone, Copy, Default)]
struct Layout {
    /// Every process gets the same `--output-dir` (`shared/`), as with
    /// one volume mounted in every pod; else worker I gets `wI/`.
    shared: bool,
    /// Workers are given `--coordinator http://HOST:PORT`.
    url: bool,
}

/// A fleet's processes: index 0 leads.
struct Fleet {
    dir: TempDir,
    children: Vec<tokio::process::Child>,
    layout: Layout,
}

impl Fleet {
    /// Starts the leader with `scenario` and `extra` flags, reads its
    /// coordination address, then starts workers 1..n with `extra`.
    async fn start(
        sim_url: &str,
        scenario: &str,
        n: usize,
        lead: &[String],
        extra: &[&str],
    ) -> Fleet {
        Fleet::start_with(sim_url, scenario, n, lead, extra, Layout::default()).await
    }

    async fn start_with(
        sim_url: &str,
        scenario: &str,
        n: usize,
        lead: &[String],
        extra: &[&str],
        layout: Layout,
    ) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("scenario.star");
        std::fs::write(&config, scenario).unwrap();
        let common = |index: usize| -> Vec<String> {
            let mut args: Vec<String> = [
                "generate",
                "--workers",
                &n.to_string(),
                "--worker-index",
                &index.to_string(),
                "--target",
                sim_url,
                "--heartbeat-timeout",
                "1s",
                "--join-timeout",
                "60s",
                "--grace",
                "1s",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.push("--output-dir".into());
            let own = if layout.shared {
                "shared".to_string()
            } else {
                format!("w{index}")
            };
            args.push(dir.path().join(own).display().to_string());
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        };
        let spawn = |index: usize, args: Vec<String>| {
            let file = |ext: &str| {
                std::fs::File::create(dir.path().join(format!("w{index}.{ext}"))).unwrap()
            };
            nyann_bench()
                .args(args)
                .stdout(file("out"))
                .stderr(file("err"))
                .spawn()
                .unwrap()
        };
        let mut leader_args = common(0);
        leader_args.extend([
            "--config".into(),
            config.display().to_string(),
            "--coordinator-listen".into(),
            "127.0.0.1:0".into(),
            "--seed".into(),
            "1".into(),
        ]);
        leader_args.extend(lead.iter().cloned());
        let mut children = vec![spawn(0, leader_args)];
        let addr = wait_for(&dir.path().join("w0.err"), "coordinator listening on ").await;
        let coordinator = if layout.url {
            format!("http://{addr}")
        } else {
            addr
        };
        for index in 1..n {
            let mut args = common(index);
            args.extend(["--coordinator".into(), coordinator.clone()]);
            children.push(spawn(index, args));
        }
        Fleet {
            dir,
            children,
            layout,
        }
    }

    /// Worker `index`'s results directory (`--output-dir`).
    fn out(&self, index: usize) -> String {
        if self.layout.shared {
            "shared".into()
        } else {
            format!("w{index}")
        }
    }

    /// Worker `index`'s own records, as it wrote them.
    fn own_records(&self, index: usize) -> Vec<Value> {
        self.records(&format!(
            "{}/worker-{index}/requests.jsonl",
            self.out(index)
        ))
    }

    fn path(&self, rest: &str) -> PathBuf {
        self.dir.path().join(rest)
    }

    fn stderr(&self, index: usize) -> String {
        std::fs::read_to_string(self.path(&format!("w{index}.err"))).unwrap_or_default()
    }

    fn all_stderr(&self) -> String {
        (0..self.children.len())
            .map(|i| format!("--- worker {i}:\n{}", self.stderr(i)))
            .collect()
    }

    /// Each process's exit code, waiting at most `bound` for all of them.
    async fn wait(&mut self, bound: Duration) -> Vec<Option<i32>> {
        let mut codes = Vec::new();
        let deadline = tokio::time::Instant::now() + bound;
        for child in &mut self.children {
            let status = tokio::time::timeout_at(deadline, child.wait()).await;
            codes.push(match status {
                Ok(Ok(status)) => status.code(),
                _ => None,
            });
        }
        codes
    }

    fn pid(&self, index: usize) -> u32 {
        self.children[index].id().unwrap()
    }

    /// A JSON file under the temp dir.
    fn json(&self, rest: &str) -> Value {
        let text = std::fs::read_to_string(self.path(rest))
            .unwrap_or_else(|e| panic!("{rest}: {e}\n{}", self.all_stderr()));
        serde_json::from_str(&text).unwrap()
    }

    fn records(&self, rest: &str) -> Vec<Value> {
        std::fs::read_to_string(self.path(rest))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Waits (at most 60 s) for a line starting with `prefix` in `file`; returns the rest.
async fn wait_for(file: &Path, prefix: &str) -> String {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if let Some(line) = text.lines().find_map(|l| l.strip_prefix(prefix)) {
            return line.trim().to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no {prefix:?} in {}:\n{text}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most 60 s) for a line containing `needle` in `file`; returns it.
async fn wait_for_text(file: &Path, needle: &str) -> String {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            return line.to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no {needle:?} in {}:\n{text}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most 60 s) until `file` holds a record of step `stage`.
async fn wait_for_stage(file: &Path, stage: u64) {
    let started = Instant::now();
    let needle = format!("\"stage\":{stage},");
    while !std::fs::read_to_string(file)
        .unwrap_or_default()
        .contains(&needle)
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no record of step {stage} in {}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn kill(signal: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Requests counted in a stage's statistics (ok + failed + rejected + late + cancelled + dropped).
fn counted(stage: &Value) -> u64 {
    stage["detail"]["sent"].as_u64().unwrap() + stage["detail"]["dropped"].as_u64().unwrap()
}

/// Fixed-length stages of closed-loop load without a stop condition.
fn plain(stages: usize, seconds: u32, concurrency: u32) -> String {
    format!(
        "scenario(\n    workload = workload(\"synthetic\", isl=32, osl=16),\n    stages = [stage(\"{seconds}s\", concurrency={concurrency}) for _ in range({stages})],\n)\n"
    )
}

async fn fast_sim() -> RunningSim {
    nyann_sim::start(SimConfig::fast()).await.unwrap()
}

/// Three workers sweep 4, 8, 16, 32 streams in total; the simulator
/// congests at 16 as with one process, every worker stops there, and the
/// leader's statistics are the sum of everyone's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_stop_at_the_same_stage_with_fleet_statistics() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let mut fleet = Fleet::start(
        &sim.base_url(),
        &sweep(&[4, 8, 16, 32], STOPS_AT_16),
        3,
        &scrape_flags(&sim),
        &[],
    )
    .await;
    let codes = fleet.wait(Duration::from_secs(120)).await;
    assert_eq!(codes, [Some(0); 3], "{}", fleet.all_stderr());
    validate_against_schema(&fleet.path("w0"));

    let summary = fleet.json("w0/summary.json");
    assert_eq!(
        summary["outcome"]["kind"],
        "stopped",
        "{}",
        fleet.all_stderr()
    );
    assert_eq!(summary["outcome"]["stage"], 2);
    // Every label names the fleet's stage, never a worker's share of it.
    let reason = summary["outcome"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("stopped after stage #2 c=16: congested"),
        "{reason}"
    );
    for worker in 0..3 {
        let stderr = fleet.stderr(worker);
        assert!(stderr.contains("stage #2 c=16: started"), "{stderr}");
    }
    assert_eq!(
        fleet.json("w0.out"),
        summary,
        "the leader prints summary.json, fleet parts and all"
    );
    // The load the skipped stages did not send, by each of the 3 workers.
    let not_sent = &summary["conclusion"]["load_not_sent"];
    assert_eq!(
        not_sent["worker_seconds"].as_f64().unwrap(),
        3.0 * not_sent["seconds"].as_f64().unwrap(),
        "{not_sent}"
    );
    assert_eq!(summary["conclusion"]["sweeps"][0]["congested"]["stage"], 2);
    for worker in 1..3 {
        let theirs = fleet.json(&format!("w{worker}/worker-{worker}/summary.json"));
        assert_eq!(theirs["outcome"]["stage"], 2, "worker {worker}");
        assert_eq!(theirs["stages"][3]["status"], "skipped", "worker {worker}");
        assert_eq!(
            theirs["stages"][3]["skip_reason"],
            summary["stages"][3]["skip_reason"]
        );
        // Their share of 4 streams: 2, 1, 1.
        assert_eq!(theirs["stages"][0]["concurrency"], 1);
    }
    let stages = summary["stages"].as_array().unwrap();
    assert_eq!(
        stages[0]["concurrency"], 4,
        "the fleet's level, not a share"
    );
    assert_eq!(stages[0]["name"], Value::Null, "unnamed, as written");
    let records = fleet.records("w0/requests.jsonl");
    let mut per_worker = BTreeMap::new();
    for r in &records {
        *per_worker.entry(r["worker"].as_u64().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(per_worker.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(summary["requests_recorded"], records.len());
    for (index, stage) in stages.iter().enumerate().take(3) {
        assert_eq!(stage["status"], "measured");
        let in_records = records
            .iter()
            .filter(|r| r["stage"] == index && r["phase"] != "hold")
            .count() as u64;
        assert_eq!(counted(stage), in_records, "step {index}");
        // The per-worker figures add up to the fleet's.
        let workers = stage["annotation"]["fleet"]["workers"].as_array().unwrap();
        assert_eq!(workers.len(), 3);
        let sum: u64 = workers
            .iter()
            .map(|w| w["client"]["requests_ok"].as_u64().unwrap())
            .sum();
        assert_eq!(
            sum,
            stage["client"]["requests_ok"].as_u64().unwrap(),
            "step {index}"
        );
        // The policy judged the whole fleet's requests.
        let fleet_info = &stage["annotation"]["fleet"];
        assert_eq!(fleet_info["judged_workers"], serde_json::json!([0, 1, 2]));
        let client = &stage["client"];
        assert_eq!(
            fleet_info["requests_judged"].as_u64().unwrap(),
            client["requests_ok"].as_u64().unwrap() + client["requests_failed"].as_u64().unwrap(),
            "step {index}"
        );
    }
    assert!(stages[2]["annotation"]["congestion"]["verdict"]["congested"] == true);
    // Ids are disjoint across workers.
    let mut ids: Vec<u64> = records.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), records.len());
}

/// The policy is shown the whole fleet's statistics, read here from a real
/// Prometheus: a test policy that fails unless a stage finished exactly
/// `requests` requests passes with the fleet's 30 per stage (3 workers x
/// 10) and fails, naming both figures, when told to expect one worker's 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_is_shown_the_whole_fleets_requests() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    let prom = PrometheusServer::start(&[
        ScrapeJob::new("vllm-aggregate").target(sim.endpoint(), &[("pod", "sim-0")])
    ])
    .await
    .expect("Prometheus starts (apt-get install prometheus)");
    let policy = policy_wasm("request-count-policy");
    let lead: Vec<String> = [
        "--prometheus-url",
        &prom.url(),
        "--deploy-name",
        "sim",
        "--policy",
        &policy.display().to_string(),
        "--on-policy-error",
        "stop",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let scenario = |requests: u32| {
        format!(
            "scenario(\n    workload = workload(\"synthetic\", isl=32, osl=16),\n    stages = until_congested(\n        \
             [stage(\"60s\", concurrency=3, max_requests=30) for _ in range(2)],\n        requests={requests},\n        concurrency=3,\n    ),\n)\n"
        )
    };

    let mut fleet = Fleet::start(&sim.base_url(), &scenario(30), 3, &lead, &[]).await;
    let codes = fleet.wait(Duration::from_secs(120)).await;
    assert_eq!(codes, [Some(0); 3], "{}", fleet.all_stderr());
    let summary = fleet.json("w0/summary.json");
    assert_eq!(
        summary["outcome"]["kind"],
        "completed",
        "{}",
        fleet.all_stderr()
    );
    for (index, stage) in summary["stages"].as_array().unwrap().iter().enumerate() {
        let congestion = &stage["annotation"]["congestion"];
        assert_eq!(
            congestion["policy"]["name"], "request-count",
            "step {index}"
        );
        assert_eq!(
            congestion["policy_error"],
            Value::Null,
            "step {index}: {congestion}"
        );
        assert_eq!(congestion["verdict"]["congested"], false, "step {index}");
        assert_eq!(stage["client"]["requests_ok"], 30, "step {index}");
    }

    let mut fleet = Fleet::start(&sim.base_url(), &scenario(10), 3, &lead, &[]).await;
    let codes = fleet.wait(Duration::from_secs(120)).await;
    assert_eq!(
        codes[0],
        Some(1),
        "a failed policy call stops the sweep: {}",
        fleet.all_stderr()
    );
    let summary = fleet.json("w0/summary.json");
    assert_eq!(summary["outcome"]["stage"], 0, "{}", fleet.all_stderr());
    let error = summary["stages"][0]["annotation"]["congestion"]["policy_error"].to_string();
    assert!(error.contains("shown 30 requests, expected 10"), "{error}");
    for worker in 1..3 {
        let theirs = fleet.json(&format!("w{worker}/worker-{worker}/summary.json"));
        assert_eq!(theirs["stages"][1]["status"], "skipped", "worker {worker}");
    }
}

/// `kill -9` of worker 2 in step 1: the leader records the loss with that
/// step and finishes with the others; with `--on-worker-loss abort` it
/// exits 1 with its results written, and so does the surviving worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_recorded_as_lost_and_abort_mode_exits_1() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    for abort in [false, true] {
        let lead: Vec<String> = if abort {
            vec!["--on-worker-loss".into(), "abort".into()]
        } else {
            Vec::new()
        };
        let mut fleet = Fleet::start(&sim.base_url(), &plain(4, 2, 3), 3, &lead, &[]).await;
        wait_for_stage(&fleet.path("w2/worker-2/requests.jsonl"), 1).await;
        let killed = Instant::now();
        kill("-KILL", fleet.pid(2));
        let codes = fleet.wait(Duration::from_secs(60)).await;
        let stderr = fleet.all_stderr();
        let summary = fleet.json("w0/summary.json");
        let lost = fleet.json("w0/fleet.json")["lost"].clone();
        assert_eq!(lost[0]["worker"], 2, "{stderr}");
        assert_eq!(lost[0]["step"], 1, "{stderr}");
        assert!(fleet.path("w0/requests.jsonl").exists());
        assert!(fleet.path("w0/stages.json").exists());
        let stages = summary["stages"].as_array().unwrap();
        assert_eq!(
            stages[1]["annotation"]["fleet"]["lost"][0]["worker"], 2,
            "{stderr}"
        );
        if abort {
            assert_eq!(codes[..2], [Some(1), Some(1)], "{stderr}");
            assert_eq!(summary["outcome"]["kind"], "aborted");
            assert!(
                summary["outcome"]["reason"]
                    .as_str()
                    .unwrap()
                    .contains("worker 2 lost")
            );
            // The surviving worker says what happened: an abort, not an interrupt.
            let theirs = fleet.stderr(1);
            assert!(
                theirs.contains("the leader aborted the run: worker 2"),
                "{stderr}"
            );
            assert!(!theirs.contains("the leader was interrupted"), "{stderr}");
            // The abort came within the heartbeat timeout, not at the end of the sweep.
            assert!(
                killed.elapsed() < Duration::from_secs(5),
                "{:?}\n{stderr}",
                killed.elapsed()
            );
        } else {
            // The run did not send all its load: degraded (exit 3), and
            // every stage after the loss says the level that ran.
            assert_eq!(codes[..2], [Some(3), Some(0)], "{stderr}");
            assert_eq!(summary["outcome"]["kind"], "degraded", "{stderr}");
            assert_eq!(
                summary["outcome"]["missing_records"],
                serde_json::json!([2])
            );
            assert!(fleet.stderr(0).contains("run DEGRADED"), "{stderr}");
            let on_disk = fleet.json("w0/stages.json");
            for stages in [stages, on_disk["stages"].as_array().unwrap()] {
                // 3 streams, one per worker.
                assert_eq!(stages[0]["concurrency"], 3);
                assert_eq!(stages[0]["degraded"], Value::Null);
                let judged = stages[1]["annotation"]["fleet"]["judged_workers"].clone();
                // Killed during step 1 (or, on a slow machine, during its check).
                let whole = judged == serde_json::json!([0, 1, 2]);
                let degraded_from = if whole { 2 } else { 1 };
                for (index, stage) in stages.iter().enumerate().skip(degraded_from) {
                    assert_eq!(stage["concurrency"], 2, "step {index}: {stage}");
                    assert_eq!(stage["label"], format!("#{index} c=3"), "step {index}");
                    let degraded = &stage["degraded"];
                    assert_eq!(degraded["configured_concurrency"], 3, "step {index}");
                    assert_eq!(degraded["workers"], serde_json::json!([0, 1]));
                    assert!(
                        degraded["reason"]
                            .as_str()
                            .unwrap()
                            .contains("worker 2 was lost"),
                        "{degraded}"
                    );
                }
            }
            let last = stages[3]["annotation"]["fleet"]["workers"]
                .as_array()
                .unwrap();
            let workers: Vec<u64> = last.iter().map(|w| w["worker"].as_u64().unwrap()).collect();
            assert_eq!(
                workers,
                [0, 1],
                "the lost worker has no figures after its loss"
            );
            assert_eq!(
                fleet.json("w0/fleet.json")["missing_records"],
                serde_json::json!([2])
            );
            // The stage table shows the level that ran.
            assert!(
                fleet
                    .stderr(0)
                    .contains("degraded: ran at c=2 of the c=3 configured"),
                "{stderr}"
            );
        }
    }
}

/// `kill -9` of the leader: every worker stops within the heartbeat
/// timeout plus its grace, exits 1 and keeps its records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_of_a_killed_leader_exit_1_with_their_records() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    let mut fleet = Fleet::start(&sim.base_url(), &plain(3, 20, 3), 3, &[], &[]).await;
    wait_for_stage(&fleet.path("w2/worker-2/requests.jsonl"), 0).await;
    let killed = Instant::now();
    kill("-KILL", fleet.pid(0));
    let codes = fleet.wait(Duration::from_secs(30)).await;
    let stderr = fleet.all_stderr();
    assert_eq!(codes[1..], [Some(1), Some(1)], "{stderr}");
    // 1 s of silence, 1 s of grace, and the process's exit.
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "{:?}",
        killed.elapsed()
    );
    for worker in 1..3 {
        let summary = fleet.json(&format!("w{worker}/worker-{worker}/summary.json"));
        let records = fleet.records(&format!("w{worker}/worker-{worker}/requests.jsonl"));
        assert_eq!(summary["requests_recorded"], records.len());
        assert!(!records.is_empty());
        assert!(fleet.stderr(worker).contains("leader lost"), "{stderr}");
        assert!(
            fleet
                .stderr(worker)
                .contains(&format!("its {} records are kept in ", records.len())),
            "{stderr}"
        );
    }
}

/// A worker whose leader is lost before any stage started sent no load:
/// it says so, instead of "records kept".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_sent_nothing_does_not_claim_records() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scenario.star");
    std::fs::write(&config, plain(1, 1, 3)).unwrap();
    let (leader_err, worker_err) = (dir.path().join("w0.err"), dir.path().join("w1.err"));
    let common = |index: &str| {
        let mut command = nyann_bench();
        command
            .args(["generate", "--workers", "3", "--worker-index", index])
            .args(["--target", &sim.base_url(), "--heartbeat-timeout", "1s"])
            .arg("--output-dir")
            .arg(dir.path().join(format!("w{index}")));
        command
    };
    let mut leader = common("0")
        .args(["--coordinator-listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .stderr(std::fs::File::create(&leader_err).unwrap())
        .spawn()
        .unwrap();
    let addr = wait_for(&leader_err, "coordinator listening on ").await;
    // Worker 2 never comes: no stage starts.
    let mut worker = common("1")
        .args(["--coordinator", &addr, "--grace", "1s"])
        .stderr(std::fs::File::create(&worker_err).unwrap())
        .spawn()
        .unwrap();
    wait_for_text(&leader_err, "worker 1 joined").await;
    kill("-KILL", leader.id().unwrap());
    let _ = leader.wait().await;
    let status = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the worker ends")
        .unwrap();
    let text = std::fs::read_to_string(&worker_err).unwrap();
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.contains("leader lost")
            && text.contains("it sent no load, so there is no record to keep"),
        "{text}"
    );
    assert!(!text.contains("records are kept"), "{text}");
}

/// Ctrl-C to the leader: every process exits 130 and the leader's merged
/// records hold every worker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_on_the_leader_stops_every_worker_with_130() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    let mut fleet = Fleet::start(&sim.base_url(), &plain(3, 20, 3), 3, &[], &[]).await;
    wait_for_stage(&fleet.path("w2/worker-2/requests.jsonl"), 0).await;
    kill("-INT", fleet.pid(0));
    let codes = fleet.wait(Duration::from_secs(30)).await;
    let stderr = fleet.all_stderr();
    assert_eq!(codes, [Some(130); 3], "{stderr}");
    let records = fleet.records("w0/requests.jsonl");
    for worker in 1..3u64 {
        let own = fleet.records(&format!("w{worker}/worker-{worker}/requests.jsonl"));
        let merged = records.iter().filter(|r| r["worker"] == worker).count();
        assert_eq!(
            merged,
            own.len(),
            "worker {worker}: every record reached the leader"
        );
        assert!(!own.is_empty());
    }
    assert_eq!(
        fleet.json("w0/summary.json")["outcome"]["kind"],
        "interrupted"
    );
}

/// `kube render` prints a List whose ConfigMap carries the compiled
/// scenario and whose Job runs N indexed pods, or the same objects as YAML;
/// every object passes `kubernetes-validate --strict` (PyPI; offline
/// schemas: `.ci/run` installs it, and with `CI` set the test requires it)
/// in both forms. Flags after `--` that `generate` would refuse, or that
/// the rendered command sets itself, are refused at render time.
#[tokio::test]
async fn kube_render_carries_the_scenario_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sweep.star");
    std::fs::write(&config, sweep(&[4, 8, 16, 32], r#"kv_cache_usage=0.9"#)).unwrap();
    let render = |format: &'static str, rest: &'static [&'static str]| {
        let mut command = nyann_bench();
        command
            .args(["kube", "render", "--config"])
            .arg(&config)
            .args(["--workers", "4", "--image", "example.org/nyann-bench:1"])
            .args(["--namespace", "bench", "--cpu", "2", "--memory", "2Gi"])
            .args(["--results-claim", "results", "--format", format, "--"])
            .args(rest);
        command.output()
    };
    let flags: &[&str] = &[
        "--target",
        "http://vllm:8000/v1",
        "--on-worker-loss",
        "abort",
    ];
    let out = render("json", flags).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = list["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ConfigMap", "Service", "Job"]);
    let scenario_json = items[0]["data"]["scenario.json"].as_str().unwrap();
    assert!(
        !scenario_json.contains(&dir.path().display().to_string()),
        "no path of this machine in the ConfigMap: {scenario_json}"
    );
    let ir: Value = serde_json::from_str(scenario_json).unwrap();
    let levels: Vec<u64> = ir["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"]["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(levels, [4, 8, 16, 32]);
    let job = &items[2]["spec"];
    assert_eq!(job["completionMode"], "Indexed");
    assert_eq!(
        (job["completions"].as_u64(), job["parallelism"].as_u64()),
        (Some(4), Some(4))
    );
    // One worker's failure does not fail the whole Job (and kill the leader).
    assert_eq!(job["backoffLimitPerIndex"], 0);
    assert_eq!(job["backoffLimit"], Value::Null);
    let pod = &job["template"]["spec"];
    assert_eq!(pod["securityContext"]["fsGroup"], 65532);
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains(r#""--target","http://vllm:8000/v1""#),
        "{args}"
    );

    let yaml = render("yaml", flags).await.unwrap();
    assert!(yaml.status.success());
    let yaml_text = String::from_utf8(yaml.stdout).unwrap();
    assert_eq!(yaml_text.matches("\n---\n").count() + 1, 3, "{yaml_text}");

    // Flags `generate` refuses, or that the command sets, fail the render.
    for (rest, says) in [
        (&["--targt", "x"][..], "--targt"),
        (
            &["--output-dir", "/elsewhere"][..],
            "--output-dir is set by the rendered command",
        ),
        (
            &["--workers=2"][..],
            "--workers is set by the rendered command",
        ),
        (&["--request-timeout", "soon"][..], "--request-timeout"),
    ] {
        let refused = render("json", rest).await.unwrap();
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{rest:?}: {stderr}");
        assert!(refused.stdout.is_empty());
        assert!(stderr.contains(says), "{rest:?}: {stderr}");
    }

    // A stage too small for the workers is refused before anything is printed.
    let small = dir.path().join("small.star");
    std::fs::write(&small, "scenario(workload=workload(\"synthetic\", isl=32, osl=16), stages=[stage(\"1s\", concurrency=2)])\n").unwrap();
    let refused = nyann_bench()
        .args(["kube", "render", "--config"])
        .arg(&small)
        .args(["--workers", "3", "--image", "x"])
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(refused.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("concurrency 2 cannot be divided between 3 workers")
    );

    // One worker needs no Job: the library says why, the command line
    // names the flag and the command to use.
    let refused = nyann_bench()
        .args(["kube", "render", "--config"])
        .arg(&small)
        .args(["--workers", "1", "--image", "x"])
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("--workers 1: a scale-out run needs at least 2 workers, not 1")
            && stderr.contains("run `nyann-bench generate` instead"),
        "{stderr}"
    );

    kubernetes_validate(dir.path(), items, &yaml_text);
}

/// Every process with the same `--output-dir`, as `kube render
/// --results-claim` mounts one volume in every pod: no record is lost
/// (each worker's file stays whole, the merge holds exactly its lines),
/// the leader reads the workers' files in place (nothing is uploaded) and
/// writes no file a worker writes; with 2 and 3 workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_output_dir_loses_no_record() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    for n in [2, 3] {
        let layout = Layout {
            shared: true,
            ..Layout::default()
        };
        let mut fleet =
            Fleet::start_with(&sim.base_url(), &plain(2, 2, 6), n, &[], &[], layout).await;
        let codes = fleet.wait(Duration::from_secs(120)).await;
        let stderr = fleet.all_stderr();
        assert_eq!(codes, vec![Some(0); n], "{n} workers: {stderr}");
        let summary = fleet.json("shared/summary.json");
        assert_eq!(summary["outcome"]["kind"], "completed", "{stderr}");
        let merged = fleet.records("shared/requests.jsonl");
        assert_eq!(summary["requests_recorded"], merged.len());
        for worker in 0..n {
            let own = fleet.own_records(worker);
            let own_summary = fleet.json(&format!("shared/worker-{worker}/summary.json"));
            assert_eq!(
                own_summary["requests_recorded"],
                own.len(),
                "{n} workers: worker {worker}'s own file is whole"
            );
            assert!(own.len() > 100, "worker {worker}: {} records", own.len());
            let in_merge = merged.iter().filter(|r| r["worker"] == worker).count();
            assert_eq!(in_merge, own.len(), "{n} workers: worker {worker}");
            assert!(
                !fleet
                    .path(&format!("shared/worker-{worker}/requests.uploaded.jsonl"))
                    .exists(),
                "read in place, not uploaded"
            );
        }
        for worker in 1..n {
            assert!(
                fleet
                    .stderr(worker)
                    .contains("the results directory is the leader's too"),
                "{stderr}"
            );
        }
        let fleet_file = fleet.json("shared/fleet.json");
        assert_eq!(fleet_file["missing_records"], serde_json::json!([]));
        // The marker is gone once the run is over.
        let markers = std::fs::read_dir(fleet.path("shared"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".nyann-fleet-")
            })
            .count();
        assert_eq!(markers, 0);
    }
}

/// Records that cannot be stored on the leader (here its `worker-1` is a
/// file, not a directory) are tried again, then named as missing: in
/// `summary.json`, on stderr and in the exit code (3, degraded) of both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_keeps_failing_is_named_as_missing() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    let mut fleet = Fleet::start(&sim.base_url(), &plain(1, 2, 2), 2, &[], &[]).await;
    std::fs::create_dir_all(fleet.path("w0")).unwrap();
    std::fs::write(fleet.path("w0/worker-1"), "in the way").unwrap();
    let codes = fleet.wait(Duration::from_secs(120)).await;
    let stderr = fleet.all_stderr();
    assert_eq!(codes, [Some(3), Some(3)], "{stderr}");
    let summary = fleet.json("w0/summary.json");
    assert_eq!(summary["outcome"]["kind"], "degraded", "{stderr}");
    assert_eq!(
        summary["outcome"]["missing_records"],
        serde_json::json!([1])
    );
    let reasons = summary["outcome"]["reasons"].to_string();
    assert!(
        reasons.contains("the records of worker 1 are missing"),
        "{reasons}"
    );
    assert!(
        fleet
            .stderr(0)
            .contains("worker 1: its records are NOT in the results"),
        "{stderr}"
    );
    assert!(
        fleet.stderr(1).contains("records upload 1 of 3 failed"),
        "{stderr}"
    );
    let fleet_file = fleet.json("w0/fleet.json");
    assert_eq!(fleet_file["missing_records"], serde_json::json!([1]));
    // Its statistics still arrived with the attempt.
    let workers = summary["stages"][0]["annotation"]["fleet"]["workers"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(workers, 2);
    assert!(
        !fleet.own_records(1).is_empty(),
        "kept on the worker's disk"
    );
}

/// `--coordinator http://HOST:PORT`, the form every other URL flag takes,
/// works; a missing port or another scheme is refused at once (before any
/// wait), with exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_coordinator_works_and_a_missing_port_is_refused_at_once() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    let layout = Layout {
        url: true,
        ..Layout::default()
    };
    let mut fleet = Fleet::start_with(&sim.base_url(), &plain(1, 1, 2), 2, &[], &[], layout).await;
    let codes = fleet.wait(Duration::from_secs(60)).await;
    assert_eq!(codes, [Some(0), Some(0)], "{}", fleet.all_stderr());

    for (coordinator, says) in [
        ("bench-0.bench", "has no port"),
        ("http://bench-0.bench", "has no port"),
        ("https://bench-0.bench:7300", "plain TCP"),
    ] {
        let started = Instant::now();
        let out = nyann_bench()
            .args(["generate", "--workers", "2", "--worker-index", "1"])
            .args(["--coordinator", coordinator, "--join-timeout", "60s"])
            .args(["--output-dir", "/nonexistent/never-written"])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{coordinator}: {stderr}");
        assert!(stderr.contains(says), "{coordinator}: {stderr}");
        assert!(stderr.contains("--coordinator"), "{stderr}");
        // Refused when parsed, not after the join timeout.
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}

/// A worker whose coordinator's name does not resolve, or where nothing
/// listens, says so at the default log level while it waits (not only at
/// -v), and its final error names the last cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_says_why_it_cannot_reach_its_coordinator() {
    let _serial = serial().await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    for (coordinator, cause) in [
        (
            "nyann-no-such-host.invalid:7300".to_string(),
            "does not resolve",
        ),
        (closed.to_string(), "connection refused"),
    ] {
        let err = dir.path().join("worker.err");
        let mut child = nyann_bench()
            .args(["generate", "--workers", "2", "--worker-index", "1"])
            .args(["--coordinator", &coordinator, "--join-timeout", "60s"])
            .arg("--output-dir")
            .arg(dir.path().join("out"))
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let needle = format!("waiting for the leader at {coordinator}: ");
        let line = wait_for_text(&err, &needle).await;
        eprintln!("{coordinator}: said after {:?}", started.elapsed());
        assert!(line.contains(cause), "{coordinator}: {line}");
        kill("-KILL", child.id().unwrap());
        let _ = child.wait().await;
    }
    // The final error names the last cause.
    let out = nyann_bench()
        .args(["generate", "--workers", "2", "--worker-index", "1"])
        .args(["--coordinator", &closed.to_string(), "--join-timeout", "1s"])
        .arg("--output-dir")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot reach the coordinator {closed} within 1s; the last try: {closed}: connection refused"
        )),
        "{stderr}"
    );
}

/// An idle connection to the leader's port (a health check, a scanner)
/// delays nobody: here it would hold the join for the whole heartbeat
/// timeout (30 s), longer than the leader's join timeout (20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_does_not_delay_the_joins() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scenario.star");
    std::fs::write(&config, plain(1, 1, 2)).unwrap();
    let common = |index: usize| -> Vec<String> {
        [
            "generate",
            "--workers",
            "2",
            "--worker-index",
            &index.to_string(),
            "--target",
            &sim.base_url(),
            "--heartbeat-timeout",
            "30s",
            "--join-timeout",
            "20s",
            "--output-dir",
            &dir.path().join(format!("w{index}")).display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let err0 = dir.path().join("w0.err");
    let mut leader = nyann_bench()
        .args(common(0))
        .args(["--config", &config.display().to_string()])
        .args(["--coordinator-listen", "127.0.0.1:0"])
        .stderr(std::fs::File::create(&err0).unwrap())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = wait_for(&err0, "coordinator listening on ").await;
    let _idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let worker = nyann_bench()
        .args(common(1))
        .args(["--coordinator", &addr])
        .output();
    let worker = tokio::time::timeout(Duration::from_secs(90), worker)
        .await
        .expect("the worker ends")
        .unwrap();
    let code = tokio::time::timeout(Duration::from_secs(90), leader.wait())
        .await
        .expect("the leader ends")
        .unwrap()
        .code();
    let leader_err = std::fs::read_to_string(&err0).unwrap();
    assert_eq!(
        (code, worker.status.code()),
        (Some(0), Some(0)),
        "{leader_err}\n{}",
        String::from_utf8_lossy(&worker.stderr)
    );
}

/// A worker stopped by its own Ctrl-C (a pod eviction sends SIGTERM) says
/// it leaves: the leader records it as left in that step, goes on at the
/// level the others run (degraded), and still gets its records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_by_ctrl_c_is_recorded_as_left() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    let mut fleet = Fleet::start(&sim.base_url(), &plain(3, 3, 3), 3, &[], &[]).await;
    wait_for_stage(&fleet.path("w2/worker-2/requests.jsonl"), 1).await;
    kill("-INT", fleet.pid(2));
    let codes = fleet.wait(Duration::from_secs(60)).await;
    let stderr = fleet.all_stderr();
    assert_eq!(codes, [Some(3), Some(0), Some(130)], "{stderr}");
    let fleet_file = fleet.json("w0/fleet.json");
    assert_eq!(fleet_file["lost"], serde_json::json!([]), "{stderr}");
    let left = &fleet_file["left"][0];
    assert_eq!(left["worker"], 2, "{stderr}");
    assert_eq!(left["step"], 1, "{stderr}");
    assert!(
        fleet.stderr(0).contains("worker 2 left in step 1"),
        "{stderr}"
    );
    assert_eq!(fleet_file["missing_records"], serde_json::json!([]));
    let merged = fleet.records("w0/requests.jsonl");
    let from_2 = merged.iter().filter(|r| r["worker"] == 2).count();
    assert_eq!(from_2, fleet.own_records(2).len(), "its records arrived");
    let summary = fleet.json("w0/summary.json");
    assert_eq!(summary["outcome"]["kind"], "degraded");
    assert_eq!(summary["stages"][2]["concurrency"], 2);
    assert_eq!(
        summary["stages"][1]["annotation"]["fleet"]["left"][0]["worker"],
        2
    );
}

/// `--workers 0` is refused (it used to run as one process).
#[tokio::test]
async fn zero_workers_are_refused() {
    let out = nyann_bench()
        .args([
            "generate",
            "--workers",
            "0",
            "--target",
            "http://127.0.0.1:9/v1",
        ])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("0 workers cannot run anything"), "{stderr}");
}

/// A capacity search in a fleet of 3 against the server of 22 slots
/// (`nyann_testkit::queue`, congested from 23 streams up): the leader
/// bisects the fleet's levels and every worker runs its share, so the
/// fleet finds what one process finds (tried 20, 26, 23, 21, 22; capacity
/// 22, congested 23), and `summary.json` holds the fleet's levels, each
/// search stage run and judged by all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_searches_the_capacity_in_the_fleets_levels() {
    use nyann_testkit::queue::{Queue, QueueServer};
    let _serial = serial().await;
    let server = QueueServer::start(Queue {
        slots: 22,
        service: Duration::from_millis(500),
        serves_abandoned: false,
    })
    .await;
    let scenario = "scenario(\n    workload = workload(\"faker\", isl=16, osl=1),\n    \
                    stages = until_congested([stage(\"2s\", concurrency=c) for c in [8, 32, 128]],\n        \
                    waiting_requests_p50=1, ttft_p99=\"5ms\", refine=5),\n)\n";
    let lead = [
        "--scrape".to_string(),
        format!("aggregate={}", server.metrics_url()),
        "--scrape-interval".into(),
        "200ms".into(),
    ];
    let mut fleet = Fleet::start(&server.base_url(), scenario, 3, &lead, &[]).await;
    let codes = fleet.wait(Duration::from_secs(120)).await;
    assert_eq!(codes, [Some(0); 3], "{}", fleet.all_stderr());
    validate_against_schema(&fleet.path("w0"));

    let summary = fleet.json("w0/summary.json");
    let stages = summary["stages"].as_array().unwrap();
    let search: Vec<&Value> = stages.iter().filter(|s| s["search"].is_object()).collect();
    let levels: Vec<u64> = search
        .iter()
        .map(|s| s["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(levels, [20, 26, 23, 21, 22], "{}", fleet.all_stderr());
    let capacity = &summary["conclusion"]["sweeps"][0]["capacity"];
    assert_eq!(capacity["clean"]["concurrency"], 22, "{capacity}");
    assert_eq!(capacity["congested"]["concurrency"], 23, "{capacity}");
    assert!(
        fleet
            .stderr(0)
            .contains(" not congested, concurrency=23 congested (5 search stages, "),
        "{}",
        fleet.stderr(0)
    );
    // The leader's log says the fleet's levels, never its own share's
    // (7 of 22).
    assert!(
        fleet.stderr(0).contains(
            "capacity search: the fleet's highest level not congested 22, lowest congested 23"
        ),
        "{}",
        fleet.stderr(0)
    );
    assert!(!fleet.stderr(0).contains("highest level not congested 7"));
    let records = fleet.records("w0/requests.jsonl");
    for stage in &search {
        let index = stage["index"].as_u64().unwrap();
        assert_eq!(
            stage["annotation"]["fleet"]["judged_workers"],
            serde_json::json!([0, 1, 2]),
            "{stage}"
        );
        // Every worker's requests are in the fleet's statistics.
        let mut workers: Vec<u64> = records
            .iter()
            .filter(|r| r["stage"] == index && r["phase"] != "hold")
            .map(|r| r["worker"].as_u64().unwrap())
            .collect();
        let in_records = workers.len() as u64;
        workers.sort_unstable();
        workers.dedup();
        assert_eq!(workers, [0, 1, 2], "stage {index}");
        assert_eq!(counted(stage), in_records, "stage {index}");
    }
    // Each worker ran its share of every level (by position, like the
    // steps), labelled with the fleet's stage.
    for (worker, expected) in [(1, [7, 9, 8, 7, 7]), (2, [6, 8, 7, 7, 7])] {
        let theirs = fleet.json(&format!("w{worker}/worker-{worker}/summary.json"));
        let search: Vec<&Value> = theirs["stages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["search"].is_object())
            .collect();
        let shares: Vec<u64> = search
            .iter()
            .map(|s| s["concurrency"].as_u64().unwrap())
            .collect();
        assert_eq!(shares, expected, "worker {worker}");
        assert_eq!(search[4]["name"], "#7 c=22", "worker {worker}");
    }
}

/// The policy judges the level that ran: after worker 2 leaves in a plain
/// stage, the judged stage (3 streams, at most 20 requests, configured)
/// ran 2 streams and 7 + 7 requests, and a policy that fails unless it is
/// shown exactly that passes (with `--on-policy-error stop`, a mismatch
/// would exit 1 naming both figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_judges_the_level_that_ran() {
    let _serial = serial().await;
    let sim = fast_sim().await;
    let policy = policy_wasm("request-count-policy");
    let mut lead = scrape_flags(&sim);
    lead.extend(
        [
            "--policy",
            &policy.display().to_string(),
            "--on-policy-error",
            "stop",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let scenario = "scenario(\n    workload = workload(\"synthetic\", isl=32, osl=16),\n    stages = [stage(\"4s\", concurrency=3)] + until_congested(\n        \
         [stage(\"60s\", concurrency=3, max_requests=20)],\n        requests=14,\n        concurrency=2,\n    ),\n)\n";
    let mut fleet = Fleet::start(&sim.base_url(), scenario, 3, &lead, &[]).await;
    wait_for_stage(&fleet.path("w2/worker-2/requests.jsonl"), 0).await;
    kill("-INT", fleet.pid(2));
    let codes = fleet.wait(Duration::from_secs(120)).await;
    let stderr = fleet.all_stderr();
    assert_eq!(codes, [Some(3), Some(0), Some(130)], "{stderr}");
    let summary = fleet.json("w0/summary.json");
    let judged = &summary["stages"][1];
    let congestion = &judged["annotation"]["congestion"];
    assert_eq!(
        congestion["policy_error"],
        Value::Null,
        "{congestion}\n{stderr}"
    );
    assert_eq!(congestion["verdict"]["congested"], false);
    assert_eq!(judged["concurrency"], 2);
    assert_eq!(judged["degraded"]["configured_concurrency"], 3);
    assert_eq!(judged["client"]["requests_ok"], 14);
}

/// Two workers share a GSM8K stage of 101 questions: the dataset is
/// shuffled once with the leader's seed and cut in two contiguous chunks
/// (51 and 50), so each question is asked exactly once in the fleet, and
/// the merged accuracy is the sum of the workers' counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_asks_each_eval_question_once_and_merges_the_accuracy() {
    let _serial = serial().await;
    let data = tempfile::tempdir().unwrap();
    let path = data.path().join("test.jsonl");
    nyann_testkit::datasets::write_gsm8k(&path, 101);
    let sim = nyann_sim::start(SimConfig {
        eval_gsm8k: Some(path.clone()),
        eval_accuracy: 0.6,
        ..SimConfig::fast()
    })
    .await
    .unwrap();
    let scenario = format!(
        "scenario(stages = [stage(\"60s\", concurrency=4, workload=workload(\"gsm8k\", path={:?}, osl=6))])\n",
        path.display().to_string()
    );
    let mut fleet = Fleet::start(&sim.base_url(), &scenario, 2, &[], &[]).await;
    let codes = fleet.wait(Duration::from_secs(120)).await;
    assert_eq!(codes, [Some(0); 2], "{}", fleet.all_stderr());
    validate_against_schema(&fleet.path("w0"));

    let records = fleet.records("w0/requests.jsonl");
    let measured: Vec<&Value> = records
        .iter()
        .filter(|r| r["phase"] == "measured")
        .collect();
    let mut asked: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for r in &measured {
        asked
            .entry(r["eval_expected"].as_str().unwrap())
            .or_default()
            .push(r["worker"].as_u64().unwrap());
    }
    assert_eq!(asked.len(), 101, "every question asked");
    assert!(
        asked.values().all(|workers| workers.len() == 1),
        "each once: {asked:?}"
    );
    let per_worker = |w: u64| asked.values().filter(|ws| ws[0] == w).count();
    assert_eq!((per_worker(0), per_worker(1)), (51, 50));

    let stage = &fleet.json("w0/stages.json")["stages"][0];
    let eval = &stage["client"]["eval"];
    let correct = measured
        .iter()
        .filter(|r| r["eval_correct"] == true)
        .count();
    assert_eq!(eval["answered"], 101, "{eval}");
    assert_eq!(eval["correct"], correct, "{eval}");
    let theirs: u64 = stage["annotation"]["fleet"]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["client"]["eval"]["correct"].as_u64().unwrap())
        .sum();
    assert_eq!(theirs, correct as u64, "the workers' counts add up");
    let (low, high) = (
        eval["accuracy_low"].as_f64().unwrap(),
        eval["accuracy_high"].as_f64().unwrap(),
    );
    assert!(low < 0.6 && 0.6 < high, "{eval}");
}

/// A ShareGPT file of 21 conversations replayed by 2 workers, one stream
/// each, 21 requests in all (11 + 10): the file is shuffled once with the
/// leader's seed and each worker replays a contiguous chunk of it, so each
/// conversation is sent once, by one worker, with its recorded lengths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_replays_each_sharegpt_conversation_once() {
    use nyann_testkit::datasets::{Spelling, sharegpt_chats, write_sharegpt_jsonl};
    let _serial = serial().await;
    let data = tempfile::tempdir().unwrap();
    let path = data.path().join("sharegpt.jsonl");
    let chats = sharegpt_chats(21, 1);
    write_sharegpt_jsonl(&path, &chats, Spelling::ShareGpt);
    let sim = nyann_sim::start(SimConfig::fast()).await.unwrap();
    let scenario = format!(
        "scenario(stages = [stage(\"60s\", concurrency=2, max_requests=21, workload=workload(\"sharegpt\", path={:?}))])\n",
        path.display().to_string()
    );
    let mut fleet = Fleet::start(&sim.base_url(), &scenario, 2, &[], &[]).await;
    let codes = fleet.wait(Duration::from_secs(120)).await;
    assert_eq!(codes, [Some(0); 2], "{}", fleet.all_stderr());
    validate_against_schema(&fleet.path("w0"));

    let records = fleet.records("w0/requests.jsonl");
    let mut sent_by: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for r in records.iter().filter(|r| r["phase"] == "measured") {
        let chars = r["prompt_chars"].as_u64().unwrap() as usize;
        let chat = chats
            .iter()
            .position(|c| c.turns[0].prompt.len() == chars)
            .unwrap_or_else(|| panic!("not a prompt of the file: {r}"));
        assert_eq!(r["output_tokens"], chats[chat].turns[0].reply_tokens, "{r}");
        sent_by
            .entry(chat)
            .or_default()
            .push(r["worker"].as_u64().unwrap());
    }
    assert_eq!(sent_by.len(), 21, "every conversation sent: {sent_by:?}");
    assert!(
        sent_by.values().all(|workers| workers.len() == 1),
        "each once: {sent_by:?}"
    );
    let per_worker = |w: u64| sent_by.values().filter(|ws| ws[0] == w).count();
    assert_eq!((per_worker(0), per_worker(1)), (11, 10));
}

/// A leader whose workers do not all come says which ones it waits for,
/// and for how long, every few seconds: not only at the join timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_names_the_workers_it_still_waits_for() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scenario.star");
    std::fs::write(&config, plain(1, 1, 3)).unwrap();
    let err = dir.path().join("w0.err");
    let mut leader = nyann_bench()
        .args(["generate", "--workers", "3", "--worker-index", "0"])
        .args(["--target", "http://127.0.0.1:9/v1", "--join-timeout", "5m"])
        .args(["--coordinator-listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.path().join("out"))
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let line = wait_for_text(&err, "waiting for workers ").await;
    // "(5s of ...": the notice's first tick, late by a second on a busy
    // machine at worst.
    assert!(
        line.contains("waiting for workers 1, 2 to join (")
            && line.contains("s of the join timeout 5m)"),
        "{line}"
    );
    kill("-KILL", leader.id().unwrap());
    let _ = leader.wait().await;
}

/// The same command for every process (as a Kubernetes Job runs it):
/// a leader told `--coordinator HOST:P` listens on port P; one told to
/// listen on another port is refused, since its workers would wait for
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_refuses_to_listen_where_its_workers_do_not_look() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scenario.star");
    std::fs::write(&config, plain(1, 1, 2)).unwrap();
    let out = nyann_bench()
        .args(["generate", "--workers", "2", "--worker-index", "0"])
        .args(["--target", "http://127.0.0.1:9/v1"])
        .args(["--coordinator", "127.0.0.1:17300"])
        .args(["--coordinator-listen", "127.0.0.1:17301"])
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.path().join("out"))
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "--coordinator-listen 127.0.0.1:17301 and --coordinator 127.0.0.1:17300: the workers \
             look for the leader on port 17300, but it would listen on port 17301"
        ),
        "{stderr}"
    );
}

/// A worker waiting to join ends on SIGINT with 130, even when started
/// with SIGINT ignored (a script's `cmd &` leaves it so), and on SIGTERM
/// alike: it says so instead of waiting out its join timeout or dying
/// without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waiting_to_join_ends_on_sigint_and_sigterm() {
    let _serial = serial().await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    for signal in ["-INT", "-TERM"] {
        let err = dir.path().join(format!("worker{signal}.err"));
        // SIGINT ignored, as `sh -c 'cmd &'` leaves it for its children.
        let mut worker = tokio::process::Command::new("sh")
            .arg("-c")
            .arg("trap '' INT; exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_nyann-bench"))
            .args(["generate", "--workers", "2", "--worker-index", "1"])
            .args(["--coordinator", &closed.to_string(), "--join-timeout", "5m"])
            .arg("--output-dir")
            .arg(dir.path().join(format!("out{signal}")))
            .stderr(std::fs::File::create(&err).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        wait_for_text(&err, "waiting for the leader at ").await;
        kill(signal, worker.id().unwrap());
        let status = tokio::time::timeout(Duration::from_secs(20), worker.wait())
            .await
            .unwrap_or_else(|_| panic!("{signal}: the worker did not end"))
            .unwrap();
        let text = std::fs::read_to_string(&err).unwrap();
        assert_eq!(status.code(), Some(130), "{signal}: {text}");
        assert!(
            text.contains("worker 1: interrupted while waiting to join the leader"),
            "{signal}: {text}"
        );
    }
}
