//! The built-in rules as plain functions over the observation, so they are
//! tested natively (no wasm involved).

use nyann_policy::{Params, RoleSignals, StageObservation, Verdict};

/// Default KV-cache usage threshold (fraction).
pub const DEFAULT_KV_CACHE_USAGE: f64 = 0.95;
/// Default preemptions threshold (per stage).
pub const DEFAULT_PREEMPTIONS: f64 = 1.0;

/// The four thresholds of one `until_congested(...)` call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    pub waiting_requests_p50: f64,
    pub ttft_p99_seconds: f64,
    pub kv_cache_usage: f64,
    pub preemptions: f64,
}

impl Thresholds {
    /// Read and range-check the parameters (the host filled the defaults
    /// and converted `ttft_p99` to seconds).
    pub fn from_params(params: &Params) -> Result<Self, String> {
        Ok(Thresholds {
            waiting_requests_p50: params.require_positive("waiting_requests_p50")?,
            ttft_p99_seconds: params.require_positive("ttft_p99")?,
            kv_cache_usage: params.require_fraction_above_zero("kv_cache_usage")?,
            preemptions: params.require_positive("preemptions")?,
        })
    }
}

/// The verdict: a reason per rule that holds, and which roles and figures
/// each compared (the report marks those). Rule names: `queueing`,
/// `kv-cache`.
pub fn verdict(t: &Thresholds, stage: &StageObservation) -> Verdict {
    let mut verdict = Verdict::ok();
    if let Some((reason, waiting, ttft)) = queueing(t, &stage.roles) {
        verdict.reasons.push(reason);
        verdict = if waiting == ttft {
            verdict.fired(
                "queueing",
                Some(waiting),
                &["waiting_requests_p50", "ttft_p99_seconds"],
            )
        } else {
            verdict
                .fired("queueing", Some(waiting), &["waiting_requests_p50"])
                .fired("queueing", Some(ttft), &["ttft_p99_seconds"])
        };
    }
    for role in &stage.roles {
        if let Some(reason) = kv_pressure(t, role) {
            verdict.reasons.push(reason);
            verdict = verdict.fired(
                "kv-cache",
                Some(&role.role),
                &["kv_cache_usage_max", "preemptions"],
            );
        }
    }
    verdict.congested = !verdict.reasons.is_empty();
    verdict
}

/// Every reason the stage is congested; empty when it is not.
pub fn reasons(t: &Thresholds, stage: &StageObservation) -> Vec<String> {
    verdict(t, stage).reasons
}

/// Sustained queueing: the largest waiting p50 and the largest TTFT p99,
/// each from whichever role has it, both at or over their thresholds. The
/// reason, and the roles of the waiting and of the TTFT figure.
fn queueing<'a>(t: &Thresholds, roles: &'a [RoleSignals]) -> Option<(String, &'a str, &'a str)> {
    let waiting = max_by(roles, |r| r.waiting_requests_p50)?;
    let ttft = max_by(roles, |r| r.ttft_p99_seconds)?;
    (waiting.waiting_requests_p50 >= t.waiting_requests_p50
        && ttft.ttft_p99_seconds >= t.ttft_p99_seconds)
        .then(|| {
            let reason = format!(
                "queueing: waiting p50 {} on {} (threshold {}), TTFT p99 {}s on {} (threshold {}s)",
                num(waiting.waiting_requests_p50),
                waiting.role,
                num(t.waiting_requests_p50),
                num(ttft.ttft_p99_seconds),
                ttft.role,
                num(t.ttft_p99_seconds),
            );
            (reason, waiting.role.as_str(), ttft.role.as_str())
        })
}

/// KV-cache pressure on one role: usage and preemptions both at or over
/// their thresholds on that same role.
fn kv_pressure(t: &Thresholds, role: &RoleSignals) -> Option<String> {
    (role.kv_cache_usage_max >= t.kv_cache_usage && role.preemptions >= t.preemptions).then(|| {
        format!(
            "KV cache on {}: usage {:.1}% (threshold {:.1}%), preemptions {} (threshold {})",
            role.role,
            role.kv_cache_usage_max * 100.0,
            t.kv_cache_usage * 100.0,
            num(role.preemptions),
            num(t.preemptions),
        )
    })
}

/// The role with the largest value (the first one on ties); `None` without roles.
fn max_by(roles: &[RoleSignals], value: impl Fn(&RoleSignals) -> f64) -> Option<&RoleSignals> {
    roles
        .iter()
        .fold(None, |best: Option<&RoleSignals>, role| match best {
            Some(b) if value(b) >= value(role) => Some(b),
            _ => Some(role),
        })
}

