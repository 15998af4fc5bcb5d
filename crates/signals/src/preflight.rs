//! Before any load: does every role find its server's series? A mistyped
//! deployment name, a `/metrics` without the server's series or the wrong
//! server profile would otherwise read 0 for every signal of every stage, and a
//! sweep meant to stop on congestion would run to its last stage.
//!
//! Each source looks (one Prometheus query per role, or one scrape per URL)
//! and reports the series names it found per role as a [`RoleFinding`];
//! this module turns the findings into the verdict: a role that finds
//! nothing refuses the start (unless missing signals are allowed), with
//! what does exist that looks like the server and the [`Suggestion`]s that
//! would read it; a role that finds some signals but not others starts with
//! a warning per missing signal. The binary words the suggestions as flags.

use std::collections::BTreeMap;
use std::fmt;

use crate::SignalError;
use crate::config::{RoleSelector, default_job, default_roles, promql_string, regex_literal};
use crate::profile::{Family, MetricNames, Server};
use crate::spec::signals_of;

/// Which kind of source looked: what to fix differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Prometheus,
    Scrape,
}

/// A change of the options that would likely find a role's series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Suggestion {
    /// Read another server's metric names.
    Server(Server),
    /// Another deployment name.
    DeployName(String),
    /// A selector of `role` with these matchers (inside the braces).
    Selector { role: String, matchers: String },
}

impl fmt::Display for Suggestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Suggestion::Server(server) => write!(f, "server {}", server.flag()),
            Suggestion::DeployName(name) => write!(f, "deployment name {name}"),
            Suggestion::Selector { role, matchers } => {
                write!(f, "selector {role}='{{{matchers}}}'")
            }
        }
    }
}

/// Something that exists and looks like the server, and what would read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    pub found: String,
    pub suggestions: Vec<Suggestion>,
}

impl Hint {
    fn plain(found: impl Into<String>) -> Hint {
        Hint {
            found: found.into(),
            suggestions: Vec::new(),
        }
    }
}

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.found)?;
        if !self.suggestions.is_empty() {
            let list: Vec<String> = self.suggestions.iter().map(|s| s.to_string()).collect();
            write!(f, "; did you mean {}?", list.join(", "))?;
        }
        Ok(())
    }
}

/// A role that found no series of any signal: where it looked, and hints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlindRole {
    pub summary: String,
    pub hints: Vec<Hint>,
}

impl fmt::Display for BlindRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary)?;
        for hint in &self.hints {
            write!(f, "\n  {hint}")?;
        }
        Ok(())
    }
}

/// The refusal to start: roles that found nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NothingFound {
    pub roles: Vec<BlindRole>,
    pub kind: SourceKind,
}

impl fmt::Display for NothingFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for role in &self.roles {
            writeln!(f, "{role}")?;
        }
        f.write_str(
            "fix the source's roles or server profile, or allow missing signals to start anyway \
             (the role's signals then read 0 at every stage)",
        )
    }
}

/// A warning before the first stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreflightWarning {
    /// A role misses some signals (they read 0, recorded as no data).
    Missing(String),
    /// A role found nothing, and missing signals are allowed.
    Blind(BlindRole),
}

impl fmt::Display for PreflightWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PreflightWarning::Missing(text) => f.write_str(text),
            PreflightWarning::Blind(role) => write!(
                f,
                "{role}\nstarting anyway: every signal of the role reads 0, recorded as no data"
            ),
        }
    }
}

/// What one role found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoleFinding {
    pub role: String,
    /// Where it looked: `selector {...}` or `http://host/metrics`.
    pub place: String,
    /// Series names found (histograms as `NAME_bucket`) and their number of
    /// series.
    pub present: BTreeMap<String, u64>,
    /// What exists that looks like the server, when nothing was found.
    pub hints: Vec<Hint>,
}

/// The findings of every role of one source.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    /// `Prometheus http://...` or `the scraped metrics`.
    pub source: String,
    pub kind: SourceKind,
    pub roles: Vec<RoleFinding>,
}

impl Report {
    /// The warnings to log before the first stage, or the refusal when a role
    /// found nothing and `allow_missing` is off.
    pub fn conclude(
        &self,
        names: &MetricNames,
        allow_missing: bool,
    ) -> Result<Vec<PreflightWarning>, SignalError> {
        let mut warnings = Vec::new();
        let mut blind = Vec::new();
        for finding in &self.roles {
            if !names.finds_any(&finding.present) {
                blind.push(self.nothing_found(finding, names));
                continue;
            }
            for family in Family::ALL {
                if names.first_present(family, &finding.present).is_none() {
                    warnings.push(PreflightWarning::Missing(
                        self.missing_family(finding, names, family),
                    ));
                }
            }
        }
        if blind.is_empty() {
            return Ok(warnings);
        }
        if allow_missing {
            warnings.extend(blind.into_iter().map(PreflightWarning::Blind));
            return Ok(warnings);
        }
        Err(SignalError::NothingFound(NothingFound {
            roles: blind,
            kind: self.kind,
        }))
    }

