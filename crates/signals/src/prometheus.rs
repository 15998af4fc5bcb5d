//! The Prometheus source: one PromQL query per signal and role over the
//! stage windows (HTTP API v1), with envelope checks, timeouts, bounded
//! parallelism, metric-name fallbacks, a bounded wait for ingestion, and a
//! check that fails fast once Prometheus stops answering. Before the first
//! stage, one query per role checks which signals its selector finds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use tokio::sync::watch;

use crate::config::{RoleSelector, promql_string};
use crate::http::Tls;
use crate::math::{self, Window};
use crate::preflight::{self, Candidate, RoleFinding, SourceKind};
use crate::profile::{Family, MetricNames, Server};
use crate::spec::{self, Reading, SPECS, Spec, Stat};
use crate::{SignalError, StageSignals, excerpt, unix_now};

/// Queries in flight at once against Prometheus.
pub const MAX_PARALLEL_QUERIES: usize = 4;
/// Largest API response read.
const MAX_BODY_BYTES: usize = 32 << 20;

/// A query that failed. The Display text is what lands in the stage's
/// `signal_errors`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueryError {
    /// Prometheus answered with `"status":"error"`.
    #[error("prometheus: {error_type}: {error} (HTTP {status})")]
    Api {
        status: u16,
        error_type: String,
        error: String,
    },
    /// A non-2xx answer that is not an API envelope (a proxy's page).
    #[error("prometheus: HTTP {status} with a non-API body: {excerpt}")]
    Http { status: u16, excerpt: String },
    /// A 2xx answer that is not the expected JSON.
    #[error("prometheus: malformed response ({why}); body starts: {excerpt}")]
    Malformed { why: String, excerpt: String },
    #[error("prometheus: no answer within {0} (the query timeout)")]
    Timeout(String),
    #[error("prometheus: request to {url} failed: {why}")]
    Transport { url: String, why: String },
    /// A sample value that is NaN or infinite where a number was expected.
    #[error("prometheus returned a non-finite value {0}")]
    NonFinite(String),
    /// Not sent: an earlier query of the same check got no answer in time,
    /// so this one would most likely only wait out the same timeout.
    #[error(
        "prometheus: not queried: an earlier query of this check got no answer within {0} (the query timeout)"
    )]
    NotQueried(String),
}

/// One series of a query result: its labels and points (unix seconds, value).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

#[derive(Deserialize)]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct VectorItem {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

#[derive(Deserialize)]
struct MatrixItem {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    values: Vec<(f64, String)>,
}

/// A thin client for `/api/v1/query` and `/api/v1/query_range`.
#[derive(Debug, Clone)]
pub struct PromClient {
    http: reqwest::Client,
    base: String,
    timeout: Duration,
}

/// Formats unix seconds with millisecond precision, as Prometheus reads them.
pub fn format_time(t: f64) -> String {
    format!("{:.3}", (t * 1000.0).round() / 1000.0)
}

