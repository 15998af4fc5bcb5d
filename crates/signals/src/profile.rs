//! Metric name profiles: which metric of each kind of server every signal
//! is read from (`--server vllm|sglang`), with the fallbacks tried in order
//! and the `--metric SIGNAL=NAME` overrides on top.
//!
//! vLLM's names are those of its V1 engine (`vllm/v1/metrics/loggers.py`);
//! SGLang's come from its metrics collector
//! (`python/sglang/srt/metrics/collector.py`) and its "Production Metrics"
//! documentation page. Every name is tried in the colon spelling the server
//! writes, then in the underscore spelling that an OpenMetrics scrape with
//! `escaping=underscores` stores.

use std::collections::BTreeMap;

use crate::SignalError;

/// The kind of server whose metric names are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Server {
    #[default]
    Vllm,
    Sglang,
}

impl Server {
    pub const ALL: [Server; 2] = [Server::Vllm, Server::Sglang];

    /// The `--server` value.
    pub fn flag(self) -> &'static str {
        match self {
            Server::Vllm => "vllm",
            Server::Sglang => "sglang",
        }
    }

    /// The server's own name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Server::Vllm => "vLLM",
            Server::Sglang => "SGLang",
        }
    }

    /// The metric namespace (`vllm:`, `sglang:`), without its separator.
    fn namespace(self) -> &'static str {
        self.flag()
    }

    /// The server whose profile names `metric` (any family, either
    /// spelling, a histogram with or without `_bucket`).
    pub fn of_metric(metric: &str) -> Option<Server> {
        let base = metric.strip_suffix("_bucket").unwrap_or(metric);
        Server::ALL.into_iter().find(|server| {
            Family::ALL
                .iter()
                .any(|f| f.default_names(*server).iter().any(|n| n == base))
        })
    }
}

/// A server metric a signal is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    Waiting,
    Running,
    KvCacheUsage,
    Ttft,
    Itl,
    Preemptions,
    GenerationTokens,
}

impl Family {
    pub const ALL: [Family; 7] = [
        Family::Waiting,
        Family::Running,
        Family::KvCacheUsage,
        Family::Ttft,
        Family::Itl,
        Family::Preemptions,
        Family::GenerationTokens,
    ];

    /// The SIGNAL key of `--metric`.
    pub fn key(self) -> &'static str {
        match self {
            Family::Waiting => "waiting",
            Family::Running => "running",
            Family::KvCacheUsage => "kv_cache_usage",
            Family::Ttft => "ttft",
            Family::Itl => "itl",
            Family::Preemptions => "preemptions",
            Family::GenerationTokens => "generation_tokens",
        }
    }

    /// Histograms are named without their `_bucket` suffix.
    pub fn is_histogram(self) -> bool {
        matches!(self, Family::Ttft | Family::Itl)
    }

    /// The names a series of this family is stored under: `NAME_bucket`
    /// for a histogram, `NAME` otherwise.
    pub fn series_name(self, name: &str) -> String {
        if self.is_histogram() {
            format!("{name}_bucket")
        } else {
            name.to_string()
        }
    }

    /// The names in `server`'s profile, namespace included, in fallback order.
    pub fn default_names(self, server: Server) -> Vec<String> {
        let base: &[&str] = match (server, self) {
            (Server::Vllm, Family::Waiting) => &["num_requests_waiting"],
            (Server::Vllm, Family::Running) => &["num_requests_running"],
            // Renamed in vLLM 0.9.2; the old name was removed in 0.12.
            (Server::Vllm, Family::KvCacheUsage) => {
                &["kv_cache_usage_perc", "gpu_cache_usage_perc"]
            }
            (Server::Vllm, Family::Ttft) => &["time_to_first_token_seconds"],
            // Renamed in vLLM 0.11; the old name was removed in early 2026.
            (Server::Vllm, Family::Itl) => &[
                "inter_token_latency_seconds",
                "time_per_output_token_seconds",
            ],
            (Server::Vllm, Family::Preemptions) => &["num_preemptions_total"],
            (Server::Vllm, Family::GenerationTokens) => &["generation_tokens_total"],
            (Server::Sglang, Family::Waiting) => &["num_queue_reqs"],
            (Server::Sglang, Family::Running) => &["num_running_reqs"],
            // The used fraction (0-1) of the KV-cache token pool.
            (Server::Sglang, Family::KvCacheUsage) => &["token_usage"],
            (Server::Sglang, Family::Ttft) => &["time_to_first_token_seconds"],
            (Server::Sglang, Family::Itl) => &[
                "inter_token_latency_seconds",
                "time_per_output_token_seconds",
            ],
            // A retraction sends a running request back to the queue when
            // the KV cache runs out: SGLang's preemption. Only the counter
            // fits an increase over the stage (the older gauge
            // `num_retracted_reqs` is reset at every log interval).
            (Server::Sglang, Family::Preemptions) => &["num_retracted_requests_total"],
            (Server::Sglang, Family::GenerationTokens) => &["generation_tokens_total"],
        };
        let ns = server.namespace();
        let mut names: Vec<String> = base.iter().map(|b| format!("{ns}:{b}")).collect();
        names.extend(base.iter().map(|b| format!("{ns}_{b}")));
        names
    }
}

