//! The direct-scrape source: samples each server's `/metrics` on an interval
//! in the background, keeps a bounded history of the few figures the signals
//! need, and computes the per-role signals of a stage from it the way
//! Prometheus would (same windows, same evaluation grid, same quantiles).
//! Before the first stage, one scrape of each URL checks which signals it
//! serves.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::task::JoinHandle;

use crate::config::ScrapeTarget;
use crate::exposition;
use crate::math::{self, Bucket, Window};
use crate::preflight::{self, RoleFinding, SourceKind};
use crate::profile::{Family, MetricNames};
use crate::spec::{self, ClientEvidence, Reading, SPECS, Stat};
use crate::{SignalError, StageSignals, unix_now};

/// At most this many samples are kept per URL (the oldest are dropped), so a
/// long run has bounded memory: 6 h at the default 1 s interval, ~0.5 KB each.
pub const MAX_SAMPLES_PER_URL: usize = 21_600;
/// Failed scrapes remembered per URL.
const MAX_FAILURES_PER_URL: usize = 1_000;
/// Largest `/metrics` body read (vLLM's is ~60 KB).
const MAX_BODY_BYTES: usize = 16 << 20;

/// What one scrape of one pod contributed: per family, the series of the
/// first configured name present, reduced across the pod's series (engines).
#[derive(Debug, Clone, Default)]
pub(crate) struct PodSample {
    /// Unix seconds when the response was received.
    pub t: f64,
    /// Per gauge/counter family: (sum, max, min) across the pod's series.
    pub scalars: [Option<(f64, f64, f64)>; Family::ALL.len()],
    /// Per histogram family: cumulative buckets summed by bound.
    pub histograms: [Option<Vec<Bucket>>; Family::ALL.len()],
    /// Per family: the position, in the family's names, of the name read.
    pub matched: [Option<usize>; Family::ALL.len()],
}

fn family_index(f: Family) -> usize {
    Family::ALL.iter().position(|x| *x == f).unwrap_or(0)
}

/// Reduces a parsed body to a [`PodSample`].
pub(crate) fn reduce(t: f64, parsed: &exposition::Parsed, names: &MetricNames) -> PodSample {
    let mut out = PodSample {
        t,
        ..Default::default()
    };
    for family in Family::ALL {
        let i = family_index(family);
        for (position, name) in names.get(family).iter().enumerate() {
            if family.is_histogram() {
                let bucket_name = format!("{name}_bucket");
                let mut buckets: Vec<Bucket> = Vec::new();
                for s in parsed.samples.iter().filter(|s| s.name == bucket_name) {
                    let Some(le) = s.label("le").and_then(|v| v.parse::<f64>().ok()) else {
                        continue;
                    };
                    match buckets.iter_mut().find(|b| b.upper_bound == le) {
                        Some(b) => b.count += s.value,
                        None => buckets.push(Bucket {
                            upper_bound: le,
                            count: s.value,
                        }),
                    }
                }
                if !buckets.is_empty() {
                    buckets.sort_by(|a, b| a.upper_bound.total_cmp(&b.upper_bound));
                    out.histograms[i] = Some(buckets);
                    out.matched[i] = Some(position);
                    break;
                }
            } else {
                let mut agg: Option<(f64, f64, f64)> = None;
                for s in parsed.samples.iter().filter(|s| &s.name == name) {
                    let v = s.value;
                    agg = Some(match agg {
                        None => (v, v, v),
                        Some((sum, max, min)) => (sum + v, max.max(v), min.min(v)),
                    });
                }
                if agg.is_some() {
                    out.scalars[i] = agg;
                    out.matched[i] = Some(position);
                    break;
                }
            }
        }
    }
    out
}

/// The history of one URL.
#[derive(Debug, Default)]
struct UrlState {
    samples: VecDeque<PodSample>,
    /// (unix seconds, message) of failed scrapes.
    failures: VecDeque<(f64, String)>,
    /// Unix seconds at which the latest attempt (ok or not) finished.
    last_attempt: f64,
}