    fn nothing_found(&self, finding: &RoleFinding, names: &MetricNames) -> BlindRole {
        let tried = names.get(Family::Waiting).join(", ");
        BlindRole {
            summary: format!(
                "role {}: no series of any signal in {} at {} ({} names, e.g. {tried})",
                finding.role,
                self.source,
                finding.place,
                names.server().name()
            ),
            hints: finding.hints.clone(),
        }
    }

    fn missing_family(&self, finding: &RoleFinding, names: &MetricNames, family: Family) -> String {
        let signals = signals_of(family).join(", ");
        let mut text = format!(
            "role {}: no series for {} in {} at {} (tried {}): {signals} read 0 at every stage, recorded as no data",
            finding.role,
            family.key(),
            self.source,
            finding.place,
            names.get(family).join(", ")
        );
        if names.server() == Server::Sglang {
            text.push_str(
                " (SGLang creates some series at their first observation: they may appear once load starts)",
            );
        }
        text
    }
}

/// One series Prometheus has that looks like a server's: its target labels
/// and metric name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
    pub labels: BTreeMap<String, String>,
    pub metric: String,
}

/// At most this many candidates are listed.
const MAX_CANDIDATES: usize = 5;

/// `found job="x", pod="y"` hints (with another deployment name, a selector
/// or another server to try) for a role whose selector matches nothing,
/// from the series of every server's queue-length metric Prometheus has.
pub(crate) fn prometheus_hints(
    role: &RoleSelector,
    server: Server,
    candidates: &[Candidate],
) -> Vec<Hint> {
    if candidates.is_empty() {
        return vec![Hint::plain(
            "Prometheus has no series of any server's queue length (vllm:num_requests_waiting, sglang:num_queue_reqs): is it scraping the servers, and do they export metrics (SGLang needs --enable-metrics)?",
        )];
    }
    let target = |c: &Candidate| -> Vec<(String, String)> {
        let has_pod = c.labels.contains_key("pod");
        ["job", "namespace", "pod", "instance"]
            .into_iter()
            .filter(|k| *k != "instance" || !has_pod)
            .filter_map(|k| c.labels.get(k).map(|v| (k.to_string(), v.clone())))
            .collect()
    };
    let default_job = default_job(&role.role);
    let mut seen: Vec<(Vec<(String, String)>, String)> = Vec::new();
    for c in candidates {
        let t = target(c);
        if !seen.iter().any(|(s, _)| *s == t) {
            seen.push((t, c.metric.clone()));
        }
    }
    // The role's own job first: the likeliest fix is then a name.
    seen.sort_by_key(|(t, _)| {
        let job = t.iter().find(|(k, _)| k == "job").map(|(_, v)| v.as_str());
        job != default_job
    });
    let mut hints: Vec<Hint> = seen
        .iter()
        .take(MAX_CANDIDATES)
        .map(|(t, metric)| {
            let labels = t
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", promql_string(v)))
                .collect::<Vec<_>>()
                .join(", ");
            let mut fix = Vec::new();
            if let Some(other) = Server::of_metric(metric).filter(|s| *s != server) {
                fix.push(Suggestion::Server(other));
            }
            let get = |key: &str| t.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
            let job = get("job");
            match get("pod") {
                Some(pod)
                    if role.from_deploy_name && job == default_job && role.role != "prefill" =>
                {
                    // Unless that is the name given (only the server differs).
                    let stem = pod_stem(pod);
                    let given = default_roles(stem)
                        .iter()
                        .any(|r| r.role == role.role && r.matchers == role.matchers);
                    if !given {
                        fix.push(Suggestion::DeployName(stem.to_string()));
                    }
                }
                Some(pod) => fix.push(Suggestion::Selector {
                    role: role.role.clone(),
                    matchers: format!(
                        "job=\"{}\",pod=~\"{}.*\"",
                        promql_string(job.unwrap_or_default()),
                        promql_string(&regex_literal(pod_stem(pod)))
                    ),
                }),
                // Series without a label to select them by: a selector of
                // no matcher would match everything, so none is suggested.
                None if t.is_empty() => {}
                None => fix.push(Suggestion::Selector {
                    role: role.role.clone(),
                    matchers: labels.clone(),
                }),
            }
            let found = if t.is_empty() {
                format!("found {metric} without a job, namespace, pod or instance label")
            } else {
                format!("found {labels} ({metric})")
            };
            Hint {
                found,
                suggestions: fix,
            }
        })
        .collect();
    if seen.len() > MAX_CANDIDATES {
        hints.push(Hint::plain(format!(
            "and {} more",
            seen.len() - MAX_CANDIDATES
        )));
    }
    hints
}

