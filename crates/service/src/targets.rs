//! The operator's targets file: each logical target a client may name, with
//! the server's URL and model (which clients never see nor set), where its
//! congestion signals come from, and the bounds a run against it must keep.
//! Read and validated once at start; every error is named, all at once.

use std::collections::BTreeMap;
use std::path::Path;

use nyann_oci::OciReference;
use serde::{Deserialize, Serialize};

/// The most stages a target may allow a scenario (the service's own ceiling).
pub const MAX_STAGES: usize = 128;

/// One logical target, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub name: String,
    /// The OpenAI-compatible base URL the runs send load to.
    pub url: String,
    /// The model; absent, the run asks the server (`GET /v1/models`).
    pub model: Option<String>,
    pub signals: SignalSource,
    pub bounds: Bounds,
    /// The congestion policies a client may name: `builtin`, component
    /// files on the service's machine, or `oci://...@sha256:...`
    /// references pinned by digest.
    pub policies: Vec<String>,
    /// Pods a run on it takes under the Kubernetes backend (a fleet when
    /// more than 1); the local backend runs one process.
    pub workers: usize,
}

/// The most pods one run may take.
pub const MAX_WORKERS: usize = 64;

/// Where a target's server signals come from (what `until_congested` needs).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SignalSource {
    /// A Prometheus server's base URL, with `deploy_name` naming the
    /// deployment's series.
    #[serde(default)]
    pub prometheus_url: Option<String>,
    #[serde(default)]
    pub deploy_name: Option<String>,
    /// `/metrics` URLs scraped directly, each `ROLE=URL` or a bare URL.
    #[serde(default)]
    pub scrape: Vec<String>,
    /// The server's metric names: `vllm` (the default) or `sglang`.
    #[serde(default)]
    pub server: Option<String>,
}

impl SignalSource {
    /// Whether any signal source is configured.
    pub fn is_configured(&self) -> bool {
        self.prometheus_url.is_some() || !self.scrape.is_empty()
    }
}

/// What one run against a target may do.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Bounds {
    /// Closed-loop streams in one stage.
    pub max_concurrency: u32,
    /// Open-loop arrivals per second in one stage.
    pub max_rate: f64,
    /// Seconds one stage may last.
    pub max_stage_duration_s: f64,
    /// Seconds all stages together may last.
    pub max_total_duration_s: f64,
    /// Stages in one scenario (at most [`MAX_STAGES`]).
    pub max_stages: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_concurrency: 256,
            max_rate: 100.0,
            max_stage_duration_s: 600.0,
            max_total_duration_s: 3600.0,
            max_stages: MAX_STAGES,
        }
    }
}

/// The targets file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    targets: BTreeMap<String, Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    url: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    signals: SignalSource,
    #[serde(default)]
    bounds: Bounds,
    #[serde(default)]
    policies: Option<Vec<String>>,
    #[serde(default = "one")]
    workers: usize,
}

fn one() -> usize {
    1
}

/// The targets file could not be used; each message names the file and the
/// target and field at fault.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct TargetsError(pub Vec<String>);

/// The validated targets, by name.
#[derive(Debug, Clone, Default)]
pub struct Targets(BTreeMap<String, Target>);