/// The scrape source.
pub(crate) struct ScrapeSource {
    targets: Vec<ScrapeTarget>,
    /// Roles in canonical order, each with the indexes of its targets.
    roles: Vec<(String, Vec<usize>)>,
    names: Arc<MetricNames>,
    interval: Duration,
    timeout: Duration,
    settle: Duration,
    settle_wait: Duration,
    http: reqwest::Client,
    state: Arc<Vec<Mutex<UrlState>>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// A short, single-line description of a request failure.
pub(crate) fn describe_reqwest_error(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("no answer within {}", humantime::format_duration(timeout));
    }
    // The top-level text repeats the whole URL; the causes say what happened.
    let mut src = std::error::Error::source(e);
    let mut msg = match src {
        Some(s) => {
            src = s.source();
            s.to_string()
        }
        None => e.to_string(),
    };
    while let Some(s) = src {
        let s_msg = s.to_string();
        if !msg.contains(&s_msg) {
            msg.push_str(": ");
            msg.push_str(&s_msg);
        }
        src = s.source();
    }
    msg
}

impl ScrapeSource {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        targets: Vec<ScrapeTarget>,
        names: MetricNames,
        interval: Duration,
        timeout: Duration,
        settle: Duration,
        settle_wait: Duration,
        http: reqwest::Client,
    ) -> Self {
        let mut roles: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, t) in targets.iter().enumerate() {
            match roles.iter_mut().find(|(r, _)| *r == t.role) {
                Some((_, idx)) => idx.push(i),
                None => roles.push((t.role.clone(), vec![i])),
            }
        }
        roles.sort_by_key(|(r, _)| match r.as_str() {
            "prefill" => 0,
            "decode" => 1,
            "aggregate" => 2,
            _ => 3,
        });
        let state = Arc::new(targets.iter().map(|_| Mutex::default()).collect());
        Self {
            targets,
            roles,
            names: Arc::new(names),
            interval,
            timeout,
            settle,
            settle_wait,
            http,
            state,
            task: Mutex::new(None),
        }
    }

    /// The URLs of `role`.
    pub(crate) fn urls(&self, role: &str) -> Vec<&str> {
        self.targets
            .iter()
            .filter(|t| t.role == role)
            .map(|t| t.url.as_str())
            .collect()
    }

    pub(crate) fn names(&self) -> &MetricNames {
        &self.names
    }

    /// One scrape of every URL: which of the profile's series each role's
    /// URLs serve. A URL that cannot be scraped fails the whole check.
    pub(crate) async fn preflight(&self) -> Result<preflight::Report, SignalError> {
        let bodies = join_all(
            self.targets
                .iter()
                .map(|t| fetch(&self.http, &t.url, self.timeout)),
        )
        .await;
        let mut series_names: Vec<BTreeMap<String, u64>> = Vec::new();
        for (target, body) in self.targets.iter().zip(bodies) {
            let body = body.map_err(|why| SignalError::Unreachable {
                from: target.url.clone(),
                why,
                kind: SourceKind::Scrape,
            })?;
            let mut names = BTreeMap::new();
            for sample in exposition::parse(&body).samples {
                *names.entry(sample.name).or_insert(0) += 1;
            }
            series_names.push(names);
        }
        let roles = self
            .roles
            .iter()
            .map(|(role, idx)| {
                let mut present = BTreeMap::new();
                for &i in idx {
                    for (name, count) in &series_names[i] {
                        *present.entry(name.clone()).or_insert(0) += count;
                    }
                }
                let hints = if self.names.finds_any(&present) {
                    Vec::new()
                } else {
                    idx.iter()
                        .map(|&i| {
                            preflight::scrape_hint(
                                &self.targets[i].url,
                                self.names.server(),
                                &series_names[i],
                            )
                        })
                        .collect()
                };
                RoleFinding {
                    role: role.clone(),
                    place: self.urls(role).join(" "),
                    present,
                    hints,
                }
            })
            .collect();
        Ok(preflight::Report {
            source: "the scraped metrics".to_string(),
            kind: SourceKind::Scrape,
            roles,
        })
    }

    pub(crate) fn roles(&self) -> Vec<String> {
        self.roles.iter().map(|(r, _)| r.clone()).collect()
    }

    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    /// Starts the background sampler (idempotent). Needs a tokio runtime.
    pub(crate) fn start(&self) {
        let Ok(mut task) = self.task.lock() else {
            return;
        };
        if task.is_some() {
            return;
        }
        let urls: Vec<String> = self.targets.iter().map(|t| t.url.clone()).collect();
        let state = Arc::clone(&self.state);
        let names = Arc::clone(&self.names);
        let http = self.http.clone();
        let (interval, timeout) = (self.interval, self.timeout);
        *task = Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                join_all(
                    urls.iter()
                        .enumerate()
                        .map(|(i, url)| scrape_once(&http, url, timeout, &names, &state[i])),
                )
                .await;
            }
        }));
    }

    /// Waits (bounded) until every URL has been attempted after `end`.
    async fn settle(&self, end: f64) {
        tokio::time::sleep(self.settle).await;
        let started = self.task.lock().map(|t| t.is_some()).unwrap_or(false);
        if !started {
            return;
        }
        let deadline = Instant::now() + self.settle_wait;
        loop {
            let done = self
                .state
                .iter()
                .all(|s| s.lock().map(|s| s.last_attempt >= end).unwrap_or(true));
            if done || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn stage_signals(
        &self,
        start: f64,
        end: f64,
        client: ClientEvidence,
    ) -> StageSignals {
        self.settle(end).await;
        let stage = Window::new(start, end);
        let mut out = StageSignals::default();
        let started = self.task.lock().map(|t| t.is_some()).unwrap_or(false);
        if !started {
            out.errors.push(
                "scrape: the sampler was never started (call SignalSource::start before the stage)"
                    .to_string(),
            );
        }
        for (role, idx) in &self.roles {
            // Copy the role's histories out of the locks, trimmed to the stage.
            let mut pods: Vec<Vec<PodSample>> = Vec::new();
            let errors_before = out.errors.len();
            for &i in idx {
                let Ok(st) = self.state[i].lock() else {
                    continue;
                };
                let first = st.samples.partition_point(|s| s.t < start);
                pods.push(
                    st.samples
                        .iter()
                        .skip(first)
                        .take_while(|s| s.t <= end)
                        .cloned()
                        .collect(),
                );
                let failed: Vec<&(f64, String)> = st
                    .failures
                    .iter()
                    .filter(|(t, _)| *t >= start && *t <= end)
                    .collect();
                if let Some((_, last)) = failed.last() {
                    out.errors.push(format!(
                        "{role}: all signals: scrape of {} failed {} time(s) during the stage, last: {last}",
                        self.targets[i].url,
                        failed.len()
                    ));
                } else if pods.last().is_none_or(|p| p.iter().all(|s| s.t < start)) && started {
                    out.errors.push(format!(
                        "{role}: all signals: no sample of {} during the stage",
                        self.targets[i].url
                    ));
                }
            }
            let mut readings = compute_readings(&pods, stage, self.interval, &self.names);
            spec::resolve_empty_quantiles(&mut readings, stage, client);
            if out.errors.len() > errors_before || !started {
                // Nothing read because the scrapes failed: not an absence.
                for reading in &mut readings {
                    if *reading == Reading::Missing {
                        *reading = Reading::Failed;
                    }
                }
            }
            let (signals, coverage) = spec::role_result(role, &readings);
            out.roles.push(signals);
            out.coverage.push(coverage);
        }
        out
    }
}

impl Drop for ScrapeSource {
    fn drop(&mut self) {
        if let Ok(mut task) = self.task.lock()
            && let Some(t) = task.take()
        {
            t.abort();
        }
    }
}

async fn scrape_once(
    http: &reqwest::Client,
    url: &str,
    timeout: Duration,
    names: &MetricNames,
    state: &Mutex<UrlState>,
) {
    let result = fetch(http, url, timeout).await;
    let t = unix_now();
    let Ok(mut st) = state.lock() else { return };
    st.last_attempt = t;
    match result {
        Ok(body) => {
            let parsed = exposition::parse(&body);
            if let Some(e) = &parsed.first_error {
                tracing::debug!(url, skipped = parsed.skipped_lines, "scrape: {e}");
            }
            if st.samples.len() >= MAX_SAMPLES_PER_URL {
                st.samples.pop_front();
            }
            st.samples.push_back(reduce(t, &parsed, names));
        }
        Err(e) => {
            tracing::debug!(url, "scrape failed: {e}");
            if st.failures.len() >= MAX_FAILURES_PER_URL {
                st.failures.pop_front();
            }
            st.failures.push_back((t, e));
        }
    }
}

pub(crate) async fn fetch(
    http: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> Result<String, String> {
    let fut = async {
        let mut resp = http
            .get(url)
            .header("Accept", "text/plain;version=0.0.4")
            .send()
            .await
            .map_err(|e| describe_reqwest_error(&e, timeout))?;
        let status = resp.status();
        let mut body: Vec<u8> = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| describe_reqwest_error(&e, timeout))?
        {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(format!("body larger than {MAX_BODY_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            return Err(format!("HTTP {status}: {}", crate::excerpt(&text)));
        }
        Ok(text)
    };
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            ))
        })
}

