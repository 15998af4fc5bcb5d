//! Test support for nyann-bench: a real Prometheus for a test, a scripted
//! `/metrics` exporter, a server that queues beyond a fixed number of
//! slots, a private CA, a bounded polling helper, generated datasets, and
//! a TCP tap that keeps the requests and responses passing through it, and
//! the fuzz targets' corpora replayed as tests.
//!
//! [`PrometheusServer::start`] writes a temporary config (`scrape_interval:
//! 1s`) with the given jobs, targets and labels, starts the Debian
//! `prometheus` binary on `127.0.0.1` with an ephemeral port and a temporary
//! TSDB, waits (bounded) until it is ready and every target is up, and kills
//! it by PID when dropped. [`PrometheusServer::start_https`] serves its API
//! over TLS with a certificate of a [`PrivateCa`], optionally requiring a
//! client certificate. When the binary is missing it fails with a message
//! saying how to install it: a test that needs Prometheus must fail, never
//! pass silently.
//!
//! ```no_run
//! # async fn demo(exporter: std::net::SocketAddr) -> Result<(), nyann_testkit::TestkitError> {
//! use nyann_testkit::{PrometheusServer, ScrapeJob};
//! let prom = PrometheusServer::start(&[
//!     ScrapeJob::new("vllm-aggregate").target(exporter, &[("pod", "model-0")]),
//! ])
//! .await?;
//! let url = prom.url(); // http://127.0.0.1:PORT
//! # Ok(()) }
//! ```

pub mod datasets;
pub mod exporter;
pub mod fuzz_corpus;
pub mod queue;
pub mod tap;
mod tls;

pub use tls::PrivateCa;

use std::fmt::Write as _;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variable naming the Prometheus binary (default: `prometheus`
/// on `PATH`).
pub const PROMETHEUS_BIN_ENV: &str = "NYANN_PROMETHEUS_BIN";

/// How long [`PrometheusServer::start`] waits for readiness and for targets.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Interval between checks in [`wait_until`].
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Why the harness could not do its job.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error(
        "the `prometheus` binary was not found ({0}). Install it: `apt-get update && apt-get install -y prometheus` (CI's .ci/run does), or set {PROMETHEUS_BIN_ENV}=/path/to/prometheus"
    )]
    PrometheusMissing(String),
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout { what: String, timeout: Duration },
    #[error("prometheus exited during start-up ({status}); its log:\n{log}")]
    Exited { status: String, log: String },
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
}

/// A scrape job: `job_name` plus its targets.
#[derive(Debug, Clone)]
pub struct ScrapeJob {
    pub job: String,
    pub targets: Vec<ScrapeTarget>,
    /// Path scraped on every target (default `/metrics`).
    pub metrics_path: String,
}

/// One target of a job, with extra labels (e.g. `pod`).
#[derive(Debug, Clone)]
pub struct ScrapeTarget {
    pub addr: SocketAddr,
    pub labels: Vec<(String, String)>,
}

impl ScrapeJob {
    /// A job named `job` (the `job` label of its series).
    pub fn new(job: &str) -> Self {
        Self {
            job: job.to_string(),
            targets: Vec::new(),
            metrics_path: "/metrics".to_string(),
        }
    }

    /// Adds a target scraped at `http://addr/metrics` with `labels`.
    pub fn target(mut self, addr: SocketAddr, labels: &[(&str, &str)]) -> Self {
        self.targets.push(ScrapeTarget {
            addr,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
        self
    }
}

/// A running Prometheus, killed (by PID) when dropped.
#[derive(Debug)]
pub struct PrometheusServer {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    /// `http` or `https`.
    scheme: &'static str,
    /// Reaches the API (trusting the private CA, with its client
    /// certificate, when served over TLS).
    http: reqwest::Client,
}

/// How [`PrometheusServer::start_https`] serves the API.
#[derive(Debug, Clone, Copy)]
pub struct WebTls<'a> {
    pub ca: &'a PrivateCa,
    /// Refuse clients without a certificate signed by the CA (mutual TLS).
    pub require_client_cert: bool,
}

/// Polls `check` every [`POLL_INTERVAL`] until it returns `Some`, or fails
/// with [`TestkitError::Timeout`] naming `what` after `timeout`.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, TestkitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(TestkitError::Timeout {
                what: what.to_string(),
                timeout,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The Prometheus binary to run: `$NYANN_PROMETHEUS_BIN` or `prometheus` on
/// `PATH`, checked by running `--version`.
pub fn prometheus_binary() -> Result<PathBuf, TestkitError> {
    check_binary(
        std::env::var_os(PROMETHEUS_BIN_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("prometheus")),
    )
}

fn check_binary(bin: PathBuf) -> Result<PathBuf, TestkitError> {
    match Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok(bin),
        Ok(s) => Err(TestkitError::PrometheusMissing(format!(
            "`{} --version` exited with {s}",
            bin.display()
        ))),
        Err(e) => Err(TestkitError::PrometheusMissing(format!(
            "cannot run `{}`: {e}",
            bin.display()
        ))),
    }
}

