//! The list of per-role signals, how each is computed, and how the computed
//! values become a [`RoleSignals`]. Both sources walk this one table, so they
//! cannot drift apart on which figures exist or over which window.

use nyann_model::RoleSignals;

use crate::config::Family;
use crate::math::Window;

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

/// Builds a [`RoleSignals`] from one value per entry of [`SPECS`], in order.
pub fn role_signals(role: &str, values: &[f64; SPECS.len()]) -> RoleSignals {
    RoleSignals {
        role: role.to_string(),
        waiting_requests_p50: values[0],
        ttft_p99_seconds: values[1],
        kv_cache_usage_max: values[2],
        preemptions: values[3],
        extra: SPECS[4..]
            .iter()
            .zip(&values[4..])
            .map(|(s, v)| (s.name.to_string(), *v))
            .collect(),
    }
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

    #[test]
    fn role_signals_fill_fields_then_extras() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        let r = role_signals("decode", &v);
        assert_eq!(r.waiting_requests_p50, 1.0);
        assert_eq!(r.ttft_p99_seconds, 2.0);
        assert_eq!(r.kv_cache_usage_max, 3.0);
        assert_eq!(r.preemptions, 4.0);
        assert_eq!(r.extra("ttft_p50_seconds"), Some(5.0));
        assert_eq!(r.extra("running_requests_p50"), Some(10.0));
        assert_eq!(r.extra.len(), 6);
    }
}