impl Targets {
    /// Reads `path` (TOML, or JSON when it ends in `.json`) and validates
    /// every target.
    pub fn load(path: &Path) -> Result<Targets, TargetsError> {
        let shown = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| {
            TargetsError(vec![format!("{shown}: cannot read the targets file: {e}")])
        })?;
        let json = path.extension().is_some_and(|e| e == "json");
        Targets::parse(&shown.to_string(), &text, json)
    }

    /// Parses and validates a targets file's text (`file` names it in errors).
    pub fn parse(file: &str, text: &str, json: bool) -> Result<Targets, TargetsError> {
        let parsed: Result<File, String> = if json {
            serde_json::from_str(text).map_err(|e| e.to_string())
        } else {
            toml::from_str(text).map_err(|e| e.to_string())
        };
        let parsed = parsed.map_err(|e| TargetsError(vec![format!("{file}: {e}")]))?;
        let mut errors = Vec::new();
        if parsed.targets.is_empty() {
            errors.push(format!(
                "{file}: no target is defined: add a `[targets.NAME]` table with its `url`"
            ));
        }
        let mut targets = BTreeMap::new();
        for (name, entry) in parsed.targets {
            let mut error = |field: &str, message: String| {
                errors.push(format!("{file}: target {name:?}: {field}: {message}"));
            };
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
            {
                error(
                    "name",
                    "use letters, digits, '-', '_' and '.' only".to_string(),
                );
            }
            check_url(&entry.url, &mut |m| error("url", m));
            let signals = &entry.signals;
            if let Some(url) = &signals.prometheus_url {
                check_url(url, &mut |m| error("signals.prometheus_url", m));
                if signals.deploy_name.is_none() {
                    error(
                        "signals.deploy_name",
                        "a Prometheus source needs the deployment's name to find its series"
                            .to_string(),
                    );
                }
            } else if signals.deploy_name.is_some() {
                error(
                    "signals.deploy_name",
                    "names series in Prometheus: give signals.prometheus_url too".to_string(),
                );
            }
            if signals.prometheus_url.is_some() && !signals.scrape.is_empty() {
                error(
                    "signals",
                    "give prometheus_url or scrape, not both".to_string(),
                );
            }
            for scrape in &signals.scrape {
                let url = scrape
                    .split_once('=')
                    .map_or(scrape.as_str(), |(_, url)| url);
                check_url(url, &mut |m| error("signals.scrape", m));
            }
            if let Some(server) = &signals.server
                && server != "vllm"
                && server != "sglang"
            {
                error(
                    "signals.server",
                    format!("{server:?} is not a server profile: use \"vllm\" or \"sglang\""),
                );
            }
            let bounds = entry.bounds;
            if bounds.max_concurrency == 0 {
                error("bounds.max_concurrency", "must be at least 1".to_string());
            }
            for (field, value) in [
                ("bounds.max_rate", bounds.max_rate),
                ("bounds.max_stage_duration_s", bounds.max_stage_duration_s),
                ("bounds.max_total_duration_s", bounds.max_total_duration_s),
            ] {
                if !(value.is_finite() && value > 0.0) {
                    error(field, format!("{value} must be a positive number"));
                }
            }
            if bounds.max_stages == 0 || bounds.max_stages > MAX_STAGES {
                error(
                    "bounds.max_stages",
                    format!("{} must be between 1 and {MAX_STAGES}", bounds.max_stages),
                );
            }
            let policies = entry
                .policies
                .unwrap_or_else(|| vec!["builtin".to_string()]);
            if policies.is_empty() {
                error(
                    "policies",
                    "an empty list allows no policy: list \"builtin\" or component files"
                        .to_string(),
                );
            }
            for policy in &policies {
                if let Err(why) = check_policy(policy) {
                    error("policies", why);
                }
            }
            if entry.workers == 0 || entry.workers > MAX_WORKERS {
                error(
                    "workers",
                    format!("{} must be between 1 and {MAX_WORKERS}", entry.workers),
                );
            }
            let target = Target {
                workers: entry.workers,
                name: name.clone(),
                url: entry.url,
                model: entry.model,
                signals: entry.signals,
                bounds,
                policies,
            };
            targets.insert(name, target);
        }
        if errors.is_empty() {
            Ok(Targets(targets))
        } else {
            Err(TargetsError(errors))
        }
    }

    pub fn get(&self, name: &str) -> Option<&Target> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Target> {
        self.0.values()
    }

    /// The names, for an error about an unknown one.
    pub fn names(&self) -> String {
        self.0.keys().cloned().collect::<Vec<_>>().join(", ")
    }
}