/// The YAML config (JSON strings are valid YAML scalars, so every value is
/// written with serde_json to get the quoting right).
fn config_yaml(jobs: &[ScrapeJob]) -> String {
    let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let mut y = String::from(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
    );
    for job in jobs {
        let _ = writeln!(y, "  - job_name: {}", q(&job.job));
        let _ = writeln!(y, "    metrics_path: {}", q(&job.metrics_path));
        let _ = writeln!(y, "    static_configs:");
        for t in &job.targets {
            let _ = writeln!(y, "      - targets: [{}]", q(&t.addr.to_string()));
            if !t.labels.is_empty() {
                let labels: Vec<String> = t
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{}: {}", q(k), q(v)))
                    .collect();
                let _ = writeln!(y, "        labels: {{{}}}", labels.join(", "));
            }
        }
    }
    y
}

fn free_port() -> Result<u16, TestkitError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|error| TestkitError::Io {
        what: "binding 127.0.0.1:0 to pick a port".into(),
        error,
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|error| TestkitError::Io {
            what: "reading the picked port".into(),
            error,
        })
}

impl PrometheusServer {
    /// Starts Prometheus scraping `jobs` every second and waits until it is
    /// ready and all targets are up (each bounded by [`START_TIMEOUT`]).
    ///
    /// The port is picked by binding 127.0.0.1:0 and releasing it; if another
    /// process takes it in between, Prometheus exits and the start is retried
    /// with a new port (at most 3 attempts, each reported on stderr).
    pub async fn start(jobs: &[ScrapeJob]) -> Result<Self, TestkitError> {
        Self::start_with(jobs, None).await
    }

    /// [`PrometheusServer::start`], serving the API over https with a
    /// certificate for 127.0.0.1 signed by `tls.ca`.
    pub async fn start_https(jobs: &[ScrapeJob], tls: WebTls<'_>) -> Result<Self, TestkitError> {
        Self::start_with(jobs, Some(tls)).await
    }

