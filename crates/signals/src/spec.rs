//! The list of per-role signals, how each is computed, and how the computed
//! readings become a [`RoleSignals`] and its [`RoleCoverage`]. Both sources
//! walk this one table, so they cannot drift apart on which figures exist or
//! over which window.

use nyann_model::{RoleCoverage, RoleSignals, SeriesStatus, SignalCoverage};

use crate::math::Window;
use crate::profile::Family;

/// How a signal reduces its metric over a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stat {
    /// Sum across pods at each sample time, then p50 over the steady window.
    P50OfSum,
    /// Max across pods and the steady window.
    Max,
    /// Min across pods and the steady window.
    Min,
    /// `histogram_quantile(q)` of the bucket increases over the steady window,
    /// summed across pods.
    Quantile(f64),
    /// Counter increase per second over the steady window, summed across pods.
    RatePerSecond,
    /// Counter increase over the whole stage, summed across pods.
    StageIncrease,
}

/// One signal of a role.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The field of [`RoleSignals`] or the `extra` key.
    pub name: &'static str,
    pub family: Family,
    pub stat: Stat,
}

/// Every signal, the four policy inputs first, then the extras in the order
/// they appear in `RoleSignals::extra`.
pub const SPECS: [Spec; 10] = [
    Spec {
        name: "waiting_requests_p50",
        family: Family::Waiting,
        stat: Stat::P50OfSum,
    },
    Spec {
        name: "ttft_p99_seconds",
        family: Family::Ttft,
        stat: Stat::Quantile(0.99),
    },
    Spec {
        name: "kv_cache_usage_max",
        family: Family::KvCacheUsage,
        stat: Stat::Max,
    },
    Spec {
        name: "preemptions",
        family: Family::Preemptions,
        stat: Stat::StageIncrease,
    },
    Spec {
        name: "ttft_p50_seconds",
        family: Family::Ttft,
        stat: Stat::Quantile(0.5),
    },
    Spec {
        name: "itl_p50_seconds",
        family: Family::Itl,
        stat: Stat::Quantile(0.5),
    },
    Spec {
        name: "itl_p99_seconds",
        family: Family::Itl,
        stat: Stat::Quantile(0.99),
    },
    Spec {
        name: "generation_tokens_per_second",
        family: Family::GenerationTokens,
        stat: Stat::RatePerSecond,
    },
    Spec {
        name: "kv_cache_usage_min",
        family: Family::KvCacheUsage,
        stat: Stat::Min,
    },
    Spec {
        name: "running_requests_p50",
        family: Family::Running,
        stat: Stat::P50OfSum,
    },
];

impl Spec {
    /// The window this signal is computed over.
    pub fn window(&self, stage: Window) -> Window {
        match self.stat {
            Stat::StageIncrease => stage,
            _ => Window::steady(stage),
        }
    }
}

/// What computing one signal of one role gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// Computed from the series of `metric`. `lower_bound`: a quantile
    /// beyond the histogram's largest finite bound, read as that bound.
    Found {
        value: f64,
        metric: String,
        lower_bound: bool,
    },
    /// No series of any name of the signal's family: reads 0.
    Missing,
    /// A latency quantile whose histogram (of `metric`) recorded nothing in
    /// the window: an idle server, or one so stalled that nothing came out.
    /// [`resolve_empty_quantiles`] tells the two apart; what stays idle
    /// reads 0 and is recorded as no data.
    NoObservations { metric: String },
    /// The query or scrape failed (its error is recorded apart): reads 0.
    Failed,
}

impl Reading {
    /// A plain value read from `metric`.
    pub fn found(value: f64, metric: &str) -> Reading {
        Reading::Found {
            value,
            metric: metric.to_string(),
            lower_bound: false,
        }
    }

    /// The number the policy sees: missing and failed signals read 0
    /// (fail-open: a signal that cannot be read never stops a sweep), and so does a value that is not finite.
    pub fn value(&self) -> f64 {
        match self {
            Reading::Found { value, .. } if value.is_finite() => *value,
            _ => 0.0,
        }
    }

    fn coverage(&self, signal: &str) -> SignalCoverage {
        let (status, metric, lower_bound) = match self {
            Reading::Found {
                metric,
                lower_bound,
                ..
            } => (SeriesStatus::Found, Some(metric.clone()), *lower_bound),
            Reading::Missing => (SeriesStatus::Missing, None, false),
            Reading::NoObservations { metric } => {
                (SeriesStatus::NoObservations, Some(metric.clone()), false)
            }
            Reading::Failed => (SeriesStatus::Failed, None, false),
        };
        SignalCoverage {
            signal: signal.to_string(),
            status,
            metric,
            lower_bound,
        }
    }
}

