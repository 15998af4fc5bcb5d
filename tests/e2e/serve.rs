//! `nyann-bench serve`: the real binary as a service, its runs as child
//! processes against the in-process simulator. The queue (one run at a
//! time per target), cancel, a restart after kill -9, the tokens, and the
//! refusals of bad input (a runaway scenario, too many stages, a huge body).
//! MCP on `/mcp`, with an independent client, in [`mcp`].

mod kube;
mod mcp;
mod oci;

use std::path::{Path, PathBuf};
use std::time::Duration;

use nyann_sim::RunningSim;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::browser::Browser;
use crate::support::{nyann_bench, serial, simulator};

const SUBMIT: &str = "token-submit";
const READ: &str = "token-read";
const ADMIN: &str = "token-admin";

/// The service on an ephemeral loopback port, over a data directory that
/// outlives it (a restart reopens it).
struct Serve {
    child: tokio::process::Child,
    url: String,
}

/// The files a service is started with, and its data directory.
struct Setup {
    dir: TempDir,
}

impl Setup {
    /// Target `sim` (the simulator, its metrics scraped), target `wide`
    /// (the same, with room for a sweep to c=32), target `blind` (no signal
    /// source), targets `dark` (metrics at a closed port) and `mute` (a
    /// page with no metrics); tokens of each scope.
    fn new(sim: &RunningSim) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let scrape: Vec<String> = sim
            .metrics_endpoints()
            .into_iter()
            .map(|(role, addr)| format!("\"{role}=http://{addr}/metrics\""))
            .collect();
        let targets = format!(
            "[targets.sim]\nurl = \"{url}\"\nsignals = {{ scrape = [{scrape}] }}\n\
             bounds = {{ max_concurrency = 8, max_stages = 16, max_total_duration_s = 120 }}\n\
             [targets.wide]\nurl = \"{url}\"\nsignals = {{ scrape = [{scrape}] }}\n\
             bounds = {{ max_concurrency = 32, max_stages = 16, max_total_duration_s = 120 }}\n\
             [targets.blind]\nurl = \"{url}\"\n\
             [targets.dark]\nurl = \"{url}\"\nsignals = {{ scrape = [\"http://{closed}/metrics\"] }}\n\
             [targets.mute]\nurl = \"{url}\"\nsignals = {{ scrape = [\"{url}/models\"] }}\n",
            url = sim.base_url(),
            scrape = scrape.join(", ")
        );
        std::fs::write(dir.path().join("targets.toml"), targets).unwrap();
        let tokens: String = [
            ("ci", SUBMIT, "submit"),
            ("viewer", READ, "read"),
            ("ops", ADMIN, "admin"),
        ]
        .iter()
        .map(|(name, token, scope)| {
            format!(
                "[[tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscope = \"{scope}\"\n",
                nyann_service::auth::hash_token(token)
            )
        })
        .collect();
        std::fs::write(dir.path().join("tokens.toml"), tokens).unwrap();
        Setup { dir }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    async fn start(&self) -> Serve {
        self.start_with(&[], &[]).await
    }

    /// `serve` on an ephemeral loopback port with this setup's files and
    /// `args`.
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = nyann_bench();
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(self.data())
            .arg("--targets")
            .arg(self.dir.path().join("targets.toml"))
            .arg("--tokens")
            .arg(self.dir.path().join("tokens.toml"))
            .args(args);
        command
    }

    /// A start with `args` that must fail (exit 1): its stderr.
    async fn refused_start(&self, args: &[&str]) -> String {
        let out = self.command(args).output().await.unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// [`Setup::start`] with more flags and environment.
    async fn start_with(&self, args: &[&str], env: &[(&str, &Path)]) -> Serve {
        let mut child = self
            .command(args)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the service says where it listens within a minute")
            .unwrap()
            .expect("the service printed its address");
        let url = line.strip_prefix("listening on ").unwrap().to_string();
        assert!(
            url.starts_with("http://127.0.0.1:") || url.starts_with("https://127.0.0.1:"),
            "{url}"
        );
        Serve { child, url }
    }
}

