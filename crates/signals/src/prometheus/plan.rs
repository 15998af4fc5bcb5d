//! Query planning: which PromQL asks one signal of one role over a stage
//! window, and how its answer becomes a reading.

use crate::config::RoleSelector;
use crate::math::{self, Window};
use crate::spec::{self, Spec, Stat};

use super::client::{QueryError, Series, format_range, format_time};

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
pub(super) enum Evaluated {
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
pub(super) fn evaluate(spec: &Spec, series: &[Series]) -> Result<Option<Evaluated>, QueryError> {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::spec::SPECS;

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