/// What the client saw of a stage that the server's series may not show.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClientEvidence {
    /// The longest any request of the stage waited for its first token, in
    /// seconds: until it came, or until the request ended or was abandoned
    /// without one (an error status the server answered is not a wait).
    pub longest_first_token_wait_seconds: f64,
}

fn index_of(name: &str) -> Option<usize> {
    SPECS.iter().position(|s| s.name == name)
}

/// Tells a stalled server from an idle one where a latency histogram
/// recorded nothing in its window ([`Reading::NoObservations`]).
///
/// No first token in the window of a server that had requests waiting or
/// running (their p50 over the steady window above 0), or while a request
/// of the client waited at least the window's length for its first token,
/// means that TTFT was at least the window's length: the reading becomes
/// that length, marked as a lower bound, so that a stall reads as the worst
/// latency rather than as none. Otherwise the server was idle and the
/// reading stays "no observations" (reads 0, recorded as no data).
/// Inter-token latency is left as it is: a prefill engine runs requests
/// and never observes one.
pub fn resolve_empty_quantiles(
    readings: &mut [Reading; SPECS.len()],
    stage: Window,
    client: ClientEvidence,
) {
    let p50 = |name: &str| index_of(name).map_or(0.0, |i| readings[i].value());
    let running = p50("running_requests_p50") > 0.0;
    let waiting = p50("waiting_requests_p50") > 0.0;
    for (spec, reading) in SPECS.iter().zip(readings.iter_mut()) {
        let Reading::NoObservations { metric } = reading else {
            continue;
        };
        let window = spec.window(stage).seconds();
        let stalled = spec.family == Family::Ttft
            && (running || waiting || client.longest_first_token_wait_seconds >= window);
        if stalled && window > 0.0 {
            *reading = Reading::Found {
                value: window,
                metric: std::mem::take(metric),
                lower_bound: true,
            };
        }
    }
}

/// Builds a role's [`RoleSignals`] and [`RoleCoverage`] from one reading per
/// entry of [`SPECS`], in order.
pub fn role_result(role: &str, readings: &[Reading; SPECS.len()]) -> (RoleSignals, RoleCoverage) {
    let signals = RoleSignals {
        role: role.to_string(),
        waiting_requests_p50: readings[0].value(),
        ttft_p99_seconds: readings[1].value(),
        kv_cache_usage_max: readings[2].value(),
        preemptions: readings[3].value(),
        extra: SPECS[4..]
            .iter()
            .zip(&readings[4..])
            .map(|(s, r)| (s.name.to_string(), r.value()))
            .collect(),
    };
    let coverage = RoleCoverage {
        role: role.to_string(),
        signals: SPECS
            .iter()
            .zip(readings)
            .map(|(s, r)| r.coverage(s.name))
            .collect(),
    };
    (signals, coverage)
}

/// The signals computed from `family`, for messages.
pub fn signals_of(family: Family) -> Vec<&'static str> {
    SPECS
        .iter()
        .filter(|s| s.family == family)
        .map(|s| s.name)
        .collect()
}

/// The range-query step for a window: `max(window / 200, 0.2 s)`, rounded
/// to milliseconds. This gives about 200 evaluation points whatever the stage
/// length (so a 5 s window still has 26 points, a 1 h stage 201, far under
/// Prometheus' 11,000-point limit), and never finer than 0.2 s (a server is
/// not scraped more often than that).
pub fn step_seconds(window: Window) -> f64 {
    let step = (window.seconds() / 200.0).max(0.2);
    (step * 1000.0).round() / 1000.0
}