/// A PromQL range duration for `seconds`: whole seconds as `45s`, otherwise
/// milliseconds (`45500ms`), never below 1 ms.
pub fn format_range(seconds: f64) -> String {
    let ms = ((seconds * 1000.0).round() as i64).max(1);
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

impl PromClient {
    /// `base` is the Prometheus URL (`http://host:9090`, a path prefix is kept).
    pub(crate) fn new(
        base: &str,
        timeout: Duration,
        bearer_token: Option<&str>,
        headers: &[(String, String)],
        tls: &Tls,
    ) -> Result<Self, SignalError> {
        let parsed = reqwest::Url::parse(base).map_err(|e| SignalError::PrometheusUrl {
            url: base.to_string(),
            why: e.to_string(),
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(SignalError::PrometheusUrl {
                url: base.to_string(),
                why: "the scheme must be http or https".into(),
            });
        }
        let mut map = HeaderMap::new();
        let bad_header = |name: &str, why: String| SignalError::Header {
            value: name.to_string(),
            why,
        };
        if let Some(token) = bearer_token {
            let mut v = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                .map_err(|e| bad_header("Authorization: Bearer <token>", e.to_string()))?;
            v.set_sensitive(true);
            map.insert(reqwest::header::AUTHORIZATION, v);
        }
        for (name, value) in headers {
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| bad_header(name, e.to_string()))?;
            let v = HeaderValue::from_str(value).map_err(|e| bad_header(name, e.to_string()))?;
            map.insert(n, v);
        }
        let http = tls
            .prometheus_builder()
            .default_headers(map)
            .connect_timeout(timeout)
            .build()
            .map_err(|e| SignalError::HttpClient(e.to_string()))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            timeout,
        })
    }

    /// An instant query at `time`.
    pub async fn query(&self, query: &str, time: f64) -> Result<Vec<Series>, QueryError> {
        self.get(
            "/api/v1/query",
            &[("query", query.to_string()), ("time", format_time(time))],
        )
        .await
    }

    /// A range query over `[start, end]` every `step` seconds.
    pub async fn query_range(
        &self,
        query: &str,
        start: f64,
        end: f64,
        step: f64,
    ) -> Result<Vec<Series>, QueryError> {
        self.get(
            "/api/v1/query_range",
            &[
                ("query", query.to_string()),
                ("start", format_time(start)),
                ("end", format_time(end)),
                ("step", format_time(step)),
            ],
        )
        .await
    }

    /// Runs a planned query.
    pub async fn planned(&self, planned: &Planned) -> Result<Vec<Series>, QueryError> {
        match planned {
            Planned::Range {
                query,
                start,
                end,
                step,
            } => self.query_range(query, *start, *end, *step).await,
            Planned::Instant { query, time } => self.query(query, *time).await,
        }
    }

    async fn get(&self, path: &str, params: &[(&str, String)]) -> Result<Vec<Series>, QueryError> {
        let url = format!("{}{path}", self.base);
        // Let Prometheus give up too, rather than keep evaluating for nobody.
        let mut params = params.to_vec();
        params.push(("timeout", format_time(self.timeout.as_secs_f64())));
        let params = &params;
        let fut = async {
            let mut resp = self
                .http
                .get(&url)
                .query(params)
                .send()
                .await
                .map_err(|e| self.transport(&url, &e))?;
            let status = resp.status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport(&url, &e))? {
                if body.len() + chunk.len() > MAX_BODY_BYTES {
                    return Err(QueryError::Malformed {
                        why: format!("response larger than {MAX_BODY_BYTES} bytes"),
                        excerpt: excerpt(&String::from_utf8_lossy(&body)),
                    });
                }
                body.extend_from_slice(&chunk);
            }
            decode(status, &body)
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(QueryError::Timeout(
                humantime::format_duration(self.timeout).to_string(),
            )),
        }
    }

    fn transport(&self, url: &str, e: &reqwest::Error) -> QueryError {
        if e.is_timeout() {
            return QueryError::Timeout(humantime::format_duration(self.timeout).to_string());
        }
        QueryError::Transport {
            url: url.to_string(),
            why: crate::scrape::describe_reqwest_error(e, self.timeout),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }
}

