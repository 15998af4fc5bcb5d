//! Which server signals had data over a stage.
//!
//! A policy sees plain numbers ([`RoleSignals`](crate::RoleSignals)) in
//! which a signal without series reads 0 (the policy interface's rule:
//! missing series evaluate as zero). A person must not mistake that 0 for a measured one, so the
//! congestion check records beside the numbers, per role and per signal,
//! whether series were found; reports then say "no data". It is kept out of
//! `RoleSignals` so that the policy interface stays as it is.

use serde::{Deserialize, Serialize};

/// Whether a signal's series were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SeriesStatus {
    /// The value was computed from the series found.
    Found,
    /// No series of any of the signal's metric names: the value reads 0.
    Missing,
    /// The query or scrape failed (see the stage's signal errors): the value
    /// reads 0.
    Failed,
    /// A latency histogram whose series exist but recorded nothing in the
    /// window while the server was idle (nothing waiting or running, and no
    /// request of the client kept waiting for its first token): there is no
    /// latency to measure, so the value reads 0 and means "no data". (Had
    /// the server been busy, no observation would mean a latency of at least
    /// the window's length: that is recorded as found, with `lower_bound`.)
    NoObservations,
}

impl SeriesStatus {
    /// Nothing was measured: no series, or series that recorded nothing in
    /// the window of an idle server. Shown as "no data", never as 0.
    pub fn no_data(self) -> bool {
        matches!(self, SeriesStatus::Missing | SeriesStatus::NoObservations)
    }
}

/// One signal of one role over one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SignalCoverage {
    /// The `RoleSignals` field or `extra` key, e.g. `preemptions`.
    pub signal: String,
    pub status: SeriesStatus,
    /// The metric name the value was read from, when found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// The value is a lower bound: the true quantile is at least the value.
    /// Either the quantile lies beyond the histogram's largest finite bucket
    /// bound (the value is that bound), or the histogram recorded nothing in
    /// the window although the server was busy (a stall: the value is the
    /// window's length).
    #[serde(default, skip_serializing_if = "is_false")]
    pub lower_bound: bool,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// The signals of one role over one stage, in the order of `RoleSignals`
/// (the four policy inputs, then the extras).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RoleCoverage {
    pub role: String,
    pub signals: Vec<SignalCoverage>,
}

impl RoleCoverage {
    /// The entry of `signal`, if recorded.
    pub fn get(&self, signal: &str) -> Option<&SignalCoverage> {
        self.signals.iter().find(|s| s.signal == signal)
    }

    /// The status of `signal`; a signal that was not recorded counts as found
    /// (records written before coverage existed said nothing).
    pub fn status(&self, signal: &str) -> SeriesStatus {
        self.get(signal).map_or(SeriesStatus::Found, |s| s.status)
    }

    /// The signals without series.
    pub fn missing(&self) -> impl Iterator<Item = &str> {
        self.signals
            .iter()
            .filter(|s| s.status == SeriesStatus::Missing)
            .map(|s| s.signal.as_str())
    }

    /// True when every signal of the role has `status`.
    pub fn all(&self, status: SeriesStatus) -> bool {
        self.signals.iter().all(|s| s.status == status)
    }

    /// True when no signal of the role had series and none failed: the
    /// role's selector matches nothing, so everything it shows is a 0 that
    /// was never measured.
    pub fn nothing_found(&self) -> bool {
        !self.signals.is_empty() && self.all(SeriesStatus::Missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(signal: &str, status: SeriesStatus) -> SignalCoverage {
        SignalCoverage {
            signal: signal.into(),
            status,
            metric: None,
            lower_bound: false,
        }
    }

    #[test]
    fn missing_and_nothing_found() {
        let mut role = RoleCoverage {
            role: "aggregate".into(),
            signals: vec![
                entry("waiting_requests_p50", SeriesStatus::Missing),
                entry("preemptions", SeriesStatus::Missing),
            ],
        };
        assert!(role.nothing_found());
        assert_eq!(
            role.missing().collect::<Vec<_>>(),
            ["waiting_requests_p50", "preemptions"]
        );
        role.signals[0].status = SeriesStatus::Failed;
        assert!(!role.nothing_found(), "a failure is not an absence");
        assert_eq!(role.status("preemptions"), SeriesStatus::Missing);
        assert_eq!(role.status("not_recorded"), SeriesStatus::Found);
    }

    #[test]
    fn json_leaves_out_what_is_unset() {
        let json = serde_json::to_string(&entry("preemptions", SeriesStatus::Missing)).unwrap();
        assert_eq!(json, r#"{"signal":"preemptions","status":"missing"}"#);
        let back: SignalCoverage = serde_json::from_str(&json).unwrap();
        assert_eq!(back, entry("preemptions", SeriesStatus::Missing));
    }
}
