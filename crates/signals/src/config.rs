//! The options of the signal sources and what they resolve to: roles with
//! their PromQL selectors, scrape targets, headers. Metric names
//! are in [`crate::profile`].

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::SignalError;
use crate::profile::{MetricOverride, Server};

/// What chooses and configures the server-signal source: Prometheus (with
/// roles from a deployment name or selectors) or direct scraping, the
/// metric names, the waits and the TLS settings.
#[derive(Clone, Debug)]
pub struct SignalOptions {
    /// Prometheus base URL (e.g. http://prometheus:9090), read with range
    /// queries after each stage.
    pub prometheus_url: Option<String>,
    /// Deployment name whose default roles are read from Prometheus (see
    /// [`default_roles`]).
    pub deploy_name: Option<String>,
    /// Role selectors, replacing a role's default or defining a new role;
    /// passed to Prometheus as written.
    pub selectors: Vec<RoleSelector>,
    /// Metrics endpoints sampled directly during stages.
    pub scrape: Vec<ScrapeTarget>,
    /// How often each scrape URL is sampled.
    pub scrape_interval: Duration,
    /// Timeout of one scrape request.
    pub scrape_timeout: Duration,
    /// Fixed delay after a stage before its signals are computed.
    pub settle: Duration,
    /// Longest wait after a stage for samples covering its end (zero: no wait).
    pub settle_wait: Duration,
    /// Timeout of one Prometheus query.
    pub prometheus_timeout: Duration,
    /// Bearer token sent to Prometheus.
    pub prometheus_bearer_token: Option<String>,
    /// Headers sent to Prometheus (name, value).
    pub prometheus_headers: Vec<(String, String)>,
    /// Which server's metric names to read.
    pub server: Server,
    /// Metric names of a signal tried before the profile's.
    pub metrics: Vec<MetricOverride>,
    /// Start even when a role finds no series of any signal (its signals
    /// then read 0, recorded as no data).
    pub allow_missing_signals: bool,
    /// Client certificate (PEM) presented to Prometheus, with its key.
    pub prometheus_client_cert: Option<PathBuf>,
    pub prometheus_client_key: Option<PathBuf>,
    /// CA certificates (DER) trusted for https Prometheus and scrape URLs
    /// besides the system's.
    pub ca_certs: Vec<Vec<u8>>,
}

impl Default for SignalOptions {
    fn default() -> Self {
        Self {
            prometheus_url: None,
            deploy_name: None,
            selectors: Vec::new(),
            scrape: Vec::new(),
            scrape_interval: Duration::from_secs(1),
            scrape_timeout: Duration::from_secs(2),
            settle: Duration::ZERO,
            settle_wait: Duration::from_secs(30),
            prometheus_timeout: Duration::from_secs(10),
            prometheus_bearer_token: None,
            prometheus_headers: Vec::new(),
            server: Server::Vllm,
            metrics: Vec::new(),
            allow_missing_signals: false,
            prometheus_client_cert: None,
            prometheus_client_key: None,
            ca_certs: Vec::new(),
        }
    }
}

/// A role and the label matchers selecting its pods' series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleSelector {
    pub role: String,
    /// The matchers inside the braces, e.g. `job="vllm-decode",pod=~"m.*"`.
    pub matchers: String,
    /// The default of `--deploy-name` (not a `--selector`): what a hint
    /// suggests changing when it matches nothing.
    pub from_deploy_name: bool,
}

impl RoleSelector {
    /// `name{matchers}`.
    pub fn series(&self, metric: &str) -> String {
        format!("{metric}{{{}}}", self.matchers)
    }
}

impl fmt::Display for RoleSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {{{}}}", self.role, self.matchers)
    }
}

/// Escapes a value for a double-quoted PromQL string.
pub fn promql_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes regex metacharacters (RE2 syntax) so `value` matches literally.
pub fn regex_literal(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Canonical role order: prefill, decode, aggregate, then others as given.
fn role_rank(role: &str) -> usize {
    match role {
        "prefill" => 0,
        "decode" => 1,
        "aggregate" => 2,
        _ => 3,
    }
}

/// The `job` of a role's `--deploy-name` selector (llm-d's job names).
pub fn default_job(role: &str) -> Option<&'static str> {
    match role {
        "prefill" => Some("vllm-prefill"),
        "decode" => Some("vllm-decode"),
        "aggregate" => Some("vllm-aggregate"),
        _ => None,
    }
}

/// The default roles of `--deploy-name`: prefill and decode for a
/// disaggregated deployment (its name contains `-decode`), else aggregate.
pub fn default_roles(deploy_name: &str) -> Vec<RoleSelector> {
    let pod = |name: &str| format!("{}.*", regex_literal(name));
    let sel = |role: &str, name: &str| RoleSelector {
        role: role.to_string(),
        matchers: format!(
            "job=\"{}\",pod=~\"{}\"",
            promql_string(default_job(role).unwrap_or(role)),
            promql_string(&pod(name))
        ),
        from_deploy_name: true,
    };
    if deploy_name.contains("-decode") {
        let prefill = deploy_name.replacen("-decode", "-prefill", 1);
        vec![sel("prefill", &prefill), sel("decode", deploy_name)]
    } else {
        vec![sel("aggregate", deploy_name)]
    }
}