/// An answer: its status, headers and JSON body (or text as a string).
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Serve {
    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let client = nyann_testkit::http_client().build().unwrap();
        let url = format!("{}{path}", self.url);
        let mut request = match method {
            "GET" => client.get(&url),
            _ => client.post(&url),
        };
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn submit(&self, scenario: &str, label: &str) -> Value {
        let request = json!({"target": "sim", "scenario": scenario, "label": label});
        let answer = self
            .call("POST", "/api/v1/runs", Some(SUBMIT), Some(request))
            .await;
        assert_eq!(answer.status, 201, "{}", answer.body);
        answer.body
    }

    async fn run(&self, id: &str) -> Value {
        let answer = self
            .call("GET", &format!("/api/v1/runs/{id}"), Some(READ), None)
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        answer.body
    }

    /// Polls run `id` until `done` holds of it (at most `within`).
    async fn wait_for(&self, id: &str, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let run = self.run(id).await;
            if done(&run) {
                return run;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "run {id} did not get there within {within:?}: {run}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn artifact(&self, id: &str, name: &str) -> Answer {
        self.call(
            "GET",
            &format!("/api/v1/runs/{id}/artifacts/{name}"),
            Some(READ),
            None,
        )
        .await
    }
}

fn is_final(run: &Value) -> bool {
    !matches!(run["status"].as_str(), Some("queued" | "running"))
}

/// Stages at concurrency 2, each `seconds` long.
fn stages(seconds: u32, count: usize) -> String {
    let stages = vec![format!("stage(\"{seconds}s\", concurrency=2)"); count].join(", ");
    format!("scenario(workload=workload(\"faker\", isl=64, osl=32), stages=[{stages}])\n")
}

/// Waits (at most `within`) until the simulator has seen `count` requests:
/// a run under way.
async fn sends(sim: &RunningSim, count: usize, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while sim.requests().len() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run sends nothing: {} requests of {count}",
            sim.requests().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn lines(text: &Value) -> usize {
    text.as_str().unwrap_or("").lines().count()
}

#[tokio::test]
async fn runs_on_one_target_queue_and_a_cancel_keeps_the_records() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let serve = setup.start().await;

    let a = serve.submit(&stages(2, 2), "a").await;
    let b = serve.submit(&stages(2, 2), "b").await;
    let (a, b) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
    assert_ne!(a, b);
    // The same request is the same run (submit is idempotent).
    let again = json!({"target": "sim", "scenario": stages(2, 2), "label": "a"});
    let answer = serve
        .call("POST", "/api/v1/runs", Some(SUBMIT), Some(again))
        .await;
    assert_eq!((answer.status, answer.body["id"].as_str()), (200, Some(a)));
    // B waits for A, first in its target's queue.
    let queued = serve.run(b).await;
    if queued["status"] == "queued" {
        assert_eq!(queued["queue_position"], 1, "{queued}");
    }

    let within = Duration::from_secs(90);
    let a_run = serve.wait_for(a, within, is_final).await;
    let b_run = serve.wait_for(b, within, is_final).await;
    for run in [&a_run, &b_run] {
        assert_eq!(run["status"], "completed", "{run}");
        assert_eq!(run["submitted_by"], "ci");
    }
    // The records' time ranges do not overlap: every request of A ended
    // before the first of B arrived (the simulator's own clock).
    let split = b_run["started_ms"].as_f64().unwrap() / 1000.0;
    assert!(split >= a_run["finished_ms"].as_f64().unwrap() / 1000.0);
    let seen = sim.requests();
    let (of_a, of_b): (Vec<_>, Vec<_>) = seen.iter().partition(|r| r.arrival < split);
    assert_eq!(
        of_a.len(),
        lines(&serve.artifact(a, "requests.jsonl").await.body)
    );
    assert_eq!(
        of_b.len(),
        lines(&serve.artifact(b, "requests.jsonl").await.body)
    );
    let a_end = of_a.iter().map(|r| r.end).fold(f64::MIN, f64::max);
    let b_start = of_b.iter().map(|r| r.arrival).fold(f64::MAX, f64::min);
    assert!(!of_a.is_empty() && !of_b.is_empty());
    assert!(
        a_end <= b_start,
        "A's last request ended at {a_end}, B's first arrived at {b_start}"
    );
    let report = serve
        .call(
            "GET",
            &format!("/api/v1/runs/{a}/report.html"),
            Some(READ),
            None,
        )
        .await;
    assert_eq!(report.status, 200);
    assert!(
        report.body.as_str().unwrap().contains("<html"),
        "the report is HTML"
    );

    // A long run canceled mid-stage: it drains, keeps its records, reads canceled.
    let long = serve.submit(&stages(60, 1), "long").await;
    let long = long["id"].as_str().unwrap();
    let before = sim.requests().len();
    serve
        .wait_for(long, within, |r| r["status"] == "running")
        .await;
    sends(&sim, before + 4, within).await;
    let forbidden = serve
        .call(
            "POST",
            &format!("/api/v1/runs/{long}/cancel"),
            Some(READ),
            None,
        )
        .await;
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);
    let canceled = serve
        .call(
            "POST",
            &format!("/api/v1/runs/{long}/cancel"),
            Some(SUBMIT),
            None,
        )
        .await;
    assert_eq!(canceled.status, 200, "{}", canceled.body);
    assert_eq!(canceled.body["status"], "canceled", "{}", canceled.body);
    assert_eq!(canceled.body["canceled_by"], "ci");
    let records = lines(&serve.artifact(long, "requests.jsonl").await.body);
    assert!(records >= 4, "{records} records kept");
    assert_eq!(serve.artifact(long, "summary.json").await.status, 200);
    let again = serve
        .call(
            "POST",
            &format!("/api/v1/runs/{long}/cancel"),
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(again.status, 409, "{}", again.body);
    assert!(
        again.body["error"].as_str().unwrap().contains("canceled"),
        "{}",
        again.body
    );
    drop(serve);
}

#[tokio::test]
async fn tokens_scopes_and_origins_are_checked() {
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let serve = setup.start().await;
    let health = serve.call("GET", "/healthz", None, None).await;
    assert_eq!(health.status, 200);
    for token in [None, Some("wrong")] {
        let answer = serve.call("GET", "/api/v1/runs", token, None).await;
        assert_eq!(answer.status, 401, "{token:?}: {}", answer.body);
        let challenge = answer.headers.iter().find(|(k, _)| k == "www-authenticate");
        assert!(
            challenge.is_some_and(|(_, v)| v.starts_with("Bearer")),
            "{:?}",
            answer.headers
        );
    }
    let listed = serve.call("GET", "/api/v1/runs", Some(READ), None).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let targets = serve.call("GET", "/api/v1/targets", Some(READ), None).await;
    assert_eq!(targets.body["targets"][0]["name"], "blind");
    assert!(
        !targets.body.to_string().contains("127.0.0.1"),
        "clients never see a target's URL"
    );
    let request = json!({"target": "sim", "scenario": stages(1, 1)});
    let refused = serve
        .call("POST", "/api/v1/runs", Some(READ), Some(request))
        .await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(
        refused.body["error"]
            .as_str()
            .unwrap()
            .contains("needs scope submit")
    );

    // A page on another origin cannot drive the service through a browser.
    let client = nyann_testkit::http_client().build().unwrap();
    let foreign = client
        .get(format!("{}/api/v1/runs", serve.url))
        .header("authorization", format!("Bearer {READ}"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status().as_u16(), 403);
    assert!(sim.requests().is_empty());
}

#[tokio::test]
async fn bad_scenarios_and_bodies_are_refused_within_their_bounds() {
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let serve = setup.start().await;
    let plan = |target: &str, scenario: &str| json!({"target": target, "scenario": scenario});
    let refused = async |body: Value| {
        let started = std::time::Instant::now();
        let answer = serve
            .call("POST", "/api/v1/plan", Some(READ), Some(body))
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        assert!(
            answer.status == 400 || answer.status == 404,
            "{}: {}",
            answer.status,
            answer.body
        );
        answer.body["error"].as_str().unwrap().to_string()
    };
    // A runaway loop: stopped by the plan's own step budget, far below a
    // command line's (10,000,000).
    let runaway = "for a in range(100000):\n    for b in range(100000):\n        pass\n";
    let error = refused(plan("sim", runaway)).await;
    assert!(
        error.contains("scenario.star:") && error.contains("ran past its budget of 100,000 steps"),
        "{error}"
    );
    let many = "scenario(workload=workload(\"faker\"), stages=[stage(\"1s\", concurrency=1) for i in range(10000)])\n";
    let error = refused(plan("sim", many)).await;
    assert!(
        error.contains("10000 stages") && error.contains("at most 16"),
        "{error}"
    );
    let error = refused(plan("nowhere", &stages(1, 1))).await;
    assert!(
        error.contains("unknown target \"nowhere\"") && error.contains("sim"),
        "{error}"
    );
    let hot = stages(1, 1).replace("concurrency=2", "concurrency=64");
    let error = refused(plan("sim", &hot)).await;
    assert!(error.contains("max_concurrency 8"), "{error}");
    let sweep = crate::support::sweep(&[1, 2], crate::sweep::STOPS_AT_16);
    let error = refused(plan("blind", &sweep)).await;
    assert!(error.contains("no signal source"), "{error}");
    // The signal preflight runs at plan time: a source that cannot be read,
    // or that finds no series of the server, refuses the plan, naming the
    // source by its field, never by its address.
    for target in ["dark", "mute"] {
        let error = refused(plan(target, &sweep)).await;
        assert!(
            error.contains(&format!(
                "target \"{target}\"'s signal source fails its preflight"
            )) && error.contains("[signals.scrape[0]]")
                && !error.contains("127.0.0.1"),
            "{error}"
        );
    }
    let error = refused(plan("mute", &sweep)).await;
    assert!(error.contains("no series"), "{error}");
    // Without a stop on congestion, no preflight: a plain run needs none.
    let plain = serve
        .call(
            "POST",
            "/api/v1/plan",
            Some(READ),
            Some(plan("dark", &stages(1, 1))),
        )
        .await;
    assert_eq!(plain.status, 200, "{}", plain.body);
    let error = refused(plan("sim", &"#".repeat(70_000))).await;
    assert!(error.contains("the limit is 65536 bytes"), "{error}");
    let error = refused(plan("sim", "scenario(")).await;
    assert!(error.contains("does not compile"), "{error}");
    // Errors and plans name the client's scenario, never a path of the
    // service's machine (a sweep is named after its place in the file).
    assert!(error.contains("scenario.star:1:"), "{error}");
    let named = serve
        .call(
            "POST",
            "/api/v1/plan",
            Some(READ),
            Some(plan(
                "sim",
                &crate::support::sweep(&[1, 2], crate::sweep::STOPS_AT_16),
            )),
        )
        .await;
    assert_eq!(named.status, 200, "{}", named.body);
    let text = named.body.to_string();
    let data = setup.data().display().to_string();
    assert!(
        text.contains(r#""file":"scenario.star""#) && !text.contains(&data),
        "{text}"
    );

    // The plan of a good scenario: its stages and durations.
    let good = serve
        .call(
            "POST",
            "/api/v1/plan",
            Some(READ),
            Some(plan("sim", &stages(2, 3))),
        )
        .await;
    assert_eq!(good.status, 200, "{}", good.body);
    assert_eq!(good.body["stages"].as_array().unwrap().len(), 3);
    assert_eq!(good.body["longest_s"], 6.0);

    // 100 MB announced: refused before it is read.
    let status = huge_body(&serve.url).await;
    assert_eq!(status, 413);
    assert!(sim.requests().is_empty());
}

/// Sends a POST announcing 100 MB and the first MiB of it; the status line.
async fn huge_body(url: &str) -> u16 {
    let addr = url.strip_prefix("http://").unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/v1/runs HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {SUBMIT}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        100 * 1024 * 1024
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // The server may answer and close before it is all sent.
    let _ = stream.write_all(&vec![b' '; 1024 * 1024]).await;
    let mut answer = vec![0; 64];
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut answer))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let line = String::from_utf8_lossy(&answer[..read]).to_string();
    line.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{line}"))
}

#[tokio::test]
async fn a_run_killed_with_the_service_reads_interrupted_and_the_queue_goes_on() {
    let _serial = serial().await;
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let mut serve = setup.start().await;
    let long = serve.submit(&stages(60, 1), "long").await;
    let long = long["id"].as_str().unwrap().to_string();
    let next = serve.submit(&stages(1, 1), "next").await;
    let next = next["id"].as_str().unwrap().to_string();
    let within = Duration::from_secs(90);
    serve
        .wait_for(&long, within, |r| r["status"] == "running")
        .await;
    sends(&sim, 4, within).await;
    // kill -9: the service cannot clean anything up.
    serve.child.start_kill().unwrap();
    serve.child.wait().await.unwrap();

    let serve = setup.start().await;
    let run = serve.wait_for(&long, within, is_final).await;
    assert_eq!(run["status"], "interrupted", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap()
            .contains("records are kept"),
        "{run}"
    );
    let records = lines(&serve.artifact(&long, "requests.jsonl").await.body);
    assert!(records >= 4, "{records} records kept");
    let run = serve.wait_for(&next, within, is_final).await;
    assert_eq!(
        run["status"], "completed",
        "the queued run ran after the restart: {run}"
    );
    assert_data_dir(&setup.data());
}

/// The data directory holds the database and ordinary run directories.
fn assert_data_dir(data: &Path) {
    assert!(data.join("runs.db").is_file());
    let runs: Vec<_> = std::fs::read_dir(data.join("runs"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .collect();
    for run in runs {
        assert!(
            run.path().join("summary.json").is_file(),
            "{}",
            run.path().display()
        );
    }
}

#[tokio::test]
async fn a_bad_targets_or_tokens_file_stops_the_start_with_every_error_named() {
    let dir = tempfile::tempdir().unwrap();
    let targets = dir.path().join("targets.toml");
    std::fs::write(
        &targets,
        "[targets.a]\nurl = \"ftp://x\"\n[targets.b]\nurl = \"http://127.0.0.1:1/v1\"\nbounds = { max_stages = 500 }\n",
    )
    .unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\nname = \"ci\"\nsha256 = \"plain-token\"\nscope = \"submit\"\n",
    )
    .unwrap();
    let start = async |targets: &Path, tokens: &Path| {
        let out = nyann_bench()
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--targets")
            .arg(targets)
            .arg("--tokens")
            .arg(tokens)
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = start(&targets, &tokens).await;
    assert!(stderr.contains("target \"a\": url:"), "{stderr}");
    assert!(
        stderr.contains("target \"b\": bounds.max_stages:"),
        "{stderr}"
    );
    std::fs::write(&targets, "[targets.a]\nurl = \"http://127.0.0.1:1/v1\"\n").unwrap();
    let stderr = start(&targets, &tokens).await;
    assert!(
        stderr.contains("token \"ci\": sha256 must be 64 hexadecimal digits"),
        "{stderr}"
    );
}

/// The plan's signal preflight against a real Prometheus that holds no
/// series of the deployment: refused, saying what was looked for, naming
/// the source by its field; a sweep on the scraped target plans.
#[tokio::test]
async fn a_plan_asks_a_real_prometheus_for_the_deployments_series() {
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let prometheus = nyann_testkit::PrometheusServer::start(&[]).await.unwrap();
    let mut targets = std::fs::OpenOptions::new()
        .append(true)
        .open(setup.dir.path().join("targets.toml"))
        .unwrap();
    std::io::Write::write_all(
        &mut targets,
        format!(
            "[targets.prom]\nurl = \"{}\"\nsignals = {{ prometheus_url = \"{}\", deploy_name = \"llama\" }}\n",
            sim.base_url(),
            prometheus.url()
        )
        .as_bytes(),
    )
    .unwrap();
    let serve = setup.start().await;
    let sweep = crate::support::sweep(&[1, 2], crate::sweep::STOPS_AT_16);
    let plan = async |target: &str| {
        serve
            .call(
                "POST",
                "/api/v1/plan",
                Some(READ),
                Some(json!({"target": target, "scenario": sweep})),
            )
            .await
    };
    let refused = plan("prom").await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    let error = refused.body["error"].as_str().unwrap();
    assert!(
        error.contains("target \"prom\"'s signal source fails its preflight")
            && error.contains("[signals.prometheus_url]")
            && error.contains("llama")
            && !error.contains(&prometheus.url()),
        "{error}"
    );
    let planned = plan("sim").await;
    assert_eq!(planned.status, 200, "{}", planned.body);
}

/// `--tls-cert/--tls-key`: the service speaks HTTPS (a client trusting
/// the CA gets its answers, plain HTTP gets none); a key that does not
/// read stops the start, naming the flags.
#[tokio::test]
async fn the_service_speaks_tls_when_given_a_certificate() {
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let ca = nyann_testkit::PrivateCa::new().unwrap();
    let (cert, key) = (ca.server_cert.as_path(), ca.server_key.as_path());
    let tls = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let serve = setup.start_with(&tls, &[]).await;
    assert!(serve.url.starts_with("https://"), "{}", serve.url);
    let client = ca
        .trusting_client(nyann_testkit::http_client())
        .unwrap()
        .build()
        .unwrap();
    let targets = client
        .get(format!("{}/api/v1/targets", serve.url))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap();
    assert_eq!(targets.status().as_u16(), 200);
    let body: Value = targets.json().await.unwrap();
    assert!(body.to_string().contains("\"wide\""), "{body}");
    let plain = serve.url.replace("https://", "http://");
    let refused = nyann_testkit::http_client()
        .build()
        .unwrap()
        .get(format!("{plain}/healthz"))
        .send()
        .await;
    assert!(
        refused
            .as_ref()
            .map_or(true, |r| r.status().as_u16() != 200),
        "{refused:?}"
    );

    let stderr = setup
        .refused_start(&[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            cert.to_str().unwrap(),
        ])
        .await;
    assert!(
        stderr.contains("--tls-cert/--tls-key: ")
            && stderr.contains("cannot read a PEM private key"),
        "{stderr}"
    );
}

/// The web page in a real headless browser: a running sweep's stages
/// appear while it runs, and once it stops its row says where and links
/// its report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_running_runs_stages_and_opens_its_report() {
    let _serial = serial().await;
    // Two sequences at once: 8 streams leave 6 waiting (TTFT p99 near
    // 0.5 s), 2 leave none (5 ms).
    let sim = nyann_sim::start(nyann_sim::SimConfig {
        seed: 1,
        max_num_seqs: Some(2),
        ..nyann_sim::SimConfig::default()
    })
    .await
    .unwrap();
    let setup = Setup::new(&sim);
    let serve = setup.start().await;
    let sweep = "scenario(\n    workload = workload(\"faker\", isl=64, osl=64),\n    \
        stages = until_congested(\n        [stage(\"5s\", concurrency=c) for c in [1, 1, 2, 8]],\n        \
        waiting_requests_p50=3, ttft_p99=\"100ms\", kv_cache_usage=1.0, preemptions=1000000,\n    ),\n)\n";
    // The run is submitted once the page shows the runs: a slow browser
    // start cannot miss it running.
    let url = format!("{}/", serve.url);
    let (ready, page_ready) = tokio::sync::oneshot::channel();
    let (give_id, id) = std::sync::mpsc::channel();
    let watcher = tokio::task::spawn_blocking(move || watch_in_a_browser(&url, ready, id));
    let _ = page_ready.await;
    let run = serve.submit(sweep, "watched").await;
    let _ = give_id.send(run["id"].as_str().unwrap().to_string());
    let (live, row, report) = watcher.await.unwrap();
    // Seen while the run ran: its first stage, measured and judged clean.
    assert_eq!(live[0][0], "#0 c=1", "{live:?}");
    assert_eq!(live[0][1], "measured", "{live:?}");
    assert_eq!(live[0][5], "clean", "{live:?}");
    // Its row once it stopped: where, and what it found.
    assert_eq!(row[1], "stopped", "{row:?}");
    assert_eq!(row[4], "4 run, 0 skipped", "{row:?}");
    assert_eq!(row[5], "#3 c=8", "{row:?}");
    assert_eq!(row[6], "#2 c=2", "{row:?}");
    assert!(
        report.contains("<html") && report.contains("#3 c=8"),
        "the report link opens the run's report"
    );
}

/// Opens the page and gives it the read token; once it shows the runs,
/// says it is `ready` and waits for the run's `id`. Returns the rows of
/// the running run's stages as first seen, then the run's row once it is
/// over, and the text of the report its link opens.
fn watch_in_a_browser(
    url: &str,
    ready: tokio::sync::oneshot::Sender<()>,
    id: std::sync::mpsc::Receiver<String>,
) -> (Vec<Vec<String>>, Vec<String>, String) {
    let mut browser = Browser::launch();
    browser.open_url(url);
    browser.evaluate(&format!(
        "document.getElementById('token').value = '{READ}'; \
         document.getElementById('login').requestSubmit(); true"
    ));
    wait_for_page(&mut browser, "the runs", |b| {
        (b.evaluate("document.getElementById('runs').hidden") == false).then_some(())
    });
    let _ = ready.send(());
    let id = id.recv().expect("the test submits a run");
    // The page redraws every 2 seconds: each look is one evaluation.
    let cells = |selector: &str| {
        format!(
            "Array.from(document.querySelectorAll('{selector}')).map(tr => \
             Array.from(tr.cells).map(td => td.textContent))"
        )
    };
    let live: Vec<Vec<String>> = wait_for_page(&mut browser, "a stage of the running run", |b| {
        let rows = b.evaluate(&cells("#live-stages tbody tr"));
        serde_json::from_value(rows)
            .ok()
            .filter(|rows: &Vec<Vec<String>>| !rows.is_empty())
    });
    let status = format!("api('/runs/{id}').then(r => r.json()).then(run => run.status)");
    assert_eq!(
        browser.evaluate(&status),
        "running",
        "the stages were seen live"
    );
    let row_selector = format!("tr[data-run=\"{id}\"]");
    let row: Vec<String> = wait_for_page(&mut browser, "the run's report link", |b| {
        let row = b.evaluate(&format!(
            "(row => row && row.querySelector('a.report') ? \
             Array.from(row.cells).map(td => td.textContent) : null)\
             (document.querySelector('{row_selector}'))"
        ));
        serde_json::from_value(row).ok()
    });
    let report = browser.evaluate(&format!(
        "(async () => {{ let opened; window.open = u => {{ opened = u; }}; \
         document.querySelector('{row_selector} a.report').click(); \
         for (let i = 0; i < 200 && !opened; i++) await new Promise(r => setTimeout(r, 50)); \
         return opened ? await (await fetch(opened)).text() : ''; }})()"
    ));
    let errors = browser.console_errors();
    assert!(errors.is_empty(), "the page logged errors: {errors:#?}");
    (live, row, report.as_str().unwrap_or_default().to_string())
}

/// Looks at the page until `look` finds what it wants (at most 90 s).
fn wait_for_page<T>(
    browser: &mut Browser,
    what: &str,
    mut look: impl FnMut(&mut Browser) -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(found) = look(browser) {
            return found;
        }
        if std::time::Instant::now() > deadline {
            let text = browser.evaluate("document.body.innerText");
            panic!(
                "the page never showed {what}; it shows:\n{}\nits errors: {:#?}",
                text.as_str().unwrap_or_default(),
                browser.console_errors()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
