//! Server metric sources to per-role stage signals.
//!
//! After each measured stage the sweep asks a [`SignalSource`] for the
//! server-side signals of every role (`prefill`/`decode` or `aggregate`) over
//! that stage, defined as follows (the policy interface documents the same
//! definitions):
//!
//! - steady window = `[start + 20%, start + 95%]` of the stage, or the whole
//!   stage when that is shorter than 5 s;
//! - `waiting_requests_p50`: per-sample sum of waiting requests across the
//!   role's pods, then p50 over the steady window (linear interpolation);
//! - `ttft_p99_seconds`: Prometheus `histogram_quantile(0.99)` of the TTFT
//!   histogram over the steady window;
//! - `kv_cache_usage_max`: max KV usage across pods and the steady window;
//! - `preemptions`: preemption counter increase over the whole stage;
//! - in `extra`, same windows: `ttft_p50_seconds`, `itl_p50_seconds`,
//!   `itl_p99_seconds`, `generation_tokens_per_second`, `kv_cache_usage_min`,
//!   `running_requests_p50`.
//!
//! Two sources compute them: a Prometheus server (`--prometheus-url`) or
//! direct sampling of the servers' `/metrics` (`--scrape`); the metric
//! names come from a server profile (`--server vllm|sglang`). Before the
//! first stage, [`SignalSource::preflight`] checks that every role finds its
//! server's series. Computing a stage's signals never fails as a whole: a
//! failed query zeroes its signal and adds an error string naming the role
//! and the signal (fail-open), and the coverage says, per role and signal,
//! whether series were found, so that a missing signal is never taken for a
//! measured 0.
//!
//! ```no_run
//! # async fn demo(options: nyann_signals::SignalOptions) -> Result<(), nyann_signals::SignalError> {
//! if let Some(source) = nyann_signals::SignalSource::from_options(&options).await? {
//!     for warning in source.preflight().await? { tracing::warn!("{warning}"); }
//!     source.start(); // starts the --scrape sampler; no-op for Prometheus
//!     tracing::info!("server signals: {source}");
//!     // ... run a stage from `start` to `end` (unix seconds) ...
//!     # let (start, end) = (0.0, 60.0);
//!     let signals = source.stage_signals(start, end, Default::default()).await;
//!     for e in &signals.errors { tracing::warn!("signal: {e}"); }
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nyann_model::{RoleCoverage, RoleSignals};

pub mod config;
pub mod exposition;
/// The checks of the fuzz targets (`fuzz/`), shared with the corpus tests.
#[doc(hidden)]
pub mod fuzz_check;
mod http;
mod preflight;
pub mod profile;
pub mod prometheus;
mod scrape;
pub mod spec;

/// The signal arithmetic (windows, quantiles, counter increases) lives in
/// `nyann_model::math` so that the simulator computes its figures with the
/// same code; re-exported here so `nyann_signals::math` keeps working.
pub use nyann_model::math;

pub use config::{RoleSelector, ScrapeTarget, SignalOptions};
pub use http::{ClientCertError, ClientCertFile};
pub use preflight::{BlindRole, Hint, NothingFound, PreflightWarning, SourceKind, Suggestion};
pub use profile::{MetricNames, MetricOverride, Server};
pub use spec::ClientEvidence;

use http::Tls;
use prometheus::{PromClient, PrometheusSource};
use scrape::ScrapeSource;

/// The server signals of one stage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageSignals {
    /// One entry per role, in order prefill, decode, aggregate, then others.
    pub roles: Vec<RoleSignals>,
    /// Failed queries or scrapes, each naming the role and the signal; the
    /// signals concerned read 0 (fail-open). Goes to
    /// `StageObservation::signal_errors`.
    pub errors: Vec<String>,
    /// Per role (same order as `roles`) and signal: whether series were
    /// found, the metric read, and whether a value is a lower bound.
    pub coverage: Vec<RoleCoverage>,
}

