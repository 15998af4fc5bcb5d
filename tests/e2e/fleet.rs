//! Scale-out: a leader and workers, each a real `nyann-bench
//! generate --workers N` process on 127.0.0.1 standing in for a pod, against
//! the simulator. The sweep stops at the same stage everywhere, fleet counts
//! are the sum of the records, and every fault (a worker or the leader
//! killed, Ctrl-C) ends every process within its bounds with records kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nyann_sim::{RunningSim, SimArgs};
use nyann_testkit::{PrometheusServer, ScrapeJob};
use serde_json::Value;
use tempfile::TempDir;

use crate::support::{nyann_bench, policy_wasm, scrape_flags, serial, simulator, sweep};
use crate::sweep::STOPS_AT_16;

/// A fleet's processes: index 0 leads.
struct Fleet {
    dir: TempDir,
    children: Vec<tokio::process::Child>,
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
            args.push(dir.path().join(format!("w{index}")).display().to_string());
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
        for index in 1..n {
            let mut args = common(index);
            args.extend(["--coordinator".into(), addr.clone()]);
            children.push(spawn(index, args));
        }
        Fleet { dir, children }
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
    nyann_sim::start(SimArgs::fast_for_tests()).await.unwrap()
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
            // The abort came within the heartbeat timeout, not at the end of the sweep.
            assert!(
                killed.elapsed() < Duration::from_secs(5),
                "{:?}\n{stderr}",
                killed.elapsed()
            );
        } else {
            assert_eq!(codes[..2], [Some(0), Some(0)], "{stderr}");
            assert_eq!(summary["outcome"]["kind"], "completed");
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
    }
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
/// scenario and whose Job runs N indexed pods; when `kubernetes-validate`
/// (PyPI; offline schemas) is installed, on PATH or named by
/// $KUBERNETES_VALIDATE, every object passes its strict validation.
#[tokio::test]
async fn kube_render_carries_the_scenario_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sweep.star");
    std::fs::write(&config, sweep(&[4, 8, 16, 32], r#"kv_cache_usage=0.9"#)).unwrap();
    let out = nyann_bench()
        .args(["kube", "render", "--config"])
        .arg(&config)
        .args([
            "--workers",
            "4",
            "--image",
            "example.org/nyann-bench:1",
            "--namespace",
            "bench",
        ])
        .args([
            "--cpu",
            "2",
            "--memory",
            "2Gi",
            "--",
            "--target",
            "http://vllm:8000/v1",
        ])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = list["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ConfigMap", "Service", "Job"]);
    let ir: Value =
        serde_json::from_str(items[0]["data"]["scenario.json"].as_str().unwrap()).unwrap();
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
    let args = job["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains(r#""--target","http://vllm:8000/v1""#),
        "{args}"
    );

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

    let validator =
        std::env::var("KUBERNETES_VALIDATE").unwrap_or_else(|_| "kubernetes-validate".into());
    let mut files = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let file = dir.path().join(format!("item{i}.json"));
        std::fs::write(&file, item.to_string()).unwrap();
        files.push(file);
    }
    match std::process::Command::new(&validator)
        .arg("--strict")
        .args(&files)
        .output()
    {
        Ok(checked) => assert!(
            checked.status.success(),
            "{validator}: {}{}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        ),
        Err(_) => eprintln!(
            "{validator} is not installed: the manifests were not validated against the Kubernetes schemas (pip install kubernetes-validate)"
        ),
    }
}
