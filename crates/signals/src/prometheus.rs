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
use serde::de::IgnoredAny;
use tokio::sync::watch;

use crate::config::{RoleSelector, promql_string};
use crate::http::Tls;
use crate::math::{self, Window};
use crate::preflight::{self, Candidate, RoleFinding, SourceKind};
use crate::profile::{Family, MetricNames, Server};
use crate::spec::{self, ClientEvidence, Reading, SPECS, Spec, Stat};
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
    /// A counter's increase or rate below zero: the store mishandles
    /// counter resets (read as 0, recorded as this fault).
    #[error(
        "prometheus answered a negative counter increase ({0}): the store mishandles counter resets; read as 0"
    )]
    NegativeIncrease(f64),
    /// A series of a range query with more points than Prometheus itself
    /// ever answers: the store ignored the query's step.
    #[error(
        "prometheus answered a series of {points} points, more than the {MAX_POINTS_PER_SERIES} a range query can have (the store ignored the query's step); read none of it"
    )]
    TooManyPoints { points: usize },
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

/// The API envelope, its `data` skipped: read first, so that an error
/// answer is reported as such whatever its `data` holds.
#[derive(Deserialize)]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<IgnoredAny>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

/// The `data` of a successful answer.
#[derive(Deserialize)]
struct Answer {
    data: Data,
}

#[derive(Deserialize)]
#[serde(tag = "resultType", content = "result", rename_all = "lowercase")]
enum Data {
    Matrix(Vec<MatrixItem>),
    Vector(Vec<VectorItem>),
    Scalar((f64, String)),
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
    values: BoundedPoints,
}

/// Most points of one series a range query can answer: Prometheus refuses
/// queries that would give more (its "maximum resolution"). The queries
/// here ask for about 200.
pub const MAX_POINTS_PER_SERIES: usize = 11_000;

/// A series' `[time, "value"]` points: at most [`MAX_POINTS_PER_SERIES`]
/// are kept (the rest are skipped unparsed), `total` counts them all.
struct BoundedPoints {
    kept: Vec<(f64, String)>,
    total: usize,
}