/// The hint for a scraped `/metrics` that has none of the profile's names.
pub(crate) fn scrape_hint(url: &str, server: Server, body_names: &BTreeMap<String, u64>) -> Hint {
    let other = body_names.keys().find_map(|n| {
        Server::of_metric(n)
            .filter(|s| *s != server)
            .map(|s| (s, n))
    });
    match other {
        Some((other, name)) => Hint {
            found: format!("{url} serves {} series ({name})", other.name()),
            suggestions: vec![Suggestion::Server(other)],
        },
        None => Hint::plain(format!(
            "{url} serves {} series names, none of them a vLLM or SGLang signal: is it the server's metrics endpoint (SGLang needs --enable-metrics)?",
            body_names.len()
        )),
    }
}

/// The deployment part of a Kubernetes pod name: without a StatefulSet
/// ordinal (`model-0`) or a Deployment's ReplicaSet and pod hashes
/// (`model-7d9f8b6c5d-x2k4q`).
pub(crate) fn pod_stem(pod: &str) -> &str {
    // Kubernetes' rand.SafeEncodeString alphabet (no vowels, no 0/1/3).
    let hashlike = |s: &str, lens: std::ops::RangeInclusive<usize>| {
        lens.contains(&s.len()) && s.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
    };
    if let Some((stem, ordinal)) = pod.rsplit_once('-')
        && !stem.is_empty()
        && !ordinal.is_empty()
        && ordinal.chars().all(|c| c.is_ascii_digit())
    {
        return stem;
    }
    if let Some((rest, pod_hash)) = pod.rsplit_once('-')
        && let Some((stem, set_hash)) = rest.rsplit_once('-')
        && !stem.is_empty()
        && hashlike(pod_hash, 5..=5)
        && hashlike(set_hash, 6..=10)
    {
        return stem;
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{default_roles, resolve_roles};

    fn finding(role: &str, present: &[&str]) -> RoleFinding {
        RoleFinding {
            role: role.into(),
            place: "selector {job=\"x\"}".into(),
            present: present.iter().map(|n| (n.to_string(), 1)).collect(),
            hints: vec![Hint::plain("found something")],
        }
    }

    fn report(roles: Vec<RoleFinding>) -> Report {
        Report {
            source: "Prometheus http://127.0.0.1:9".into(),
            kind: SourceKind::Prometheus,
            roles,
        }
    }

    #[test]
    fn pod_stems() {
        assert_eq!(pod_stem("mymodel-0"), "mymodel");
        assert_eq!(pod_stem("my-model-decode-12"), "my-model-decode");
        assert_eq!(pod_stem("llama-7d9f8b6c5d-x2k4q"), "llama");
        assert_eq!(pod_stem("llama"), "llama");
        assert_eq!(pod_stem("llama-predictor"), "llama-predictor");
        assert_eq!(pod_stem("-0"), "-0");
    }

    #[test]
    fn a_role_that_finds_nothing_refuses_unless_allowed() {
        let names = MetricNames::default();
        let r = report(vec![
            finding("prefill", &["vllm:num_requests_waiting"]),
            finding("decode", &["process_cpu_seconds_total"]),
        ]);
        let e = r.conclude(&names, false).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "role decode: no series of any signal in Prometheus http://127.0.0.1:9 at selector {job=\"x\"} (vLLM names, e.g. vllm:num_requests_waiting"
            ),
            "{e}"
        );
        assert!(
            e.ends_with(
                "\n  found something\nfix the source's roles or server profile, or allow missing signals to start anyway (the role's signals then read 0 at every stage)"
            ),
            "{e}"
        );
        // Allowed: the refusal becomes a warning, beside prefill's gaps.
        let w = r.conclude(&names, true).unwrap();
        assert!(
            w.iter().any(|w| w.to_string().contains("starting anyway")),
            "{w:?}"
        );
        assert!(w.iter().any(|w| {
            w.to_string()
                .starts_with("role prefill: no series for preemptions")
        }));
    }

    #[test]
    fn a_role_missing_some_signals_warns_per_signal_with_the_names_tried() {
        let names = MetricNames::default();
        let all_but_preemptions: Vec<String> = Family::ALL
            .into_iter()
            .filter(|f| *f != Family::Preemptions)
            .map(|f| f.series_name(&names.get(f)[0]))
            .collect();
        let refs: Vec<&str> = all_but_preemptions.iter().map(String::as_str).collect();
        let w = report(vec![finding("aggregate", &refs)])
            .conclude(&names, false)
            .unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(
            w[0].to_string(),
            "role aggregate: no series for preemptions in Prometheus http://127.0.0.1:9 at selector {job=\"x\"} (tried vllm:num_preemptions_total, vllm_num_preemptions_total): preemptions read 0 at every stage, recorded as no data"
        );
        // Everything there: nothing to say.
        let mut every = refs.clone();
        every.push("vllm:num_preemptions_total");
        assert!(
            report(vec![finding("aggregate", &every)])
                .conclude(&names, false)
                .unwrap()
                .is_empty()
        );
    }

    fn shown(hints: Vec<Hint>) -> Vec<String> {
        hints.iter().map(Hint::to_string).collect()
    }

    fn candidate(labels: &[(&str, &str)], metric: &str) -> Candidate {
        Candidate {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            metric: metric.into(),
        }
    }

    #[test]
    fn hints_suggest_the_deploy_name_a_selector_or_the_server() {
        let role = &default_roles("mymdel")[0];
        let hints = shown(prometheus_hints(
            role,
            Server::Vllm,
            &[
                candidate(
                    &[
                        ("job", "other"),
                        ("pod", "x-0"),
                        ("instance", "10.0.0.1:8000"),
                    ],
                    "vllm:num_requests_waiting",
                ),
                candidate(
                    &[("job", "vllm-aggregate"), ("pod", "mymodel-0")],
                    "vllm:num_requests_waiting",
                ),
                candidate(
                    &[("job", "vllm-aggregate"), ("pod", "mymodel-0")],
                    "vllm_num_requests_waiting",
                ),
                candidate(
                    &[("job", "sg"), ("instance", "10.0.0.2:30000")],
                    "sglang:num_queue_reqs",
                ),
            ],
        ));
        assert_eq!(
            hints,
            [
                "found job=\"vllm-aggregate\", pod=\"mymodel-0\" (vllm:num_requests_waiting); did you mean deployment name mymodel?",
                "found job=\"other\", pod=\"x-0\" (vllm:num_requests_waiting); did you mean selector aggregate='{job=\"other\",pod=~\"x.*\"}'?",
                "found job=\"sg\", instance=\"10.0.0.2:30000\" (sglang:num_queue_reqs); did you mean server sglang, selector aggregate='{job=\"sg\", instance=\"10.0.0.2:30000\"}'?",
            ]
        );
        // A selector's role is never told to change the deployment name.
        let role = &resolve_roles(
            None,
            &["decode={job=\"vllm-decode\",pod=~\"a.*\"}".parse().unwrap()],
        )[0];
        let hints = shown(prometheus_hints(
            role,
            Server::Vllm,
            &[candidate(
                &[("job", "vllm-decode"), ("pod", "m.1-0")],
                "vllm:num_requests_waiting",
            )],
        ));
        assert!(
            hints[0].ends_with(
                "did you mean selector decode='{job=\"vllm-decode\",pod=~\"m\\\\.1.*\"}'?"
            ),
            "{hints:?}"
        );
        let many: Vec<Candidate> = (0..8)
            .map(|i| {
                candidate(
                    &[("job", "j"), ("pod", &format!("p{i}-0"))],
                    "vllm:num_requests_waiting",
                )
            })
            .collect();
        let hints = shown(prometheus_hints(role, Server::Vllm, &many));
        assert_eq!(hints.len(), MAX_CANDIDATES + 1);
        assert_eq!(hints[MAX_CANDIDATES], "and 3 more");
        assert!(
            prometheus_hints(role, Server::Vllm, &[])[0]
                .found
                .contains("is it scraping the servers")
        );
        // The right name and the wrong server: only the server is to change.
        let role = &default_roles("mymodel")[0];
        let hints = prometheus_hints(
            role,
            Server::Vllm,
            &[candidate(
                &[("job", "vllm-aggregate"), ("pod", "mymodel-0")],
                "sglang:num_queue_reqs",
            )],
        );
        assert_eq!(
            hints,
            [Hint {
                found: "found job=\"vllm-aggregate\", pod=\"mymodel-0\" (sglang:num_queue_reqs)"
                    .into(),
                suggestions: vec![Suggestion::Server(Server::Sglang)],
            }]
        );
    }

    #[test]
    fn scrape_hints_name_the_other_server() {
        let body = |names: &[&str]| {
            names
                .iter()
                .map(|n| (n.to_string(), 1))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            scrape_hint(
                "http://h/metrics",
                Server::Vllm,
                &body(&["python_info", "sglang:num_queue_reqs"])
            ),
            Hint {
                found: "http://h/metrics serves SGLang series (sglang:num_queue_reqs)".into(),
                suggestions: vec![Suggestion::Server(Server::Sglang)],
            }
        );
        assert!(
            scrape_hint("http://h/metrics", Server::Vllm, &body(&["python_info"]))
                .found
                .contains("serves 1 series names, none of them a vLLM or SGLang signal")
        );
    }
}