/// A configuration error in the [`SignalOptions`] (the binary names the
/// flags that set them).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SignalError {
    /// A `ROLE={MATCHERS}` selector.
    #[error("selector {value:?}: {why}")]
    Selector { value: String, why: String },
    /// A `[ROLE=]URL` scrape target.
    #[error("scrape target {value:?}: {why}")]
    Scrape { value: String, why: String },
    /// A `SIGNAL=NAME[,NAME...]` list of metric names.
    #[error("metric names {value:?}: {why}")]
    Metric { value: String, why: String },
    #[error("Prometheus header {value:?}: {why}")]
    Header { value: String, why: String },
    #[error("Prometheus URL {url:?}: {why}")]
    PrometheusUrl { url: String, why: String },
    #[error("Prometheus needs roles: a deployment name or at least one role selector")]
    NoRoles,
    #[error("Prometheus and scrape targets are two sources of the same signals: give one of them")]
    BothSources,
    /// `option` is the [`SignalOptions`] field.
    #[error("{option} must be greater than zero")]
    ZeroDuration { option: &'static str },
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(String),
    #[error("invalid CA certificate: {0}")]
    CaCert(String),
    #[error("{0}")]
    ClientCert(ClientCertError),
    /// The source could not be read before the first stage (no load was
    /// sent); what to check depends on the `kind` of source.
    #[error("cannot read server signals from {from} before the first stage: {why}")]
    Unreachable {
        from: String,
        why: String,
        kind: SourceKind,
    },
    /// A role found no series of any signal before the first stage.
    #[error("{0}")]
    NothingFound(NothingFound),
}

/// One `/metrics` text of a `--scrape` URL: what the server said of its
/// configuration (vLLM's `vllm:cache_config_info`) at a moment of the run.
#[derive(Debug, Clone)]
pub struct MetricsText {
    pub role: String,
    /// The URL's place among its role's URLs (from 0).
    pub index: usize,
    pub url: String,
    /// The text, or why it could not be fetched.
    pub text: Result<String, String>,
}

/// Fetches each `--scrape` URL of `args` once, with the same TLS and
/// timeout as the sampler; with `--prometheus-url`, each role's engine
/// configuration series (`vllm:cache_config_info`) now, written as a
/// `/metrics` text; nothing without a source.
pub async fn metrics_texts(args: &SignalOptions) -> Result<Vec<MetricsText>, SignalError> {
    if let Some(url) = &args.prometheus_url {
        return prometheus_config_texts(args, url).await;
    }
    let targets = args.scrape.clone();
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let http = Tls::from_options(args)?
        .builder()
        .connect_timeout(args.scrape_timeout)
        .build()
        .map_err(|e| SignalError::HttpClient(e.to_string()))?;
    let texts = futures_util::future::join_all(
        targets
            .iter()
            .map(|t| scrape::fetch(&http, &t.url, args.scrape_timeout)),
    )
    .await;
    let mut out = Vec::with_capacity(targets.len());
    for (target, text) in targets.into_iter().zip(texts) {
        let index = out
            .iter()
            .filter(|m: &&MetricsText| m.role == target.role)
            .count();
        out.push(MetricsText {
            role: target.role,
            index,
            url: target.url,
            text,
        });
    }
    Ok(out)
}

/// Each role's `vllm:cache_config_info` series as Prometheus has them now,
/// in the exposition format (a role with none is left out).
async fn prometheus_config_texts(
    args: &SignalOptions,
    url: &str,
) -> Result<Vec<MetricsText>, SignalError> {
    // A snapshot for `sim fit`, taken before and after the stages: a
    // Prometheus that does not answer must not hold the run up for its
    // whole query timeout, twice per role.
    let timeout = args.prometheus_timeout.min(SNAPSHOT_TIMEOUT);
    let client = prometheus_client(
        &SignalOptions {
            prometheus_timeout: timeout,
            ..args.clone()
        },
        url,
    )?;
    let roles = config::resolve_roles(args.deploy_name.as_deref(), &args.selectors);
    let now = unix_now();
    let queries: Vec<(String, String)> = roles
        .into_iter()
        .map(|role| {
            let separator = if role.matchers.is_empty() { "" } else { "," };
            let query = format!(
                "{{__name__=~\"vllm:cache_config_info|vllm_cache_config_info\"{separator}{}}}",
                role.matchers
            );
            (role.role, query)
        })
        .collect();
    let answers =
        futures_util::future::join_all(queries.iter().map(|(_, q)| client.query(q, now))).await;
    let mut out = Vec::new();
    for ((role, query), answer) in queries.into_iter().zip(answers) {
        let text = match answer {
            Ok(series) if series.is_empty() => continue,
            Ok(series) => Ok(exposition::render(&series)),
            Err(err) => Err(err.to_string()),
        };
        out.push(MetricsText {
            role,
            index: 0,
            url: format!("{url} {query}"),
            text,
        });
    }
    Ok(out)
}