/// Metric names per family, in fallback order.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricNames {
    server: Server,
    names: BTreeMap<Family, Vec<String>>,
}

impl Default for MetricNames {
    fn default() -> Self {
        Self::of(Server::Vllm)
    }
}

/// The metric names of one signal, tried in order before the profile's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricOverride {
    pub signal: Family,
    pub names: Vec<String>,
}

/// `SIGNAL=NAME[,NAME...]`, e.g. `kv_cache_usage=my:kv_usage`.
impl std::str::FromStr for MetricOverride {
    type Err = SignalError;

    fn from_str(text: &str) -> Result<Self, SignalError> {
        let bad = |why: &str| SignalError::Metric {
            value: text.to_string(),
            why: why.to_string(),
        };
        let (key, list) = text
            .split_once('=')
            .ok_or_else(|| bad("expected SIGNAL=NAME[,NAME...]"))?;
        let signal = Family::ALL
            .into_iter()
            .find(|f| f.key() == key.trim())
            .ok_or_else(|| {
                bad(&format!(
                    "unknown signal {:?}; expected one of {}",
                    key.trim(),
                    Family::ALL.map(Family::key).join(", ")
                ))
            })?;
        let names: Vec<String> = list
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Err(bad("no metric name given"));
        }
        if let Some(n) = names.iter().find(|n| !valid_metric_name(n)) {
            return Err(bad(&format!(
                "{n:?} is not a metric name (letters, digits, '_' and ':')"
            )));
        }
        Ok(MetricOverride { signal, names })
    }
}

impl MetricNames {
    /// `server`'s profile.
    pub fn of(server: Server) -> Self {
        Self {
            server,
            names: Family::ALL
                .iter()
                .map(|f| (*f, f.default_names(server)))
                .collect(),
        }
    }

    /// `server`'s profile with `overrides` tried first.
    pub fn with_overrides(server: Server, overrides: &[MetricOverride]) -> Self {
        let mut names = Self::of(server);
        for o in overrides {
            names.names.insert(o.signal, o.names.clone());
        }
        names
    }

    /// The server profile these names start from.
    pub fn server(&self) -> Server {
        self.server
    }