/// Checks the HTTP status and the API envelope, and extracts the series.
fn decode(status: u16, body: &[u8]) -> Result<Vec<Series>, QueryError> {
    let text = || excerpt(&String::from_utf8_lossy(body));
    let env: Envelope = match serde_json::from_slice(body) {
        Ok(env) => env,
        Err(e) if (200..300).contains(&status) => {
            return Err(QueryError::Malformed {
                why: e.to_string(),
                excerpt: text(),
            });
        }
        Err(_) => {
            return Err(QueryError::Http {
                status,
                excerpt: text(),
            });
        }
    };
    for w in &env.warnings {
        tracing::warn!("prometheus warning: {w}");
    }
    if env.status != "success" {
        return Err(QueryError::Api {
            status,
            error_type: env.error_type.unwrap_or_else(|| "unknown".into()),
            error: env.error.unwrap_or_else(|| "(no message)".into()),
        });
    }
    if !(200..300).contains(&status) {
        return Err(QueryError::Http {
            status,
            excerpt: text(),
        });
    }
    let data = env.data.ok_or_else(|| QueryError::Malformed {
        why: "success without data".into(),
        excerpt: text(),
    })?;
    let malformed = |e: serde_json::Error| QueryError::Malformed {
        why: format!("bad {} result: {e}", data.result_type),
        excerpt: text(),
    };
    let parse_points = |pts: Vec<(f64, String)>| -> Result<Vec<(f64, f64)>, QueryError> {
        pts.into_iter()
            .map(|(t, v)| {
                v.parse::<f64>()
                    .map(|v| (t, v))
                    .map_err(|_| QueryError::Malformed {
                        why: format!("sample value {v:?} is not a number"),
                        excerpt: text(),
                    })
            })
            .collect()
    };
    match data.result_type.as_str() {
        "matrix" => {
            let items: Vec<MatrixItem> =
                serde_json::from_value(data.result.clone()).map_err(malformed)?;
            items
                .into_iter()
                .map(|i| {
                    parse_points(i.values).map(|points| Series {
                        labels: i.metric,
                        points,
                    })
                })
                .collect()
        }
        "vector" => {
            let items: Vec<VectorItem> =
                serde_json::from_value(data.result.clone()).map_err(malformed)?;
            items
                .into_iter()
                .map(|i| {
                    parse_points(vec![i.value]).map(|points| Series {
                        labels: i.metric,
                        points,
                    })
                })
                .collect()
        }
        "scalar" => {
            let point: (f64, String) =
                serde_json::from_value(data.result.clone()).map_err(malformed)?;
            Ok(vec![Series {
                labels: BTreeMap::new(),
                points: parse_points(vec![point])?,
            }])
        }
        other => Err(QueryError::Malformed {
            why: format!("unexpected result type {other:?}"),
            excerpt: text(),
        }),
    }
}

/// How one signal is asked of Prometheus.
#[derive(Debug, Clone, PartialEq)]
pub enum Planned {
    Range {
        query: String,
        start: f64,
        end: f64,
        step: f64,
    },
    Instant {
        query: String,
        time: f64,
    },
}

impl Planned {
    pub fn query(&self) -> &str {
        match self {
            Planned::Range { query, .. } | Planned::Instant { query, .. } => query,
        }
    }
}

/// The query of signal `spec` for `metric` (one name of its family) and a
/// role, over `stage`:
/// - gauges: a range query `sum|max|min(M{sel})` over the steady window, the
///   statistic (p50, max, min) taken here;
/// - histograms: `histogram_quantile(q, sum by (le) (rate(M_bucket{sel}[W])))`
///   at the end of the steady window, `W` its length;
/// - generation tokens/s: `sum(rate(M{sel}[W]))` at the end of the steady window;
/// - preemptions: `sum(increase(M{sel}[S]))` at the stage end, `S` the stage.
pub fn plan(spec: &Spec, metric: &str, role: &RoleSelector, stage: Window) -> Planned {
    let w = spec.window(stage);
    let range = format_range(w.seconds());
    let gauge = |agg: &str| Planned::Range {
        query: format!("{agg}({})", role.series(metric)),
        start: w.start,
        end: w.end,
        step: spec::step_seconds(w),
    };
    match spec.stat {
        Stat::P50OfSum => gauge("sum"),
        Stat::Max => gauge("max"),
        Stat::Min => gauge("min"),
        Stat::Quantile(q) => Planned::Instant {
            query: format!(
                "histogram_quantile({q}, sum by (le) (rate({}[{range}])))",
                role.series(&format!("{metric}_bucket"))
            ),
            time: w.end,
        },
        Stat::RatePerSecond => Planned::Instant {
            query: format!("sum(rate({}[{range}]))", role.series(metric)),
            time: w.end,
        },
        Stat::StageIncrease => Planned::Instant {
            query: format!("sum(increase({}[{range}]))", role.series(metric)),
            time: w.end,
        },
    }
}

