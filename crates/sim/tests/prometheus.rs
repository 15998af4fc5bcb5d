//! A real Prometheus (Debian's `prometheus` package) scrapes an aggregate
//! simulator and a disaggregated one (two jobs) every second on 127.0.0.1:
//! every target is up with no scrape error, and the query API returns the
//! vLLM series. The Prometheus process is started with a temporary config
//! and data directory and killed by PID at the end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nyann_sim::{SimConfig, start};
use serde_json::{Value, json};

/// A Prometheus child process, killed (by PID) on drop, and then its
/// directory removed (a field, dropped after `drop` ran).
struct Prometheus {
    child: Child,
    dir: tempfile::TempDir,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    // Prometheus needs a concrete port; take one the kernel considers free right now.
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_prometheus(jobs: &[(&str, SocketAddr)]) -> Prometheus {
    let bin = which("prometheus").unwrap_or_else(|| {
        panic!(
            "this test needs a real Prometheus and `prometheus` is not on PATH: install it with \
             `apt-get update && apt-get install -y prometheus` (.ci/run does this)"
        )
    });
    let dir = tempfile::Builder::new()
        .prefix("nyann-sim-prom-")
        .tempdir()
        .unwrap();
    let mut config =
        String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n");
    for (job, addr) in jobs {
        config.push_str(&format!(
            "  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
        ));
    }
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let child = Command::new(bin)
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting prometheus");
    Prometheus {
        child,
        dir,
        url: format!("http://127.0.0.1:{port}"),
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}

async fn api(p: &Prometheus, path: &str, query: &[(&str, &str)]) -> Option<Value> {
    let r = nyann_testkit::http_client()
        .build()
        .unwrap()
        .get(format!("{}{path}", p.url))
        .query(query)
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_aggregate_and_disaggregated() {
    let agg = start(SimConfig::default()).await.unwrap();
    let dis = start(SimConfig {
        disaggregated: true,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let m = dis.metrics_endpoints();
    let prom = start_prometheus(&[
        ("vllm-aggregate", agg.endpoint()),
        ("vllm-prefill", m[0].1),
        ("vllm-decode", m[1].1),
    ]);

    // Some traffic so that counters and histograms move.
    let client = nyann_testkit::http_client().build().unwrap();
    for sim in [&agg, &dis] {
        for _ in 0..3 {
            let r = client
                .post(format!("{}/completions", sim.base_url()))
                .json(&json!({"prompt": "abcdefgh", "max_tokens": 20}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    }

    // Wait (bounded) until every target has been scraped successfully at least twice.
    let deadline = Instant::now() + Duration::from_secs(60);
    let targets = loop {
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape all targets within 60 s; log: {}",
            std::fs::read_to_string(prom.dir.path().join("prometheus.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(t) = api(&prom, "/api/v1/targets", &[]).await else {
            continue;
        };
        let active = t["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let scraped = api(
            &prom,
            "/api/v1/query",
            &[("query", "count_over_time(up[1m])")],
        )
        .await;
        let all_twice = scraped.as_ref().is_some_and(|s| {
            let r = s["data"]["result"].as_array().cloned().unwrap_or_default();
            r.len() == 3
                && r.iter().all(|x| {
                    x["value"][1]
                        .as_str()
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0)
                        >= 2.0
                })
        });
        if active.len() == 3 && active.iter().all(|a| a["health"] == "up") && all_twice {
            break active;
        }
    };
    for t in &targets {
        assert_eq!(t["lastError"], "", "scrape error on {}", t["scrapeUrl"]);
    }

    let query = |q: &'static str| {
        let prom = &prom;
        async move {
            let v = api(prom, "/api/v1/query", &[("query", q)]).await.unwrap();
            assert_eq!(v["status"], "success", "{q}: {v}");
            v["data"]["result"].as_array().cloned().unwrap()
        }
    };
    let up = query("up").await;
    assert_eq!(up.len(), 3);
    assert!(up.iter().all(|s| s["value"][1] == "1"), "{up:?}");

    let waiting = query("vllm:num_requests_waiting").await;
    let jobs: Vec<&str> = waiting
        .iter()
        .map(|s| s["metric"]["job"].as_str().unwrap())
        .collect();
    for job in ["vllm-aggregate", "vllm-prefill", "vllm-decode"] {
        assert!(
            jobs.contains(&job),
            "no vllm:num_requests_waiting for {job}: {jobs:?}"
        );
    }
    assert!(
        waiting
            .iter()
            .all(|s| s["metric"]["model_name"] == "nyann-sim" && s["metric"]["engine"] == "0")
    );
    for q in [
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:request_queue_time_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:inter_token_latency_seconds_count",
    ] {
        assert_eq!(query(q).await.len(), 3, "{q}");
    }
    assert_eq!(
        query("vllm:request_success_total").await.len(),
        15,
        "5 finished_reason values x 3 targets"
    );
    let gen_total = query("vllm:generation_tokens_total{job=\"vllm-aggregate\"}").await;
    assert_eq!(gen_total[0]["value"][1], "60");
    let ttft = query(
        "histogram_quantile(0.99, sum by (le, job) (vllm:time_to_first_token_seconds_bucket))",
    )
    .await;
    assert_eq!(ttft.len(), 3);
    for s in &ttft {
        let v: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
        assert!(
            v > 0.0 && v < 2560.0,
            "ttft p99 {v} for {}",
            s["metric"]["job"]
        );
    }
    for q in [
        "sum(prometheus_target_scrapes_sample_out_of_order_total) or vector(0)",
        "sum(prometheus_target_scrapes_sample_duplicate_timestamp_total) or vector(0)",
        "sum(prometheus_target_scrapes_sample_out_of_bounds_total) or vector(0)",
    ] {
        let r = query(q).await;
        assert_eq!(r[0]["value"][1], "0", "{q}");
    }

    drop(prom);
    agg.shutdown().await;
    dis.shutdown().await;
}
