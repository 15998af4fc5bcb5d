//! The Prometheus source: one PromQL query per signal and role over the
//! stage windows (HTTP API v1), with envelope checks, timeouts, bounded
//! parallelism, metric-name fallbacks, a bounded wait for ingestion, and a
//! check that fails fast once Prometheus stops answering. Before the first
//! stage, one query per role checks which signals its selector finds.
//!
//! [`client`] speaks the HTTP API, [`plan`](mod@plan) turns a signal into PromQL and
//! its answer into a reading, and [`PrometheusSource`] here runs a stage's
//! queries.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::watch;

use crate::config::{RoleSelector, promql_string};
use crate::math::Window;
use crate::preflight::{self, Candidate, RoleFinding, SourceKind};
use crate::profile::{Family, MetricNames, Server};
use crate::spec::{self, ClientEvidence, Reading, SPECS, Spec};
use crate::{SignalError, StageSignals, unix_now};

mod client;
mod plan;

pub(crate) use client::decode;
pub use client::{
    MAX_PARALLEL_QUERIES, MAX_POINTS_PER_SERIES, PromClient, QueryError, Series, format_range,
    format_time,
};
use plan::{Evaluated, evaluate};
pub use plan::{Planned, gauge_query, plan};

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