/// The evaluation times of a range query: `start + k * step` up to `end`,
/// in whole milliseconds as Prometheus computes them.
pub fn grid(window: Window) -> Vec<f64> {
    let step_ms = (step_seconds(window) * 1000.0).round() as i64;
    let start_ms = (window.start * 1000.0).round() as i64;
    let end_ms = (window.end * 1000.0).round() as i64;
    let mut out = Vec::new();
    let mut t = start_ms;
    while t <= end_ms && step_ms > 0 {
        out.push(t as f64 / 1000.0);
        t += step_ms;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_rule_and_grid() {
        let w = Window::new(112.0, 157.0);
        assert_eq!(step_seconds(w), 0.225);
        let g = grid(w);
        assert_eq!(g.len(), 201);
        assert_eq!(g[0], 112.0);
        assert_eq!(*g.last().unwrap(), 157.0);
        assert_eq!(step_seconds(Window::new(0.0, 5.0)), 0.2);
        assert_eq!(grid(Window::new(0.0, 5.0)).len(), 26);
        assert_eq!(step_seconds(Window::new(0.0, 3600.0)), 18.0);
    }

    /// No first token in the window: a lower bound of the window's length
    /// when the server or the client shows work, no data when idle.
    #[test]
    fn empty_quantiles_are_a_stall_when_busy_and_no_data_when_idle() {
        let stage = Window::new(0.0, 60.0); // steady window 12..57: 45 s
        let empty = || Reading::NoObservations {
            metric: "vllm:time_to_first_token_seconds".into(),
        };
        let at = |name: &str| index_of(name).unwrap();
        let idle = || -> [Reading; SPECS.len()] {
            std::array::from_fn(|i| match SPECS[i].stat {
                Stat::Quantile(_) => empty(),
                _ => Reading::found(0.0, "m"),
            })
        };
        let stalled = Reading::Found {
            value: 45.0,
            metric: "vllm:time_to_first_token_seconds".into(),
            lower_bound: true,
        };

        let mut readings = idle();
        resolve_empty_quantiles(&mut readings, stage, ClientEvidence::default());
        assert_eq!(readings[at("ttft_p99_seconds")], empty());
        let (signals, coverage) = role_result("aggregate", &readings);
        assert_eq!(signals.ttft_p99_seconds, 0.0);
        let ttft = coverage.get("ttft_p99_seconds").unwrap();
        assert_eq!(ttft.status, SeriesStatus::NoObservations);
        assert!(ttft.status.no_data() && !ttft.lower_bound);

        // 50 requests waiting, none got a first token: TTFT >= 45 s.
        let mut readings = idle();
        readings[at("waiting_requests_p50")] = Reading::found(50.0, "m");
        resolve_empty_quantiles(&mut readings, stage, ClientEvidence::default());
        assert_eq!(readings[at("ttft_p99_seconds")], stalled);
        assert_eq!(readings[at("ttft_p50_seconds")], stalled);
        // Inter-token latency stays no data (a prefill engine has none).
        assert!(matches!(
            readings[at("itl_p99_seconds")],
            Reading::NoObservations { .. }
        ));
        let (signals, coverage) = role_result("aggregate", &readings);
        assert_eq!(signals.ttft_p99_seconds, 45.0);
        assert!(coverage.get("ttft_p99_seconds").unwrap().lower_bound);

        // Running sequences and no first token: a stall too.
        let mut readings = idle();
        readings[at("running_requests_p50")] = Reading::found(8.0, "m");
        resolve_empty_quantiles(&mut readings, stage, ClientEvidence::default());
        assert_eq!(readings[at("ttft_p99_seconds")], stalled);
        assert_eq!(readings[at("itl_p99_seconds")].value(), 0.0);

        // The client's own evidence: a request kept waiting the window's length.
        let client = |wait| ClientEvidence {
            longest_first_token_wait_seconds: wait,
        };
        let mut readings = idle();
        resolve_empty_quantiles(&mut readings, stage, client(44.9));
        assert_eq!(readings[at("ttft_p99_seconds")], empty());
        resolve_empty_quantiles(&mut readings, stage, client(45.0));
        assert_eq!(readings[at("ttft_p99_seconds")], stalled);
    }

    #[test]
    fn readings_fill_fields_then_extras_and_the_coverage() {
        let mut readings: [Reading; SPECS.len()] =
            std::array::from_fn(|i| Reading::found(i as f64 + 1.0, "m"));
        readings[3] = Reading::Missing;
        readings[5] = Reading::Failed;
        readings[1] = Reading::Found {
            value: 2560.0,
            metric: "vllm:time_to_first_token_seconds".into(),
            lower_bound: true,
        };
        readings[9] = Reading::found(f64::INFINITY, "m");
        let (r, coverage) = role_result("decode", &readings);
        assert_eq!(r.waiting_requests_p50, 1.0);
        assert_eq!(r.ttft_p99_seconds, 2560.0);
        assert_eq!(r.kv_cache_usage_max, 3.0);
        assert_eq!(r.preemptions, 0.0, "missing reads 0");
        assert_eq!(r.extra("ttft_p50_seconds"), Some(5.0));
        assert_eq!(r.extra("itl_p50_seconds"), Some(0.0), "failed reads 0");
        assert_eq!(
            r.extra("running_requests_p50"),
            Some(0.0),
            "non-finite reads 0"
        );
        assert_eq!(r.extra.len(), 6);
        assert_eq!(coverage.role, "decode");
        assert_eq!(coverage.signals.len(), SPECS.len());
        assert_eq!(coverage.status("preemptions"), SeriesStatus::Missing);
        assert_eq!(coverage.status("itl_p50_seconds"), SeriesStatus::Failed);
        let ttft = coverage.get("ttft_p99_seconds").unwrap();
        assert!(ttft.lower_bound);
        assert_eq!(
            ttft.metric.as_deref(),
            Some("vllm:time_to_first_token_seconds")
        );
        assert_eq!(
            signals_of(Family::Ttft),
            ["ttft_p99_seconds", "ttft_p50_seconds"]
        );
    }
}