    async fn start_with(jobs: &[ScrapeJob], tls: Option<WebTls<'_>>) -> Result<Self, TestkitError> {
        let bin = prometheus_binary()?;
        let mut last_err = None;
        for attempt in 1..=3 {
            match Self::start_once(&bin, jobs, tls).await {
                Ok(server) => {
                    server.wait_targets_up(jobs, START_TIMEOUT).await?;
                    return Ok(server);
                }
                Err(TestkitError::Exited { status, log })
                    if log.contains("address already in use") =>
                {
                    eprintln!("nyann-testkit: prometheus port was taken (attempt {attempt}/3)");
                    last_err = Some(TestkitError::Exited { status, log });
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or(TestkitError::Timeout {
            what: "a free port for prometheus".into(),
            timeout: START_TIMEOUT,
        }))
    }

    async fn start_once(
        bin: &Path,
        jobs: &[ScrapeJob],
        tls: Option<WebTls<'_>>,
    ) -> Result<Self, TestkitError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |error| TestkitError::Io { what, error }
        };
        let dir = tempfile::Builder::new()
            .prefix("nyann-prometheus-")
            .tempdir()
            .map_err(io("creating a temporary directory"))?;
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_yaml(jobs)).map_err(io("writing prometheus.yml"))?;
        let log = std::fs::File::create(dir.path().join("prometheus.log"))
            .map_err(io("creating prometheus.log"))?;
        let log2 = log.try_clone().map_err(io("duplicating the log handle"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut command = Command::new(bin);
        let mut http = http_client();
        let mut scheme = "http";
        if let Some(tls) = tls {
            let web = dir.path().join("web.yml");
            std::fs::write(&web, tls.ca.web_config(tls.require_client_cert))
                .map_err(io("writing web.yml"))?;
            command.arg(format!("--web.config.file={}", web.display()));
            http = tls.ca.trusting_client(http)?;
            scheme = "https";
        }
        let http = http.build().map_err(|e| TestkitError::Io {
            what: "building the HTTP client".into(),
            error: std::io::Error::other(e),
        })?;
        let child = command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(io("starting prometheus"))?;
        let mut server = PrometheusServer {
            child,
            addr,
            dir,
            scheme,
            http,
        };
        server.wait_ready(START_TIMEOUT).await?;
        Ok(server)
    }

    /// `http://127.0.0.1:PORT` (`https://` when started with TLS).
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The PID of the prometheus process.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs an instant PromQL query now and returns the `data.result` array
    /// (`None` on any HTTP or API error). For assertions in tests.
    pub async fn query(&self, promql: &str) -> Option<Vec<serde_json::Value>> {
        let url = format!("{}/api/v1/query", self.url());
        let body = self
            .http
            .get(&url)
            .query(&[("query", promql)])
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        if v["status"] != "success" {
            return None;
        }
        v["data"]["result"].as_array().cloned()
    }

    /// Waits until `promql` returns at least one series (e.g. until a first
    /// scrape of a metric is ingested), bounded by `timeout`.
    pub async fn wait_for_series(
        &self,
        promql: &str,
        timeout: Duration,
    ) -> Result<(), TestkitError> {
        wait_until(
            &format!("`{promql}` to return a series"),
            timeout,
            || async {
                self.query(promql)
                    .await
                    .filter(|r| !r.is_empty())
                    .map(|_| ())
            },
        )
        .await
    }

    /// Prometheus' own log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    fn exited(&mut self) -> Option<TestkitError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(TestkitError::Exited {
                status: status.to_string(),
                log: self.log(),
            }),
            _ => None,
        }
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), TestkitError> {
        let http = self.http.clone();
        let url = format!("{}/-/ready", self.url());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.exited() {
                return Err(e);
            }
            if let Ok(r) = http.get(&url).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::Timeout {
                    what: format!("prometheus to be ready at {url}; its log:\n{}", self.log()),
                    timeout,
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Waits until every configured target has been scraped successfully.
    async fn wait_targets_up(
        &self,
        jobs: &[ScrapeJob],
        timeout: Duration,
    ) -> Result<(), TestkitError> {
        let expected: usize = jobs.iter().map(|j| j.targets.len()).sum();
        let http = self.http.clone();
        let url = format!("{}/api/v1/targets?state=active", self.url());
        let last = std::cell::RefCell::new(String::new());
        let result = wait_until("all scrape targets to be up", timeout, || {
            let http = http.clone();
            let url = url.clone();
            let last = &last;
            async move {
                let body = http.get(&url).send().await.ok()?.text().await.ok()?;
                let v: serde_json::Value = serde_json::from_str(&body).ok()?;
                let targets = v["data"]["activeTargets"].as_array()?.clone();
                let up = targets.iter().filter(|t| t["health"] == "up").count();
                *last.borrow_mut() = targets
                    .iter()
                    .map(|t| {
                        format!(
                            "{} {} health={} lastError={}",
                            t["labels"]["job"], t["scrapeUrl"], t["health"], t["lastError"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                (targets.len() == expected && up == expected).then_some(())
            }
        })
        .await;
        result.map_err(|e| match e {
            TestkitError::Timeout { what, timeout } => TestkitError::Timeout {
                what: format!("{what}; targets:\n{}", last.borrow()),
                timeout,
            },
            e => e,
        })
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        // Child::kill sends SIGKILL to this child's PID only.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A reqwest client builder for tests. The workspace builds reqwest without
/// a crypto provider of its own (no aws-lc): this installs ring first, as
/// the signal sources do.
pub fn http_client() -> reqwest::ClientBuilder {
    // An error only means a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// `GET url` with a client from [`http_client`] (`reqwest::get` would
/// panic unless another test happened to install the provider first).
pub async fn get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http_client().build()?.get(url).send().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_quotes_everything() {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let y = config_yaml(&[ScrapeJob::new("vllm-decode").target(addr, &[("pod", "m\"-0")])]);
        assert!(y.contains("scrape_interval: 1s"));
        assert!(y.contains("  - job_name: \"vllm-decode\""));
        assert!(y.contains("      - targets: [\"127.0.0.1:9\"]"));
        assert!(y.contains("        labels: {\"pod\": \"m\\\"-0\"}"));
    }

    #[tokio::test]
    async fn wait_until_returns_value_or_times_out() {
        let mut n = 0;
        let v = wait_until("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            let n = n;
            async move { (n >= 3).then_some(n) }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
        let e = wait_until("never", Duration::from_millis(250), || async { None::<()> })
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "timed out after 250ms waiting for never");
    }

    #[test]
    fn missing_binary_says_how_to_install() {
        let e = check_binary(PathBuf::from("/nonexistent/prometheus"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot run `/nonexistent/prometheus`"), "{e}");
        assert!(e.contains("apt-get install -y prometheus"), "{e}");
    }
}