/// What a query result says about a signal.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Evaluated {
    Value(f64),
    /// A latency quantile of `+Inf`: its rank lies in the `+Inf` bucket.
    /// Prometheus itself answers the largest finite bound there; a recording
    /// rule or a Prometheus-compatible store may answer `+Inf`, which must
    /// read as "very slow", never as an error that reads 0.
    BeyondLargestBound,
}

/// Reduces a query result to the signal value. `Ok(None)`: no series.
fn evaluate(spec: &Spec, series: &[Series]) -> Result<Option<Evaluated>, QueryError> {
    if series.is_empty() {
        return Ok(None);
    }
    // Combine series per timestamp (the queries aggregate to one series, but
    // a custom selector or a federated setup may still return several).
    let mut by_time: Vec<(f64, f64)> = Vec::new();
    for s in series {
        for &(t, v) in &s.points {
            if let Quantile(_) = spec.stat {
                // histogram_quantile gives NaN when there were no observations
                // (an idle server): no value, which reads as zero.
                if v.is_nan() {
                    continue;
                }
                if v == f64::INFINITY {
                    return Ok(Some(Evaluated::BeyondLargestBound));
                }
            }
            if !v.is_finite() {
                return Err(QueryError::NonFinite(format_value(v)));
            }
            match by_time.iter_mut().find(|(bt, _)| *bt == t) {
                Some((_, acc)) => {
                    *acc = match spec.stat {
                        Stat::Max | Quantile(_) => acc.max(v),
                        Stat::Min => acc.min(v),
                        _ => *acc + v,
                    }
                }
                None => by_time.push((t, v)),
            }
        }
    }
    let values: Vec<f64> = by_time.iter().map(|(_, v)| *v).collect();
    let value = match spec.stat {
        Stat::P50OfSum => math::quantile(&values, 0.5),
        Stat::Max | Quantile(_) | Stat::RatePerSecond | Stat::StageIncrease => {
            values.iter().copied().reduce(f64::max)
        }
        Stat::Min => values.iter().copied().reduce(f64::min),
    };
    Ok(Some(Evaluated::Value(value.unwrap_or(0.0))))
}

use Stat::Quantile;

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v > 0.0 {
        "+Inf".into()
    } else {
        "-Inf".into()
    }
}

/// Trips at the first timeout of a check: every later query of the check,
/// and those still waiting, fail at once with [`QueryError::NotQueried`].
/// A Prometheus that has stopped answering then costs one timeout per
/// check, not one per signal and role.
struct Breaker {
    tripped: watch::Sender<bool>,
    timeout: String,
}

impl Breaker {
    fn new(timeout: Duration) -> Self {
        Self {
            tripped: watch::Sender::new(false),
            timeout: humantime::format_duration(timeout).to_string(),
        }
    }

    async fn run(
        &self,
        query: impl Future<Output = Result<Vec<Series>, QueryError>>,
    ) -> Result<Vec<Series>, QueryError> {
        let mut tripped = self.tripped.subscribe();
        if *tripped.borrow() {
            return Err(QueryError::NotQueried(self.timeout.clone()));
        }
        tokio::select! {
            result = query => {
                if matches!(result, Err(QueryError::Timeout(_))) {
                    self.tripped.send_replace(true);
                }
                result
            }
            _ = tripped.wait_for(|t| *t) => Err(QueryError::NotQueried(self.timeout.clone())),
        }
    }
}

/// The Prometheus source.
pub(crate) struct PrometheusSource {
    client: PromClient,
    roles: Vec<RoleSelector>,
    names: MetricNames,
    settle: Duration,
    settle_wait: Duration,
}