/// The longest the `/metrics` snapshot of a run's start and end waits for
/// Prometheus (all roles at once), under `--prometheus-timeout`.
pub const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(2);

/// The Prometheus client `args` describe.
fn prometheus_client(args: &SignalOptions, url: &str) -> Result<PromClient, SignalError> {
    PromClient::new(
        url,
        args.prometheus_timeout,
        args.prometheus_bearer_token.as_deref(),
        &args.prometheus_headers,
        &Tls::from_options(args)?,
    )
}

enum Inner {
    Prometheus(PrometheusSource),
    Scrape(ScrapeSource),
}

/// Where server signals come from, built from [`SignalOptions`].
pub struct SignalSource {
    inner: Inner,
    /// `--allow-missing-signals`: a role that finds nothing only warns.
    allow_missing: bool,
}

impl SignalSource {
    /// Builds the source the flags describe; `Ok(None)` when neither
    /// `--prometheus-url` nor `--scrape` is given. Does not contact any server.
    pub async fn from_options(args: &SignalOptions) -> Result<Option<SignalSource>, SignalError> {
        let names = MetricNames::with_overrides(args.server, &args.metrics);
        let inner = match (&args.prometheus_url, args.scrape.is_empty()) {
            (Some(_), false) => return Err(SignalError::BothSources),
            (Some(url), true) => {
                if args.prometheus_timeout.is_zero() {
                    return Err(SignalError::ZeroDuration {
                        option: "prometheus_timeout",
                    });
                }
                let roles = config::resolve_roles(args.deploy_name.as_deref(), &args.selectors);
                if roles.is_empty() {
                    return Err(SignalError::NoRoles);
                }
                let client = prometheus_client(args, url)?;
                Inner::Prometheus(PrometheusSource::new(
                    client,
                    roles,
                    names,
                    args.settle,
                    args.settle_wait,
                ))
            }
            (None, false) => {
                for (option, d) in [
                    ("scrape_interval", args.scrape_interval),
                    ("scrape_timeout", args.scrape_timeout),
                ] {
                    if d.is_zero() {
                        return Err(SignalError::ZeroDuration { option });
                    }
                }
                let targets = args.scrape.clone();
                let http = Tls::from_options(args)?
                    .builder()
                    .connect_timeout(args.scrape_timeout)
                    .build()
                    .map_err(|e| SignalError::HttpClient(e.to_string()))?;
                Inner::Scrape(ScrapeSource::new(
                    targets,
                    names,
                    args.scrape_interval,
                    args.scrape_timeout,
                    args.settle,
                    args.settle_wait,
                    http,
                ))
            }
            (None, true) => return Ok(None),
        };
        Ok(Some(SignalSource {
            inner,
            allow_missing: args.allow_missing_signals,
        }))
    }

    /// Before any load: checks that every role finds its server's series
    /// (one Prometheus query per role, or one scrape of each URL). Returns
    /// the warnings to log (signals missing on a role; with
    /// `--allow-missing-signals`, roles that found nothing). Fails when the
    /// source cannot be read, or when a role finds no series of any signal,
    /// saying what does exist that looks like the server.
    pub async fn preflight(&self) -> Result<Vec<PreflightWarning>, SignalError> {
        let (report, names) = match &self.inner {
            Inner::Prometheus(p) => (p.preflight().await?, p.names()),
            Inner::Scrape(s) => (s.preflight().await?, s.names()),
        };
        report.conclude(names, self.allow_missing)
    }