/// How long a pod's last sample stands for its value at a later time (like
/// Prometheus' lookback): three intervals, at least 5 s.
fn lookback(interval: Duration) -> f64 {
    (3.0 * interval.as_secs_f64()).max(5.0)
}

/// The latest sample of `pod` at or before `t`, within the lookback and
/// taken at or after `from`: a window's value at `t` never comes from before
/// the window (the stage before it, however recent the sample).
fn at(pod: &[PodSample], t: f64, lookback: f64, from: f64) -> Option<&PodSample> {
    let i = pod.partition_point(|s| s.t <= t);
    let s = pod.get(i.checked_sub(1)?)?;
    (t - s.t <= lookback && s.t >= from).then_some(s)
}

/// Computes one role's readings (one per entry of [`SPECS`]) from its pods'
/// samples.
pub(crate) fn compute_readings(
    pods: &[Vec<PodSample>],
    stage: Window,
    interval: Duration,
    names: &MetricNames,
) -> [Reading; SPECS.len()] {
    let lb = lookback(interval);
    std::array::from_fn(|k| {
        let spec = &SPECS[k];
        let window = spec.window(stage);
        let fi = family_index(spec.family);
        let mut lower_bound = false;
        let mut no_observations = false;
        let v = match spec.stat {
            Stat::P50OfSum | Stat::Max | Stat::Min => {
                // Evaluate on the same grid a range query would use.
                let mut points = Vec::new();
                for t in spec::grid(window) {
                    let vals: Vec<(f64, f64, f64)> = pods
                        .iter()
                        .filter_map(|p| at(p, t, lb, window.start).and_then(|s| s.scalars[fi]))
                        .collect();
                    if vals.is_empty() {
                        continue;
                    }
                    points.push(match spec.stat {
                        Stat::P50OfSum => vals.iter().map(|v| v.0).sum(),
                        Stat::Max => vals.iter().map(|v| v.1).fold(f64::NEG_INFINITY, f64::max),
                        _ => vals.iter().map(|v| v.2).fold(f64::INFINITY, f64::min),
                    });
                }
                match spec.stat {
                    Stat::P50OfSum => math::quantile(&points, 0.5),
                    Stat::Max => points.iter().copied().reduce(f64::max),
                    _ => points.iter().copied().reduce(f64::min),
                }
            }
            Stat::Quantile(q) => {
                let mut all: Vec<Bucket> = Vec::new();
                for pod in pods {
                    all.extend(bucket_increase(pod, window, fi));
                }
                if all.is_empty() {
                    None
                } else if all.iter().all(|b| b.count == 0.0) {
                    // Series, but not one observation in the window.
                    no_observations = true;
                    None
                } else {
                    let (value, bound) = math::histogram_quantile_with_bound(q, &all);
                    lower_bound = bound;
                    Some(value)
                }
            }
            Stat::RatePerSecond => {
                let mut total = None;
                for pod in pods {
                    let span = bounded(pod, window);
                    if span.len() < 2 {
                        continue;
                    }
                    let secs = span[span.len() - 1].t - span[0].t;
                    let vals: Vec<f64> = span
                        .iter()
                        .filter_map(|s| s.scalars[fi].map(|v| v.0))
                        .collect();
                    if secs > 0.0 && vals.len() >= 2 {
                        *total.get_or_insert(0.0) += math::counter_increase(&vals) / secs;
                    }
                }
                total
            }
            Stat::StageIncrease => {
                let mut total = None;
                for pod in pods {
                    let vals: Vec<f64> = bounded(pod, window)
                        .iter()
                        .filter_map(|s| s.scalars[fi].map(|v| v.0))
                        .collect();
                    if vals.len() >= 2 {
                        *total.get_or_insert(0.0) += math::counter_increase(&vals);
                    }
                }
                total
            }
        };
        // Infinities read as zero (Reading::value).
        let metric = || matched_name(pods, window, spec.family, names).unwrap_or_default();
        match v {
            Some(value) => Reading::Found {
                value,
                metric: metric(),
                lower_bound,
            },
            None if no_observations => Reading::NoObservations { metric: metric() },
            None => Reading::Missing,
        }
    })
}