impl PrometheusSource {
    pub(crate) fn new(
        client: PromClient,
        roles: Vec<RoleSelector>,
        names: MetricNames,
        settle: Duration,
        settle_wait: Duration,
    ) -> Self {
        Self {
            client,
            roles,
            names,
            settle,
            settle_wait,
        }
    }

    pub(crate) fn roles(&self) -> &[RoleSelector] {
        &self.roles
    }

    pub(crate) fn names(&self) -> &MetricNames {
        &self.names
    }

    pub(crate) fn url(&self) -> &str {
        self.client.base()
    }

    fn source(&self) -> String {
        format!("Prometheus {}", self.url())
    }

    /// One query per role: which of the profile's series its selector finds
    /// now (`count by (__name__)`), and for a role that finds none, which
    /// targets carry any server's queue-length series.
    pub(crate) async fn preflight(&self) -> Result<preflight::Report, SignalError> {
        let unreachable = |e: QueryError| SignalError::Unreachable {
            from: self.source(),
            why: e.to_string(),
            kind: SourceKind::Prometheus,
        };
        let names = promql_string(&self.names.all_series_names().join("|"));
        let mut roles = Vec::new();
        for role in &self.roles {
            let query = format!(
                "count by (__name__) ({{__name__=~\"{names}\",{}}})",
                role.matchers
            );
            let series = self
                .client
                .query(&query, unix_now())
                .await
                .map_err(unreachable)?;
            let present: BTreeMap<String, u64> = series
                .iter()
                .filter_map(|s| {
                    Some((
                        s.labels.get("__name__")?.clone(),
                        s.points.first()?.1 as u64,
                    ))
                })
                .collect();
            let hints = if self.names.finds_any(&present) {
                Vec::new()
            } else {
                let candidates = self.candidates().await.map_err(unreachable)?;
                preflight::prometheus_hints(role, self.names.server(), &candidates)
            };
            roles.push(RoleFinding {
                role: role.role.clone(),
                place: format!("selector {{{}}}", role.matchers),
                present,
                hints,
            });
        }
        Ok(preflight::Report {
            source: self.source(),
            kind: SourceKind::Prometheus,
            roles,
        })
    }

    /// The targets carrying any server's queue-length series (or the one
    /// `--metric waiting=` names), whatever their labels.
    async fn candidates(&self) -> Result<Vec<Candidate>, QueryError> {
        let mut names: Vec<String> = Server::ALL
            .iter()
            .flat_map(|s| Family::Waiting.default_names(*s))
            .chain(self.names.get(Family::Waiting).iter().cloned())
            .collect();
        names.sort();
        names.dedup();
        let query = format!(
            "count by (__name__, job, namespace, pod, instance) ({{__name__=~\"{}\"}})",
            promql_string(&names.join("|"))
        );
        let series = self.client.query(&query, unix_now()).await?;
        Ok(series
            .into_iter()
            .map(|s| {
                let mut labels = s.labels;
                let metric = labels.remove("__name__").unwrap_or_default();
                Candidate { labels, metric }
            })
            .collect())
    }

    /// Runs one signal's query, trying the family's names in order until one
    /// returns series.
    async fn signal(
        &self,
        spec: &Spec,
        role: &RoleSelector,
        stage: Window,
        breaker: &Breaker,
    ) -> Result<Reading, String> {
        for metric in self.names.get(spec.family) {
            let planned = plan(spec, metric, role, stage);
            let described = |e: QueryError| {
                format!(
                    "{}: {}: {e} (query: {})",
                    role.role,
                    spec.name,
                    planned.query()
                )
            };
            let series = breaker
                .run(self.client.planned(&planned))
                .await
                .map_err(described)?;
            match evaluate(spec, &series).map_err(described)? {
                None => continue,
                Some(Evaluated::Value(v)) => return Ok(Reading::found(v, metric)),
                Some(Evaluated::BeyondLargestBound) => {
                    let bound = self
                        .largest_bound(metric, role, spec.window(stage).end, breaker)
                        .await;
                    return Ok(Reading::Found {
                        value: bound,
                        metric: metric.clone(),
                        lower_bound: true,
                    });
                }
            }
        }
        Ok(Reading::Missing)
    }