    /// Starts background sampling for `--scrape` (idempotent; a no-op for
    /// Prometheus). Call it before the first measured stage, inside a tokio
    /// runtime. Sampling stops when the source is dropped.
    pub fn start(&self) {
        if let Inner::Scrape(s) = &self.inner {
            s.start();
        }
    }

    /// The signals of every role over the stage `[start_unix, end_unix]`
    /// (unix seconds). Waits first (bounded by `--settle-wait`, plus
    /// `--settle`) for data covering the stage end. Never fails: see
    /// [`StageSignals::errors`].
    ///
    /// `client` is what the client saw of the stage: with the server's own
    /// waiting and running requests, it tells a stalled server (no first
    /// token in the window: TTFT at least the window's length) from an idle
    /// one (no data), see [`spec::resolve_empty_quantiles`].
    pub async fn stage_signals(
        &self,
        start_unix: f64,
        end_unix: f64,
        client: ClientEvidence,
    ) -> StageSignals {
        match &self.inner {
            Inner::Prometheus(p) => p.stage_signals(start_unix, end_unix, client).await,
            Inner::Scrape(s) => s.stage_signals(start_unix, end_unix, client).await,
        }
    }

    /// Every role's waiting requests now: the p50 of their sum over the
    /// last few samples (three scrape intervals for `--scrape`; for
    /// Prometheus, whose scrape interval is not known here, the last 30 s,
    /// so a drain shows there up to 15 s late). A failed query reads 0,
    /// with its error.
    pub async fn waiting_now(&self) -> StageSignals {
        let recent = match &self.inner {
            Inner::Prometheus(_) => 30.0,
            Inner::Scrape(s) => (3.0 * s.interval().as_secs_f64()).max(0.5),
        };
        let now = unix_now();
        self.stage_signals(now - recent, now, ClientEvidence::default())
            .await
    }

    /// Role names in output order.
    pub fn roles(&self) -> Vec<String> {
        match &self.inner {
            Inner::Prometheus(p) => p.roles().iter().map(|r| r.role.clone()).collect(),
            Inner::Scrape(s) => s.roles(),
        }
    }

    /// Where `role`'s series come from: its selector (Prometheus) or its
    /// URLs (`--scrape`), for messages.
    pub fn place(&self, role: &str) -> String {
        match &self.inner {
            Inner::Prometheus(p) => p
                .roles()
                .iter()
                .find(|r| r.role == role)
                .map(|r| format!("selector {{{}}}", r.matchers))
                .unwrap_or_default(),
            Inner::Scrape(s) => s.urls(role).join(" "),
        }
    }

    /// A one-line description of the source, its roles and selectors, for logs.
    pub fn describe(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for SignalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Prometheus(p) => {
                write!(f, "prometheus {}", p.url())?;
                for r in p.roles() {
                    write!(f, "; {r}")?;
                }
                Ok(())
            }
            Inner::Scrape(s) => {
                write!(
                    f,
                    "scrape every {}",
                    humantime::format_duration(s.interval())
                )?;
                for role in s.roles() {
                    write!(f, "; {role} {}", s.urls(&role).join(" "))?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Debug for SignalSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SignalSource({self})")
    }
}

/// Now, in unix seconds.
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// The first 200 characters of a body on one line, for error messages.
pub(crate) fn excerpt(body: &str) -> String {
    const MAX: usize = 200;
    let one_line = body.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.is_empty() {
        return "(empty body)".to_string();
    }
    match one_line.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &one_line[..i]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn source_can_be_shared_across_tasks() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::SignalSource>();
        send_sync::<super::StageSignals>();
    }

    #[test]
    fn excerpt_is_bounded_and_single_line() {
        assert_eq!(super::excerpt(""), "(empty body)");
        assert_eq!(super::excerpt("a\n  b"), "a b");
        let long = "é".repeat(500);
        let e = super::excerpt(&long);
        assert_eq!(e.chars().count(), 203);
    }
}