    /// The names of `family`, primary first.
    pub fn get(&self, family: Family) -> &[String] {
        self.names.get(&family).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The first name of `family` (in fallback order) that `present` holds
    /// series of; `present` maps series names (`_bucket` for histograms) to
    /// their number of series.
    pub fn first_present(&self, family: Family, present: &BTreeMap<String, u64>) -> Option<&str> {
        self.get(family)
            .iter()
            .find(|n| present.get(&family.series_name(n)).is_some_and(|c| *c > 0))
            .map(String::as_str)
    }

    /// True when `present` holds series of at least one family.
    pub fn finds_any(&self, present: &BTreeMap<String, u64>) -> bool {
        Family::ALL
            .iter()
            .any(|f| self.first_present(*f, present).is_some())
    }

    /// Every series name of every family, for one regex matcher on `__name__`.
    pub fn all_series_names(&self) -> Vec<String> {
        Family::ALL
            .iter()
            .flat_map(|f| self.get(*f).iter().map(|n| f.series_name(n)))
            .collect()
    }
}

fn valid_metric_name(n: &str) -> bool {
    !n.is_empty()
        && !n.starts_with(|c: char| c.is_ascii_digit())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_profile_and_overrides() {
        let m = MetricNames::default();
        assert_eq!(
            m.get(Family::KvCacheUsage),
            [
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "vllm_kv_cache_usage_perc",
                "vllm_gpu_cache_usage_perc"
            ]
        );
        let m =
            MetricNames::with_overrides(Server::Vllm, &["waiting=my:queue,x_y".parse().unwrap()]);
        assert_eq!(m.get(Family::Waiting), ["my:queue", "x_y"]);
        assert_eq!(
            m.get(Family::Running),
            ["vllm:num_requests_running", "vllm_num_requests_running"]
        );
        for bad in ["nope=x", "waiting=a b", "waiting=", "waiting"] {
            assert!(bad.parse::<MetricOverride>().is_err(), "{bad}");
        }
    }

    #[test]
    fn sglang_profile_with_an_override_on_top() {
        let m = MetricNames::of(Server::Sglang);
        assert_eq!(
            m.get(Family::Waiting),
            ["sglang:num_queue_reqs", "sglang_num_queue_reqs"]
        );
        assert_eq!(m.get(Family::KvCacheUsage)[0], "sglang:token_usage");
        assert_eq!(
            m.get(Family::Preemptions)[0],
            "sglang:num_retracted_requests_total"
        );
        assert_eq!(m.get(Family::Ttft)[0], "sglang:time_to_first_token_seconds");
        let m = MetricNames::with_overrides(
            Server::Sglang,
            &["preemptions=my_retractions_total".parse().unwrap()],
        );
        assert_eq!(m.get(Family::Preemptions), ["my_retractions_total"]);
        assert_eq!(m.get(Family::Waiting)[0], "sglang:num_queue_reqs");
        assert_eq!(m.server(), Server::Sglang);
    }

    #[test]
    fn names_are_found_in_fallback_order_and_recognised() {
        let m = MetricNames::default();
        let present: BTreeMap<String, u64> = [
            ("vllm_gpu_cache_usage_perc".to_string(), 2),
            ("vllm:gpu_cache_usage_perc".to_string(), 1),
            ("vllm:time_to_first_token_seconds_bucket".to_string(), 23),
            ("vllm:num_preemptions_total".to_string(), 0),
        ]
        .into();
        assert_eq!(
            m.first_present(Family::KvCacheUsage, &present),
            Some("vllm:gpu_cache_usage_perc")
        );
        assert_eq!(
            m.first_present(Family::Ttft, &present),
            Some("vllm:time_to_first_token_seconds")
        );
        assert_eq!(m.first_present(Family::Preemptions, &present), None);
        assert!(
            m.all_series_names()
                .contains(&"vllm_inter_token_latency_seconds_bucket".to_string())
        );
        assert_eq!(
            Server::of_metric("sglang_num_queue_reqs"),
            Some(Server::Sglang)
        );
        assert_eq!(
            Server::of_metric("vllm:time_to_first_token_seconds_bucket"),
            Some(Server::Vllm)
        );
        assert_eq!(Server::of_metric("tgi_queue_size"), None);
    }
}