    /// The largest finite `le` of a histogram's buckets, for a quantile of
    /// `+Inf`. When the buckets cannot be read, the largest number there is:
    /// still a reading that reaches any threshold, as `+Inf` means.
    async fn largest_bound(
        &self,
        metric: &str,
        role: &RoleSelector,
        time: f64,
        breaker: &Breaker,
    ) -> f64 {
        let query = format!(
            "count by (le) ({})",
            role.series(&format!("{metric}_bucket"))
        );
        let bounds = breaker.run(self.client.query(&query, time)).await;
        let largest = bounds.as_ref().ok().and_then(|series| {
            series
                .iter()
                .filter_map(|s| s.labels.get("le")?.parse::<f64>().ok())
                .filter(|le| le.is_finite())
                .reduce(f64::max)
        });
        largest.unwrap_or_else(|| {
            tracing::warn!(
                "{}: {metric} answered a quantile of +Inf and its bucket bounds could not be read ({}); reading it as the largest number",
                role.role,
                bounds.err().map_or("no finite le".to_string(), |e| e.to_string())
            );
            f64::MAX
        })
    }

    /// Waits (bounded by --settle-wait) until each role's latest waiting
    /// sample is at or after the stage end, so the window is fully ingested.
    ///
    /// Also returns the probe's error when Prometheus could not be reached
    /// at all (timeout or transport failure): querying every signal would
    /// then only wait out the same timeout a few dozen times.
    async fn settle(&self, end: f64) -> (Vec<String>, Option<QueryError>) {
        tokio::time::sleep(self.settle).await;
        if self.settle_wait.is_zero() {
            return (Vec::new(), None);
        }
        let deadline = Instant::now() + self.settle_wait;
        let names = self.names.get(Family::Waiting).join("|");
        let mut errors = Vec::new();
        for role in &self.roles {
            let query = format!(
                "max(timestamp({{__name__=~\"{}\",{}}}))",
                crate::config::promql_string(&names),
                role.matchers
            );
            loop {
                match self.client.query(&query, unix_now()).await {
                    Ok(series) => {
                        let latest = series
                            .iter()
                            .flat_map(|s| s.points.iter().map(|p| p.1))
                            .reduce(f64::max);
                        match latest {
                            None => break, // no series: nothing to wait for
                            Some(t) if t >= end => break,
                            Some(_) => {}
                        }
                    }
                    Err(e @ (QueryError::Timeout(_) | QueryError::Transport { .. })) => {
                        return (errors, Some(e));
                    }
                    Err(e) => {
                        tracing::warn!("settle wait for role {}: {e}", role.role);
                        break;
                    }
                }
                if Instant::now() >= deadline {
                    errors.push(format!(
                        "{}: settle: no sample at or after the stage end within {} (the settle wait); the last seconds may be missing",
                        role.role,
                        humantime::format_duration(self.settle_wait)
                    ));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        (errors, None)
    }

    pub(crate) async fn stage_signals(&self, start: f64, end: f64) -> StageSignals {
        let stage = Window::new(start, end);
        let (mut errors, unreachable) = self.settle(end).await;
        let mut readings: Vec<[Reading; SPECS.len()]> = self
            .roles
            .iter()
            .map(|_| std::array::from_fn(|_| Reading::Failed))
            .collect();
        if let Some(e) = unreachable {
            tracing::warn!("prometheus unreachable, every signal reads 0 for this stage: {e}");
            for role in &self.roles {
                for spec in &SPECS {
                    errors.push(format!("{}: {}: {e} (not queried)", role.role, spec.name));
                }
            }
        } else {
            let breaker = Breaker::new(self.client.timeout);
            let breaker = &breaker;
            let jobs: Vec<(usize, usize)> = (0..self.roles.len())
                .flat_map(|r| (0..SPECS.len()).map(move |s| (r, s)))
                .collect();
            let results: Vec<(usize, usize, Result<Reading, String>)> =
                futures_util::stream::iter(jobs.into_iter().map(|(r, s)| async move {
                    let reading = self.signal(&SPECS[s], &self.roles[r], stage, breaker).await;
                    (r, s, reading)
                }))
                .buffered(MAX_PARALLEL_QUERIES)
                .collect()
                .await;
            for (r, s, result) in results {
                match result {
                    Ok(reading) => readings[r][s] = reading,
                    Err(e) => {
                        tracing::warn!("{e}");
                        errors.push(e);
                    }
                }
            }
        }
        let (roles, coverage) = self
            .roles
            .iter()
            .zip(&readings)
            .map(|(role, r)| spec::role_result(&role.role, r))
            .unzip();
        StageSignals {
            roles,
            errors,
            coverage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times_and_ranges() {
        assert_eq!(format_time(112.0), "112.000");
        assert_eq!(format_time(1_700_000_000.123_4), "1700000000.123");
        assert_eq!(format_range(45.0), "45s");
        assert_eq!(format_range(45.5), "45500ms");
        assert_eq!(format_range(0.0), "1ms");
    }

    #[test]
    fn decodes_envelopes() {
        let ok = br#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"2"],[2,"NaN"]]}]}}"#;
        let s = decode(200, ok).unwrap();
        assert_eq!(s[0].points[0], (1.0, 2.0));
        assert!(s[0].points[1].1.is_nan());
        let err = br#"{"status":"error","errorType":"bad_data","error":"parse error at 1:5"}"#;
        assert_eq!(
            decode(400, err).unwrap_err().to_string(),
            "prometheus: bad_data: parse error at 1:5 (HTTP 400)"
        );
        let html = b"<html><body>502 Bad Gateway</body></html>";
        let e = decode(502, html).unwrap_err().to_string();
        assert!(e.contains("HTTP 502") && e.contains("Bad Gateway"), "{e}");
        let e = decode(200, b"{\"status\":").unwrap_err().to_string();
        assert!(e.contains("malformed"), "{e}");
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[3,"+Inf"]}}"#;
        assert_eq!(decode(200, scalar).unwrap()[0].points[0].1, f64::INFINITY);
    }

    #[test]
    fn evaluate_rules() {
        let waiting = &SPECS[0];
        let s = |pts: &[(f64, f64)]| Series {
            labels: BTreeMap::new(),
            points: pts.to_vec(),
        };
        let value = |v: f64| Some(Evaluated::Value(v));
        assert_eq!(evaluate(waiting, &[]).unwrap(), None);
        // Two series summed per timestamp, then p50.
        let v = evaluate(waiting, &[s(&[(1.0, 1.0), (2.0, 5.0)]), s(&[(1.0, 1.0)])]).unwrap();
        assert_eq!(v, value(3.5));
        assert!(evaluate(waiting, &[s(&[(1.0, f64::NAN)])]).is_err());
        assert!(evaluate(waiting, &[s(&[(1.0, f64::INFINITY)])]).is_err());
        let ttft = &SPECS[1];
        assert_eq!(
            evaluate(ttft, &[s(&[(1.0, f64::NAN)])]).unwrap(),
            value(0.0)
        );
        // A quantile of +Inf is the slowest reading there is, not an error.
        assert_eq!(
            evaluate(ttft, &[s(&[(1.0, f64::INFINITY)])]).unwrap(),
            Some(Evaluated::BeyondLargestBound)
        );
        assert!(evaluate(ttft, &[s(&[(1.0, f64::NEG_INFINITY)])]).is_err());
    }
}