/// The roles of a deployment name's defaults with `selectors` replacing
/// or adding roles, in canonical order.
pub fn resolve_roles(deploy_name: Option<&str>, selectors: &[RoleSelector]) -> Vec<RoleSelector> {
    let mut roles = deploy_name.map(default_roles).unwrap_or_default();
    for new in selectors {
        match roles.iter_mut().find(|r| r.role == new.role) {
            Some(existing) => *existing = new.clone(),
            None => roles.push(new.clone()),
        }
    }
    roles.sort_by_key(|r| role_rank(&r.role)); // stable: others keep their order
    roles
}

/// `ROLE={MATCHERS}`, e.g. `decode={namespace="llm",pod=~"isvc-.*"}`.
impl FromStr for RoleSelector {
    type Err = SignalError;

    fn from_str(text: &str) -> Result<Self, SignalError> {
        let bad = |why: &str| SignalError::Selector {
            value: text.to_string(),
            why: why.to_string(),
        };
        let (role, sel) = text
            .split_once('=')
            .ok_or_else(|| bad("expected ROLE={MATCHERS}"))?;
        let role = role.trim();
        if !valid_role(role) {
            return Err(bad("the role must be letters, digits, '_' or '-'"));
        }
        let sel = sel.trim();
        let inner = sel
            .strip_prefix('{')
            .and_then(|s| s.strip_suffix('}'))
            .ok_or_else(|| bad("the selector must be written in braces: {label=\"value\",...}"))?;
        let matchers = inner.trim().trim_end_matches(',').to_string();
        if matchers.is_empty() {
            return Err(bad(
                "an empty selector would match every series of the server",
            ));
        }
        Ok(RoleSelector {
            role: role.to_string(),
            matchers,
            from_deploy_name: false,
        })
    }
}

fn valid_role(role: &str) -> bool {
    !role.is_empty()
        && role
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A metrics endpoint sampled directly, and the role it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeTarget {
    pub role: String,
    pub url: String,
}

/// `[ROLE=]URL`; a bare `host:port` becomes `http://host:port/metrics`.
impl FromStr for ScrapeTarget {
    type Err = SignalError;

    fn from_str(text: &str) -> Result<Self, SignalError> {
        parse_scrape(text)
    }
}

fn parse_scrape(flag: &str) -> Result<ScrapeTarget, SignalError> {
    let bad = |why: &str| SignalError::Scrape {
        value: flag.to_string(),
        why: why.to_string(),
    };
    let (role, url) = match flag.split_once('=') {
        Some((r, u)) if valid_role(r.trim()) => (r.trim().to_string(), u.trim()),
        _ => ("aggregate".to_string(), flag.trim()),
    };
    if url.is_empty() {
        return Err(bad("missing URL"));
    }
    let mut url = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let parsed = reqwest::Url::parse(&url).map_err(|e| bad(&format!("bad URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("the URL must be http:// or https://"));
    }
    if parsed.path() == "/" && !url.ends_with('/') {
        url.push_str("/metrics");
    } else if parsed.path() == "/" {
        url.push_str("metrics");
    }
    Ok(ScrapeTarget { role, url })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_name_gives_seed_roles() {
        let r = default_roles("model-decode");
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].role, "prefill");
        assert_eq!(
            r[0].matchers,
            r#"job="vllm-prefill",pod=~"model-prefill.*""#
        );
        assert_eq!(r[1].role, "decode");
        assert_eq!(r[1].matchers, r#"job="vllm-decode",pod=~"model-decode.*""#);
        // Only the first -decode is replaced.
        let r = default_roles("a-decode-decode");
        assert_eq!(
            r[0].matchers,
            r#"job="vllm-prefill",pod=~"a-prefill-decode.*""#
        );
        let r = default_roles("llama");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].role, "aggregate");
        assert_eq!(r[0].matchers, r#"job="vllm-aggregate",pod=~"llama.*""#);
    }

    #[test]
    fn flag_values_are_escaped() {
        let r = default_roles(r#"m.v1"x\"#);
        assert_eq!(
            r[0].matchers,
            r#"job="vllm-aggregate",pod=~"m\\.v1\"x\\\\.*""#
        );
    }

    #[test]
    fn selectors_replace_or_add_roles_in_order() {
        let selectors = [
            r#"extra={job="x"}"#.parse().unwrap(),
            r#"decode={namespace="ns",pod=~"isvc-predictor-.*"}"#
                .parse()
                .unwrap(),
        ];
        let r = resolve_roles(Some("m-decode"), &selectors);
        let names: Vec<_> = r.iter().map(|r| r.role.as_str()).collect();
        assert_eq!(names, ["prefill", "decode", "extra"]);
        assert_eq!(r[1].matchers, r#"namespace="ns",pod=~"isvc-predictor-.*""#);
        for bad in ["decode=job", "decode={}", "{job=\"x\"}"] {
            assert!(bad.parse::<RoleSelector>().is_err(), "{bad}");
        }
    }

    #[test]
    fn scrape_flags() {
        let t = parse_scrape("127.0.0.1:8000").unwrap();
        assert_eq!(t.role, "aggregate");
        assert_eq!(t.url, "http://127.0.0.1:8000/metrics");
        let t = parse_scrape("decode=http://127.0.0.1:9/m?x=1").unwrap();
        assert_eq!(t.role, "decode");
        assert_eq!(t.url, "http://127.0.0.1:9/m?x=1");
        let t = parse_scrape("http://127.0.0.1:9/").unwrap();
        assert_eq!(t.url, "http://127.0.0.1:9/metrics");
        assert!(parse_scrape("prefill=").is_err());
        assert!(parse_scrape("ftp://x/").is_err());
    }
}