/// `builtin`, a component file here, or one in a registry pinned by
/// digest (every run of the target is then judged by the same bytes).
fn check_policy(policy: &str) -> Result<(), String> {
    if policy == "builtin" {
        return Ok(());
    }
    if OciReference::is_reference(policy) {
        let reference = OciReference::parse(policy).map_err(|e| e.to_string())?;
        if reference.digest().is_none() {
            return Err(format!(
                "{policy:?} names no digest: pin it, oci://{}/{}@sha256:... (what `policy push` prints), so that every run is judged by the same bytes",
                reference.registry(),
                reference.repository()
            ));
        }
        return Ok(());
    }
    if Path::new(policy).is_file() {
        return Ok(());
    }
    Err(format!(
        "{policy:?} is neither \"builtin\", a component file here, nor oci://...@sha256:..."
    ))
}

/// An `http://` or `https://` URL with a host.
fn check_url(url: &str, error: &mut dyn FnMut(String)) {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') => {}
        _ => error(format!(
            "{url:?} is not an http:// or https:// URL with a host"
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_good_file_in_toml_and_json() {
        let toml = r#"
[targets.sim]
url = "http://127.0.0.1:8000/v1"
model = "m"
signals = { scrape = ["engine=http://127.0.0.1:8001/metrics"] }
bounds = { max_concurrency = 8, max_stages = 10 }
"#;
        let targets = Targets::parse("t.toml", toml, false).unwrap();
        let sim = targets.get("sim").unwrap();
        assert_eq!(sim.bounds.max_concurrency, 8);
        assert_eq!(sim.bounds.max_rate, Bounds::default().max_rate);
        assert_eq!(sim.policies, vec!["builtin"]);
        assert!(sim.signals.is_configured());
        let json = r#"{"targets": {"a": {"url": "https://x"}}}"#;
        let targets = Targets::parse("t.json", json, true).unwrap();
        assert!(!targets.get("a").unwrap().signals.is_configured());
    }

    #[test]
    fn every_error_is_named_at_once() {
        let toml = r#"
[targets."bad name"]
url = "ftp://x"
signals = { prometheus_url = "http://p", server = "tgi" }
bounds = { max_concurrency = 0, max_rate = -1, max_stages = 1000 }
policies = ["/nonexistent.wasm"]
"#;
        let err = Targets::parse("t.toml", toml, false).unwrap_err();
        let text = err.to_string();
        for field in [
            "name:",
            "url:",
            "signals.deploy_name:",
            "signals.server:",
            "bounds.max_concurrency:",
            "bounds.max_rate:",
            "bounds.max_stages:",
            "policies:",
        ] {
            assert!(text.contains(field), "{field} missing from:\n{text}");
        }
        assert_eq!(err.0.len(), 8, "{text}");
    }

    #[test]
    fn registry_policies_must_be_pinned_by_digest() {
        let digest = "sha256:".to_string() + &"a".repeat(64);
        let pinned = format!("oci://registry.example/policies/slo:1@{digest}");
        let toml =
            format!("[targets.a]\nurl = \"http://x\"\npolicies = [\"builtin\", \"{pinned}\"]\n");
        let targets = Targets::parse("t.toml", &toml, false).unwrap();
        assert_eq!(targets.get("a").unwrap().policies[1], pinned);
        let toml = "[targets.a]\nurl = \"http://x\"\npolicies = [\"oci://registry.example/policies/slo:1\"]\n";
        let err = Targets::parse("t.toml", toml, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("names no digest: pin it, oci://registry.example/policies/slo@sha256:"),
            "{err}"
        );
    }

    #[test]
    fn unknown_fields_and_an_empty_file_are_refused() {
        let err =
            Targets::parse("t.toml", "[targets.a]\nurl='http://x'\nurll=1\n", false).unwrap_err();
        assert!(err.to_string().contains("urll"), "{err}");
        let err = Targets::parse("t.toml", "targets = {}\n", false).unwrap_err();
        assert!(err.to_string().contains("no target"), "{err}");
    }
}