/// The name a family was read from in `window`, from the first pod that has it.
fn matched_name(
    pods: &[Vec<PodSample>],
    window: Window,
    family: Family,
    names: &MetricNames,
) -> Option<String> {
    let fi = family_index(family);
    pods.iter()
        .flat_map(|pod| bounded(pod, window))
        .find_map(|s| s.matched[fi])
        .and_then(|position| names.get(family).get(position).cloned())
}

/// The samples taken in `window`: a counter's increase over it runs from
/// its first sample inside, as Prometheus' `increase()` does, so that what
/// the stage before counted is never charged to it.
fn bounded(pod: &[PodSample], window: Window) -> &[PodSample] {
    let first = pod.partition_point(|s| s.t < window.start);
    let last = pod.partition_point(|s| s.t <= window.end);
    if first >= last {
        return &[];
    }
    &pod[first..last]
}

/// Per-bound increase of a pod's histogram over the window, with counter
/// reset handling per bucket.
fn bucket_increase(pod: &[PodSample], window: Window, fi: usize) -> Vec<Bucket> {
    let span: Vec<&Vec<Bucket>> = bounded(pod, window)
        .iter()
        .filter_map(|s| s.histograms[fi].as_ref())
        .collect();
    if span.len() < 2 {
        return Vec::new();
    }
    let Some(last) = span.last() else {
        return Vec::new();
    };
    last.iter()
        .map(|b| {
            let series: Vec<f64> = span
                .iter()
                .filter_map(|h| h.iter().find(|x| x.upper_bound == b.upper_bound))
                .map(|x| x.count)
                .collect();
            Bucket {
                upper_bound: b.upper_bound,
                count: math::counter_increase(&series),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(waiting: f64, kv: f64, preempt: f64, ttft: &[(f64, f64)]) -> String {
        let mut s = format!(
            "vllm:num_requests_waiting{{engine=\"0\"}} {waiting}\n\
             vllm:num_requests_waiting{{engine=\"1\"}} 1\n\
             vllm:kv_cache_usage_perc{{engine=\"0\"}} {kv}\n\
             vllm:num_preemptions_total{{engine=\"0\"}} {preempt}\n"
        );
        for (le, c) in ttft {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                format!("{le}")
            };
            s.push_str(&format!(
                "vllm:time_to_first_token_seconds_bucket{{le=\"{le}\"}} {c}\n"
            ));
        }
        s
    }

    fn sample(t: f64, text: &str) -> PodSample {
        reduce(t, &exposition::parse(text), &MetricNames::default())
    }

    fn compute_role(
        role: &str,
        pods: &[Vec<PodSample>],
        stage: Window,
        interval: Duration,
    ) -> nyann_model::RoleSignals {
        let readings = compute_readings(pods, stage, interval, &MetricNames::default());
        spec::role_result(role, &readings).0
    }

    #[test]
    fn reduce_sums_engines_and_falls_back() {
        let s = sample(
            1.0,
            &body(2.0, 0.5, 3.0, &[(0.1, 1.0), (f64::INFINITY, 2.0)]),
        );
        let w = s.scalars[family_index(Family::Waiting)].unwrap();
        assert_eq!(w, (3.0, 2.0, 1.0));
        let h = s.histograms[family_index(Family::Ttft)].as_ref().unwrap();
        assert_eq!(h.len(), 2);
        // Fallback to the old KV name and the underscore spelling.
        let s = sample(
            1.0,
            "vllm:gpu_cache_usage_perc 0.7\nvllm_num_requests_waiting 4\n",
        );
        assert_eq!(
            s.scalars[family_index(Family::KvCacheUsage)].unwrap().1,
            0.7
        );
        assert_eq!(s.scalars[family_index(Family::Waiting)].unwrap().0, 4.0);
    }

    #[test]
    fn computes_exact_signals_from_samples() {
        // Stage 100..160, steady 112..157. One sample per second.
        let mut pod = Vec::new();
        for t in 95..=161 {
            let t = t as f64;
            // waiting: 10 inside the steady window, 100 outside it.
            let waiting = if (112.0..=157.0).contains(&t) {
                9.0
            } else {
                99.0
            };
            let kv = if t == 130.0 { 0.9 } else { 0.2 };
            // preemption counter resets at 150 (restart), +1 per second otherwise.
            let pre = if t < 150.0 { t - 95.0 } else { t - 150.0 };
            // TTFT: every second one observation <= 0.1, and from 112 on one in (1, 2.5].
            let fast = t - 95.0;
            let slow = (t - 112.0).max(0.0);
            let ttft = [
                (0.1, fast),
                (1.0, fast),
                (2.5, fast + slow),
                (f64::INFINITY, fast + slow),
            ];
            pod.push(sample(t, &body(waiting, kv, pre, &ttft)));
        }
        let r = compute_role(
            "aggregate",
            &[pod],
            Window::new(100.0, 160.0),
            Duration::from_secs(1),
        );
        assert_eq!(r.waiting_requests_p50, 10.0); // 9 + engine 1's 1
        assert_eq!(r.kv_cache_usage_max, 0.9);
        assert_eq!(r.extra("kv_cache_usage_min"), Some(0.2));
        // 100..149 = 49 (baseline 100 -> 149), then reset: 150..160 -> 0..10 = 10.
        assert_eq!(r.preemptions, 59.0);
        // Window 112..157: 45 fast + 45 slow; p99 rank 89.1 in (1, 2.5]: 1 + 1.5*(44.1/45).
        let expected = 1.0 + 1.5 * (44.1 / 45.0);
        assert!(
            (r.ttft_p99_seconds - expected).abs() < 1e-9,
            "{}",
            r.ttft_p99_seconds
        );
        // p50 rank 45 -> reaches the 0.1 bucket exactly: 0.1.
        assert_eq!(r.extra("ttft_p50_seconds"), Some(0.1));
        // Missing families read 0.
        assert_eq!(r.extra("itl_p99_seconds"), Some(0.0));
        assert_eq!(r.extra("running_requests_p50"), Some(0.0));
    }

    /// A short stage right after a congested one (its queue, its full KV
    /// cache, its last preemptions): samples taken before the stage started
    /// are not the stage's, however recent; a counter's baseline is the
    /// stage's first sample.
    #[test]
    fn a_stage_is_not_charged_with_the_samples_before_its_start() {
        let ttft = [(0.1, 10.0), (f64::INFINITY, 10.0)];
        // The congested stage's last sample, then the new stage's, 1 s apart.
        let mut pod = vec![sample(9.5, &body(40.0, 1.0, 40.0, &ttft))];
        for t in [10.5, 11.5, 12.5, 13.5] {
            pod.push(sample(t, &body(0.0, 0.3, 50.0, &ttft)));
        }
        // 4 s: too short for a steady window, so the whole stage is read.
        let r = compute_role(
            "aggregate",
            &[pod],
            Window::new(10.0, 14.0),
            Duration::from_secs(1),
        );
        assert_eq!(r.kv_cache_usage_max, 0.3);
        assert_eq!(r.preemptions, 0.0);
        assert_eq!(r.waiting_requests_p50, 1.0); // engine 1's 1
    }

    #[test]
    fn pods_are_summed_and_maxed() {
        let mk = |w: f64, kv: f64| -> Vec<PodSample> {
            (0..=30)
                .map(|t| sample(t as f64, &body(w, kv, 0.0, &[])))
                .collect()
        };
        let r = compute_role(
            "decode",
            &[mk(4.0, 0.3), mk(6.0, 0.8)],
            Window::new(0.0, 30.0),
            Duration::from_secs(1),
        );
        assert_eq!(r.waiting_requests_p50, 12.0); // (4+1) + (6+1)
        assert_eq!(r.kv_cache_usage_max, 0.8);
        assert_eq!(r.extra("kv_cache_usage_min"), Some(0.3));
        assert_eq!(r.ttft_p99_seconds, 0.0);
        assert_eq!(r.preemptions, 0.0);
    }

    /// A TTFT histogram that does not move over the window recorded nothing:
    /// idle with nothing waiting, a stall (TTFT >= the window) with 50 waiting.
    #[test]
    fn a_histogram_without_observations_is_idle_or_a_stall() {
        let stage = Window::new(0.0, 30.0);
        let pod = |waiting: f64| -> Vec<PodSample> {
            let ttft = [(0.1, 7.0), (f64::INFINITY, 7.0)];
            (0..=30)
                .map(|t| sample(t as f64, &body(waiting, 0.5, 0.0, &ttft)))
                .collect()
        };
        let interval = Duration::from_secs(1);
        let names = MetricNames::default();
        // `body` adds an engine with 1 waiting: -1 makes the sum 0.
        let mut idle = compute_readings(&[pod(-1.0)], stage, interval, &names);
        assert_eq!(
            idle[1],
            Reading::NoObservations {
                metric: "vllm:time_to_first_token_seconds".into()
            }
        );
        spec::resolve_empty_quantiles(&mut idle, stage, ClientEvidence::default());
        assert_eq!(idle[1].value(), 0.0);
        let mut stalled = compute_readings(&[pod(49.0)], stage, interval, &names);
        spec::resolve_empty_quantiles(&mut stalled, stage, ClientEvidence::default());
        // The steady window of a 30 s stage: 6..28.5 s.
        assert_eq!(
            stalled[1],
            Reading::Found {
                value: 22.5,
                metric: "vllm:time_to_first_token_seconds".into(),
                lower_bound: true,
            }
        );
    }

    #[test]
    fn no_samples_gives_zero_signals_recorded_as_missing() {
        let readings = compute_readings(
            &[vec![]],
            Window::new(0.0, 10.0),
            Duration::from_secs(1),
            &MetricNames::default(),
        );
        assert!(
            readings.iter().all(|r| *r == Reading::Missing),
            "{readings:?}"
        );
    }

    #[test]
    fn readings_name_the_metric_and_mark_a_quantile_beyond_the_buckets() {
        // TTFT: every observation above the largest finite bound (2.5 here).
        let pod: Vec<PodSample> = (0..=30)
            .map(|t| {
                let n = t as f64;
                let text = format!(
                    "vllm:gpu_cache_usage_perc 0.5\n\
                     vllm:time_to_first_token_seconds_bucket{{le=\"1.0\"}} 0\n\
                     vllm:time_to_first_token_seconds_bucket{{le=\"2.5\"}} 0\n\
                     vllm:time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {n}\n"
                );
                sample(n, &text)
            })
            .collect();
        let readings = compute_readings(
            &[pod],
            Window::new(0.0, 30.0),
            Duration::from_secs(1),
            &MetricNames::default(),
        );
        assert_eq!(
            readings[1],
            Reading::Found {
                value: 2.5,
                metric: "vllm:time_to_first_token_seconds".into(),
                lower_bound: true,
            }
        );
        assert_eq!(
            readings[2],
            Reading::found(0.5, "vllm:gpu_cache_usage_perc")
        );
        assert_eq!(readings[0], Reading::Missing);
        assert_eq!(readings[3], Reading::Missing);
    }
}