impl<'de> Deserialize<'de> for BoundedPoints {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Points;
        impl<'de> serde::de::Visitor<'de> for Points {
            type Value = BoundedPoints;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of [time, \"value\"] points")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<BoundedPoints, A::Error> {
                let mut kept = Vec::new();
                let mut total = 0;
                loop {
                    let more = if total < MAX_POINTS_PER_SERIES {
                        seq.next_element::<(f64, String)>()?.map(|p| kept.push(p))
                    } else {
                        seq.next_element::<IgnoredAny>()?.map(|_| ())
                    };
                    if more.is_none() {
                        return Ok(BoundedPoints { kept, total });
                    }
                    total += 1;
                }
            }
        }
        d.deserialize_seq(Points)
    }
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
            Ok((status, body))
        };
        // The timeout is Prometheus' to answer in. Decoding (up to 32 MiB of
        // JSON) runs on a blocking thread after it: never on the runtime,
        // where it would hold up the check's other queries until their own
        // timeouts fired on answers that had arrived.
        let (status, body) = match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(QueryError::Timeout(
                    humantime::format_duration(self.timeout).to_string(),
                ));
            }
        };
        tokio::task::spawn_blocking(move || decode(status, &body))
            .await
            .unwrap_or_else(|e| {
                Err(QueryError::Malformed {
                    why: format!("decoding the answer failed: {e}"),
                    excerpt: String::new(),
                })
            })
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
pub(crate) fn decode(status: u16, body: &[u8]) -> Result<Vec<Series>, QueryError> {
    let text = || excerpt(&String::from_utf8_lossy(body));
    // Only an object is an envelope: serde would read a list field by
    // field (`["error"]` as an API error without a message).
    let env = if body.trim_ascii_start().starts_with(b"{") {
        serde_json::from_slice::<Envelope>(body).map_err(|e| e.to_string())
    } else {
        Err("not a JSON object".to_string())
    };
    let env = match env {
        Ok(env) => env,
        Err(why) if (200..300).contains(&status) => {
            return Err(QueryError::Malformed {
                why,
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
    if env.data.is_none() {
        return Err(QueryError::Malformed {
            why: "success without data".into(),
            excerpt: text(),
        });
    }
    let answer: Answer = serde_json::from_slice(body).map_err(|e| QueryError::Malformed {
        why: format!("bad result: {e}"),
        excerpt: text(),
    })?;
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
    let series = |metric, points| Series {
        labels: metric,
        points,
    };
    match answer.data {
        Data::Matrix(items) => items
            .into_iter()
            .map(|i| {
                if i.values.total > MAX_POINTS_PER_SERIES {
                    return Err(QueryError::TooManyPoints {
                        points: i.values.total,
                    });
                }
                Ok(series(i.metric, parse_points(i.values.kept)?))
            })
            .collect(),
        Data::Vector(items) => items
            .into_iter()
            .map(|i| Ok(series(i.metric, parse_points(vec![i.value])?)))
            .collect(),
        Data::Scalar(point) => Ok(vec![series(BTreeMap::new(), parse_points(vec![point])?)]),
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
/// - gauges: a range query `sum|max|min(M{sel} and timestamp(M{sel}) >= W0)`
///   over the steady window (from `W0`), the statistic (p50, max, min) taken
///   here: a point whose latest sample is older than the window (the stage
///   before, through the lookback) is left out, as the scrape source does;
/// - histograms: `histogram_quantile(q, sum by (le) (rate(M_bucket{sel}[W])))`
///   at the end of the steady window, `W` its length;
/// - generation tokens/s: `sum(rate(M{sel}[W]))` at the end of the steady window;
/// - preemptions: `sum(increase(M{sel}[S]))` at the stage end, `S` the stage.
pub fn plan(spec: &Spec, metric: &str, role: &RoleSelector, stage: Window) -> Planned {
    let w = spec.window(stage);
    let range = format_range(w.seconds());
    let gauge = |agg: &str| Planned::Range {
        query: gauge_query(agg, &role.series(metric), w.start),
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

/// `agg` over the points of `series` whose sample was taken at or after
/// `from` (`timestamp()` of a selector is its sample's time, not the
/// evaluation's).
pub fn gauge_query(agg: &str, series: &str, from: f64) -> String {
    format!(
        "{agg}({series} and timestamp({series}) >= {})",
        format_time(from)
    )
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
    /// A latency quantile of NaN at every point: the histogram recorded
    /// nothing in the window (idle, or stalled: see
    /// [`spec::resolve_empty_quantiles`]).
    NoObservations,
}

/// Reduces a query result to the signal value. `Ok(None)`: no series.
///
/// Linear in the number of points (they are grouped by timestamp through a
/// sort), so that an oversized answer costs its parsing, not its square.
fn evaluate(spec: &Spec, series: &[Series]) -> Result<Option<Evaluated>, QueryError> {
    if series.is_empty() {
        return Ok(None);
    }
    let mut points: Vec<(f64, f64)> =
        Vec::with_capacity(series.iter().map(|s| s.points.len()).sum());
    for s in series {
        for &(t, v) in &s.points {
            if let Quantile(_) = spec.stat {
                // histogram_quantile gives NaN when there were no observations.
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
            if v < 0.0 && matches!(spec.stat, Stat::StageIncrease | Stat::RatePerSecond) {
                // increase() and rate() of a counter cannot be negative: the
                // store mishandles counter resets. Read as 0 would hide a
                // rule's input behind a plausible number; fail it instead.
                return Err(QueryError::NegativeIncrease(v));
            }
            points.push((t, v));
        }
    }
    if points.is_empty() && matches!(spec.stat, Quantile(_)) {
        return Ok(Some(Evaluated::NoObservations));
    }
    // Combine series per timestamp (the queries aggregate to one series, but
    // a custom selector or a federated setup may still return several).
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut values: Vec<f64> = Vec::new();
    let mut last_time = None;
    for (t, v) in points {
        match values.last_mut() {
            Some(acc) if last_time == Some(t) => {
                *acc = match spec.stat {
                    Stat::Max | Quantile(_) => acc.max(v),
                    Stat::Min => acc.min(v),
                    _ => *acc + v,
                }
            }
            _ => values.push(v),
        }
        last_time = Some(t);
    }
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
                Some(Evaluated::NoObservations) => {
                    return Ok(Reading::NoObservations {
                        metric: metric.clone(),
                    });
                }
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

    pub(crate) async fn stage_signals(
        &self,
        start: f64,
        end: f64,
        client: ClientEvidence,
    ) -> StageSignals {
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
                    // Said once, by whoever judges the stage, with its label.
                    Err(e) => errors.push(e),
                }
            }
        }
        for r in &mut readings {
            spec::resolve_empty_quantiles(r, stage, client);
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
        let e = decode(200, br#"{"status":"success"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("success without data"), "{e}");
        let e = decode(
            200,
            br#"{"status":"success","data":{"resultType":"string","result":[1,"x"]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("malformed") && e.contains("string"), "{e}");
        // An error answer is reported as such whatever its data holds.
        let e = decode(
            422,
            br#"{"status":"error","errorType":"execution","error":"too many samples","data":7}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "prometheus: execution: too many samples (HTTP 422)");
    }

    /// Found by the `prometheus_response` fuzz target: a JSON list is no
    /// envelope, whatever the status (serde read `["[",0]` field by field,
    /// as an API error without a message).
    #[test]
    fn a_json_list_is_no_envelope() {
        let e = decode(200, br#"["[",0]"#).unwrap_err().to_string();
        assert!(e.contains("malformed response (not a JSON object)"), "{e}");
        let e = decode(502, br#"["error","x"]"#).unwrap_err().to_string();
        assert!(
            e.contains("HTTP 502 with a non-API body: [\"error\",\"x\"]"),
            "{e}"
        );
    }

    /// A range-query series longer than Prometheus ever answers is refused
    /// (its points past the limit are skipped unparsed), saying how long.
    #[test]
    fn a_series_beyond_the_resolution_limit_is_refused() {
        let answer = |n: usize| {
            let points: Vec<String> = (0..n).map(|i| format!("[{i},\"1\"]")).collect();
            format!(
                r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{}]}}]}}}}"#,
                points.join(",")
            )
        };
        let ok = decode(200, answer(MAX_POINTS_PER_SERIES).as_bytes()).unwrap();
        assert_eq!(ok[0].points.len(), MAX_POINTS_PER_SERIES);
        let e = decode(200, answer(400_000).as_bytes()).unwrap_err();
        assert_eq!(e, QueryError::TooManyPoints { points: 400_000 });
        assert!(e.to_string().contains("400000 points"), "{e}");
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
        // NaN at every point: the histogram recorded nothing in the window.
        assert_eq!(
            evaluate(ttft, &[s(&[(1.0, f64::NAN), (2.0, f64::NAN)])]).unwrap(),
            Some(Evaluated::NoObservations)
        );
        assert_eq!(
            evaluate(ttft, &[s(&[(1.0, f64::NAN), (2.0, 0.5)])]).unwrap(),
            value(0.5)
        );
        // A counter's increase below zero is a fault of the store, not a 0.
        let preemptions = &SPECS[3];
        assert_eq!(
            evaluate(preemptions, &[s(&[(1.0, -40.0)])]).unwrap_err(),
            QueryError::NegativeIncrease(-40.0)
        );
        assert_eq!(
            evaluate(preemptions, &[s(&[(1.0, 0.0)])]).unwrap(),
            value(0.0)
        );
        // Series summed per timestamp, whatever order the points come in.
        let v = evaluate(
            preemptions,
            &[s(&[(2.0, 1.0), (1.0, 3.0)]), s(&[(2.0, 4.0)])],
        );
        assert_eq!(v.unwrap(), value(5.0));
        // A quantile of +Inf is the slowest reading there is, not an error.
        assert_eq!(
            evaluate(ttft, &[s(&[(1.0, f64::INFINITY)])]).unwrap(),
            Some(Evaluated::BeyondLargestBound)
        );
        assert!(evaluate(ttft, &[s(&[(1.0, f64::NEG_INFINITY)])]).is_err());
    }
}