/// A number as a person writes it: `40`, `2.5`, `0.125` (at most 3
/// decimals); a huge one in scientific notation (a quantile beyond the
/// histogram reads as the largest number: `1.8e308`, not 309 digits).
fn num(v: f64) -> String {
    if !v.is_finite() || v.abs() >= 1e12 {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(name: &str, waiting: f64, ttft: f64, kv: f64, preemptions: f64) -> RoleSignals {
        RoleSignals {
            waiting_requests_p50: waiting,
            ttft_p99_seconds: ttft,
            kv_cache_usage_max: kv,
            preemptions,
            ..RoleSignals::new(name)
        }
    }

    fn stage(roles: Vec<RoleSignals>) -> StageObservation {
        StageObservation {
            roles,
            ..Default::default()
        }
    }

    fn thresholds(waiting: f64, ttft: f64, kv: f64, preemptions: f64) -> Thresholds {
        Thresholds {
            waiting_requests_p50: waiting,
            ttft_p99_seconds: ttft,
            kv_cache_usage: kv,
            preemptions,
        }
    }

    #[test]
    fn the_verdict_names_the_roles_and_figures_of_each_rule_that_fired() {
        let s = stage(vec![
            role("prefill", 40.0, 0.1, 0.99, 5.0),
            role("decode", 0.0, 2.5, 0.5, 0.0),
        ]);
        let v = verdict(&thresholds(32.0, 2.0, 0.95, 2.0), &s);
        assert!(v.congested);
        let fired: Vec<_> = v
            .fired
            .iter()
            .map(|f| (f.rule.as_str(), f.role.as_deref(), f.signals.clone()))
            .collect();
        assert_eq!(
            fired,
            vec![
                (
                    "queueing",
                    Some("prefill"),
                    vec!["waiting_requests_p50".to_string()]
                ),
                (
                    "queueing",
                    Some("decode"),
                    vec!["ttft_p99_seconds".to_string()]
                ),
                (
                    "kv-cache",
                    Some("prefill"),
                    vec!["kv_cache_usage_max".to_string(), "preemptions".to_string()]
                ),
            ]
        );
        // One role holding both queueing figures: one rule entry.
        let s = stage(vec![role("aggregate", 40.0, 2.5, 0.5, 0.0)]);
        let v = verdict(&thresholds(32.0, 2.0, 0.95, 2.0), &s);
        assert_eq!(v.fired.len(), 1);
        assert_eq!(
            v.fired[0].signals,
            ["waiting_requests_p50", "ttft_p99_seconds"]
        );
        // Not congested: nothing fired.
        let s = stage(vec![role("aggregate", 1.0, 0.1, 0.5, 0.0)]);
        let v = verdict(&thresholds(32.0, 2.0, 0.95, 2.0), &s);
        assert!(!v.congested && v.fired.is_empty() && v.reasons.is_empty());
    }

    // The Go tool's cases.

    #[test]
    fn go_case_disaggregated_queueing_and_kv_pressure() {
        let s = stage(vec![
            role("prefill", 40.0, 0.0, 0.0, 0.0),
            role("decode", 0.0, 2.5, 0.98, 3.0),
        ]);
        let r = reasons(&thresholds(32.0, 2.0, 0.95, 2.0), &s);
        assert_eq!(
            r,
            vec![
                "queueing: waiting p50 40 on prefill (threshold 32), TTFT p99 2.5s on decode (threshold 2s)",
                "KV cache on decode: usage 98.0% (threshold 95.0%), preemptions 3 (threshold 2)",
            ]
        );
    }

    #[test]
    fn go_case_everything_low_is_not_congested() {
        let s = stage(vec![role("aggregate", 0.1, 0.1, 0.1, 0.1)]);
        assert!(reasons(&thresholds(10.0, 1.0, 0.95, 1.0), &s).is_empty());
    }

    #[test]
    fn go_case_kv_and_preemptions_on_different_roles_is_not_congested() {
        let s = stage(vec![
            role("prefill", 0.0, 0.0, 0.0, 10.0),
            role("decode", 0.0, 0.0, 0.99, 0.0),
        ]);
        assert!(reasons(&thresholds(32.0, 2.0, 0.95, 1.0), &s).is_empty());
    }

    // Inclusive thresholds: exactly equal fires, just below does not.

    #[test]
    fn waiting_threshold_is_inclusive() {
        let t = thresholds(32.0, 2.0, 0.95, 1.0);
        assert_eq!(
            reasons(&t, &stage(vec![role("aggregate", 32.0, 2.0, 0.0, 0.0)])).len(),
            1
        );
        assert!(reasons(&t, &stage(vec![role("aggregate", 31.999, 2.0, 0.0, 0.0)])).is_empty());
    }

    #[test]
    fn ttft_threshold_is_inclusive() {
        let t = thresholds(32.0, 2.0, 0.95, 1.0);
        assert_eq!(
            reasons(&t, &stage(vec![role("aggregate", 32.0, 2.0, 0.0, 0.0)])),
            vec![
                "queueing: waiting p50 32 on aggregate (threshold 32), TTFT p99 2s on aggregate (threshold 2s)"
            ]
        );
        assert!(reasons(&t, &stage(vec![role("aggregate", 32.0, 1.999, 0.0, 0.0)])).is_empty());
    }

    #[test]
    fn kv_threshold_is_inclusive() {
        let t = thresholds(32.0, 2.0, 0.95, 2.0);
        assert_eq!(
            reasons(&t, &stage(vec![role("decode", 0.0, 0.0, 0.95, 2.0)])),
            vec!["KV cache on decode: usage 95.0% (threshold 95.0%), preemptions 2 (threshold 2)"]
        );
        assert!(reasons(&t, &stage(vec![role("decode", 0.0, 0.0, 0.949, 2.0)])).is_empty());
    }

    #[test]
    fn preemptions_threshold_is_inclusive() {
        let t = thresholds(32.0, 2.0, 0.95, 2.0);
        assert_eq!(
            reasons(&t, &stage(vec![role("decode", 0.0, 0.0, 0.95, 2.0)])).len(),
            1
        );
        assert!(reasons(&t, &stage(vec![role("decode", 0.0, 0.0, 0.95, 1.999)])).is_empty());
    }

    #[test]
    fn queueing_needs_both_signals() {
        let t = thresholds(32.0, 2.0, 0.95, 1.0);
        assert!(reasons(&t, &stage(vec![role("aggregate", 100.0, 0.5, 0.0, 0.0)])).is_empty());
        assert!(reasons(&t, &stage(vec![role("aggregate", 1.0, 10.0, 0.0, 0.0)])).is_empty());
    }

    #[test]
    fn no_roles_is_not_congested() {
        assert!(reasons(&thresholds(1.0, 1.0, 0.5, 1.0), &stage(vec![])).is_empty());
    }

    #[test]
    fn thresholds_are_range_checked() {
        use nyann_policy::{Param, Value};
        let params = |w: f64, t: f64, kv: f64, p: f64| {
            Params::new(
                [
                    ("waiting_requests_p50", w),
                    ("ttft_p99", t),
                    ("kv_cache_usage", kv),
                    ("preemptions", p),
                ]
                .into_iter()
                .map(|(n, v)| Param {
                    name: n.into(),
                    value: Value::Number(v),
                })
                .collect(),
            )
        };
        assert!(Thresholds::from_params(&params(32.0, 2.0, 0.95, 1.0)).is_ok());
        assert!(Thresholds::from_params(&params(32.0, 2.0, 1.0, 1.0)).is_ok());
        assert_eq!(
            Thresholds::from_params(&params(0.0, 2.0, 0.95, 1.0)),
            Err("waiting_requests_p50 must be > 0 (got 0)".into())
        );
        assert!(
            Thresholds::from_params(&params(32.0, 0.0, 0.95, 1.0))
                .unwrap_err()
                .starts_with("ttft_p99")
        );
        assert!(
            Thresholds::from_params(&params(32.0, 2.0, 0.0, 1.0))
                .unwrap_err()
                .starts_with("kv_cache_usage")
        );
        assert!(
            Thresholds::from_params(&params(32.0, 2.0, 1.5, 1.0))
                .unwrap_err()
                .starts_with("kv_cache_usage")
        );
        assert!(
            Thresholds::from_params(&params(32.0, 2.0, 0.95, 0.0))
                .unwrap_err()
                .starts_with("preemptions")
        );
    }

    #[test]
    fn numbers_print_like_people_write_them() {
        assert_eq!(num(40.0), "40");
        assert_eq!(num(2.5), "2.5");
        assert_eq!(num(0.1 + 0.2), "0.3");
        assert_eq!(num(0.75), "0.75");
    }

    /// A TTFT quantile beyond the histogram reads as the largest number:
    /// the reason says it in scientific notation, not with 309 digits.
    #[test]
    fn a_reading_beyond_the_histogram_is_said_briefly() {
        let v = verdict(
            &thresholds(1.0, 1.0, 0.95, 1.0),
            &stage(vec![role("aggregate", 4.0, f64::MAX, 0.1, 0.0)]),
        );
        assert_eq!(
            v.reasons,
            [
                "queueing: waiting p50 4 on aggregate (threshold 1), TTFT p99 1.8e308s on aggregate (threshold 1s)"
            ]
        );
        assert_eq!(num(2.5), "2.5");
        assert_eq!(num(f64::INFINITY), "inf");
    }
}
