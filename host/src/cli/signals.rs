//! The server-signal flags (Prometheus, direct scraping, metric names),
//! turned into the signals library's [`SignalOptions`], whose `Default`
//! gives the defaults they show.

use std::path::PathBuf;
use std::time::Duration;

use nyann_model::parse_duration;
use nyann_signals::{
    BlindRole, ClientCertError, ClientCertFile, Hint, MetricOverride, PreflightWarning,
    RoleSelector, ScrapeTarget, Server, SignalError, SignalOptions, SourceKind, Suggestion,
};

use super::defaults::duration;

/// `--server`: which server's metric names to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerFlag {
    Vllm,
    Sglang,
}

impl From<Server> for ServerFlag {
    fn from(server: Server) -> ServerFlag {
        match server {
            Server::Vllm => ServerFlag::Vllm,
            Server::Sglang => ServerFlag::Sglang,
        }
    }
}

impl From<ServerFlag> for Server {
    fn from(flag: ServerFlag) -> Server {
        match flag {
            ServerFlag::Vllm => Server::Vllm,
            ServerFlag::Sglang => Server::Sglang,
        }
    }
}

/// Flags that choose and configure the server-signal source. Flatten into a
/// command with `#[command(flatten)]`.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Server signals")]
pub struct SignalArgs {
    /// Prometheus base URL (e.g. http://prometheus:9090) to read server
    /// signals from with range queries after each stage.
    #[arg(long, value_name = "URL")]
    pub prometheus_url: Option<String>,

    /// Deployment name. If it contains `-decode`: roles `prefill` (job
    /// "vllm-prefill", pod=~"<NAME with -decode replaced by -prefill>.*") and
    /// `decode` (job "vllm-decode", pod=~"NAME.*"); otherwise one role
    /// `aggregate` (job "vllm-aggregate", pod=~"NAME.*"). NAME is escaped
    /// (regex and PromQL string), so it matches literally.
    #[arg(long, value_name = "NAME")]
    pub deploy_name: Option<String>,

    /// Series selector of a role, replacing its default or defining a new
    /// role, e.g. decode='{namespace="llm",pod=~"isvc-predictor-.*"}'.
    /// Repeatable. The selector is passed to Prometheus as written: `=~`
    /// values are regexes and are NOT escaped.
    #[arg(long = "selector", value_name = "ROLE={MATCHERS}")]
    pub selectors: Vec<RoleSelector>,

    /// Sample a server's /metrics directly during stages (no Prometheus
    /// needed). ROLE defaults to `aggregate`; several URLs of one role are
    /// combined like pods. `host:port` means http://host:port/metrics.
    /// Repeatable.
    #[arg(long = "scrape", value_name = "[ROLE=]URL")]
    pub scrape: Vec<ScrapeTarget>,

    /// How often --scrape samples each URL.
    #[arg(long, default_value = shown!(duration(SignalOptions::default().scrape_interval)), value_name = "DURATION", value_parser = parse_duration)]
    pub scrape_interval: Duration,

    /// Timeout of one --scrape request.
    #[arg(long, default_value = shown!(duration(SignalOptions::default().scrape_timeout)), value_name = "DURATION", value_parser = parse_duration)]
    pub scrape_timeout: Duration,

    /// Fixed delay after a stage before its signals are computed (on top of
    /// --settle-wait).
    #[arg(long, default_value = shown!(duration(SignalOptions::default().settle)), value_name = "DURATION", value_parser = parse_duration)]
    pub settle: Duration,

    /// Longest wait after a stage for samples covering its end to be
    /// ingested (Prometheus) or scraped (--scrape). 0s disables the wait.
    #[arg(long, default_value = shown!(duration(SignalOptions::default().settle_wait)), value_name = "DURATION", value_parser = parse_duration)]
    pub settle_wait: Duration,

    /// Timeout of one Prometheus query.
    #[arg(long, default_value = shown!(duration(SignalOptions::default().prometheus_timeout)), value_name = "DURATION", value_parser = parse_duration)]
    pub prometheus_timeout: Duration,

    /// Bearer token sent to Prometheus (Authorization header).
    #[arg(
        long,
        env = "NYANN_PROMETHEUS_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub prometheus_bearer_token: Option<String>,

    /// Extra HTTP header sent to Prometheus, e.g. 'X-Scope-OrgID: team-a'.
    /// Repeatable.
    #[arg(long = "prometheus-header", value_name = "NAME: VALUE", value_parser = header)]
    pub prometheus_headers: Vec<(String, String)>,

    /// Which server's metric names to read (the profile table of docs/signals.md):
    /// vllm, or sglang (`sglang:num_queue_reqs`, `sglang:token_usage`, ...).
    #[arg(
        long,
        value_enum,
        default_value_t = ServerFlag::from(SignalOptions::default().server),
        value_name = "SERVER")]
    pub server: ServerFlag,

    /// Metric names of a signal, tried in order until one has data, on top
    /// of the --server profile, e.g. kv_cache_usage=my:kv_usage. SIGNAL is
    /// one of waiting, running, kv_cache_usage, ttft, itl, preemptions,
    /// generation_tokens (histograms without `_bucket`). Repeatable.
    #[arg(
        long = "metric",
        id = "metric_names",
        value_name = "SIGNAL=NAME[,NAME...]"
    )]
    pub metrics: Vec<MetricOverride>,

    /// Start even when a role finds no series of any signal before the first
    /// stage (its signals then read 0 at every stage, recorded as "no
    /// data"). Without it, such a role refuses to start.
    #[arg(long)]
    pub allow_missing_signals: bool,

    /// Client certificate (PEM) presented to Prometheus (mutual TLS); needs
    /// --prometheus-client-key.
    #[arg(long, value_name = "FILE", requires = "prometheus_client_key")]
    pub prometheus_client_cert: Option<PathBuf>,

    /// Private key (PEM) of --prometheus-client-cert.
    #[arg(long, value_name = "FILE", requires = "prometheus_client_cert")]
    pub prometheus_client_key: Option<PathBuf>,
}

impl SignalArgs {
    /// The signal sources' options; `ca_certs` (DER, from `--ca-cert`) are
    /// trusted for Prometheus and --scrape URLs as for the target.
    pub fn to_options(&self, ca_certs: Vec<Vec<u8>>) -> SignalOptions {
        let scrape_only = self.prometheus_url.is_none() && !self.scrape.is_empty();
        if scrape_only && (self.deploy_name.is_some() || !self.selectors.is_empty()) {
            tracing::warn!(
                "--deploy-name and --selector apply to --prometheus-url; with --scrape, roles come from ROLE=URL"
            );
        }
        SignalOptions {
            prometheus_url: self.prometheus_url.clone(),
            deploy_name: self.deploy_name.clone(),
            selectors: self.selectors.clone(),
            scrape: self.scrape.clone(),
            scrape_interval: self.scrape_interval,
            scrape_timeout: self.scrape_timeout,
            settle: self.settle,
            settle_wait: self.settle_wait,
            prometheus_timeout: self.prometheus_timeout,
            prometheus_bearer_token: self.prometheus_bearer_token.clone(),
            prometheus_headers: self.prometheus_headers.clone(),
            server: self.server.into(),
            metrics: self.metrics.clone(),
            allow_missing_signals: self.allow_missing_signals,
            prometheus_client_cert: self.prometheus_client_cert.clone(),
            prometheus_client_key: self.prometheus_client_key.clone(),
            ca_certs,
        }
    }
}

/// A signals library error as users read it: naming the flags.
pub fn explain(err: SignalError) -> anyhow::Error {
    let message = match &err {
        SignalError::Selector { value, why } => format!("--selector {value:?}: {why}"),
        SignalError::Scrape { value, why } => format!("--scrape {value:?}: {why}"),
        SignalError::Metric { value, why } => format!("--metric {value:?}: {why}"),
        SignalError::PrometheusUrl { url, why } => format!("--prometheus-url {url:?}: {why}"),
        SignalError::NoRoles => "--prometheus-url needs roles: give --deploy-name NAME or at \
                                 least one --selector ROLE={...}"
            .into(),
        SignalError::BothSources => "give either --prometheus-url or --scrape, not both: they \
                                     are two sources of the same signals"
            .into(),
        SignalError::ZeroDuration { option } => {
            format!("--{} must be greater than zero", option.replace('_', "-"))
        }
        SignalError::CaCert(why) => format!("invalid --ca-cert: {why}"),
        SignalError::ClientCert(cert) => client_cert(cert),
        SignalError::Unreachable { kind, .. } => {
            let fix = match kind {
                SourceKind::Prometheus => {
                    "check --prometheus-url (and, for a secured Prometheus, --ca-cert, \
                     --prometheus-bearer-token or --prometheus-client-cert); no load was sent"
                }
                SourceKind::Scrape => {
                    "check the --scrape URL (and --ca-cert for https); no load was sent"
                }
            };
            format!("{err}\n{fix}")
        }
        SignalError::NothingFound(nothing) => {
            let fix = match nothing.kind {
                SourceKind::Prometheus => "fix --deploy-name or --selector (or --server)",
                SourceKind::Scrape => "fix the --scrape URL (or --server)",
            };
            let roles: Vec<String> = nothing.roles.iter().map(blind_role).collect();
            format!(
                "{}\n{fix}; or pass --allow-missing-signals to start anyway (the role's signals \
                 then read 0 at every stage)",
                roles.join("\n")
            )
        }
        _ => return err.into(),
    };
    anyhow::Error::msg(message)
}

fn client_cert(err: &ClientCertError) -> String {
    match err {
        ClientCertError::Unpaired => {
            "give both --prometheus-client-cert and --prometheus-client-key".into()
        }
        ClientCertError::Unreadable { file, path, why } => {
            let flag = match file {
                ClientCertFile::Certificate => "prometheus-client-cert",
                ClientCertFile::Key => "prometheus-client-key",
            };
            format!("--{flag} {}: cannot read it: {why}", path.display())
        }
        ClientCertError::NoCertificate(path) => format!(
            "--prometheus-client-cert {}: no PEM certificate in it (expected -----BEGIN \
             CERTIFICATE-----)",
            path.display()
        ),
        ClientCertError::NoKey(path) => format!(
            "--prometheus-client-key {}: no PEM private key in it (expected -----BEGIN ... \
             PRIVATE KEY-----)",
            path.display()
        ),
        ClientCertError::Unusable { cert, key, why } => format!(
            "--prometheus-client-cert {} with --prometheus-client-key {}: {why}",
            cert.display(),
            key.display()
        ),
    }
}

/// A preflight warning as users read it: naming the flags.
pub fn warning(warning: &PreflightWarning) -> String {
    match warning {
        PreflightWarning::Missing(text) => text.clone(),
        PreflightWarning::Blind(role) => format!(
            "{}\nstarting anyway (--allow-missing-signals): every signal of the role reads 0, \
             recorded as no data",
            blind_role(role)
        ),
    }
}

fn blind_role(role: &BlindRole) -> String {
    let mut text = role.summary.clone();
    for hint in &role.hints {
        text.push_str("\n  ");
        text.push_str(&self::hint(hint));
    }
    text
}

/// `found ...; did you mean --deploy-name x?`
fn hint(hint: &Hint) -> String {
    if hint.suggestions.is_empty() {
        return hint.found.clone();
    }
    let flags: Vec<String> = hint
        .suggestions
        .iter()
        .map(|s| match s {
            Suggestion::Server(server) => format!("--server {}", server.flag()),
            Suggestion::DeployName(name) => format!("--deploy-name {name}"),
            Suggestion::Selector { role, matchers } => {
                format!("--selector {role}='{{{matchers}}}'")
            }
        })
        .collect();
    format!("{}; did you mean {}?", hint.found, flags.join(" "))
}

/// `Name: value` (clap's value parser).
fn header(text: &str) -> Result<(String, String), String> {
    nyann_model::parse_header(text).ok_or_else(|| "expected 'Name: Value'".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        signals: SignalArgs,
    }

    #[test]
    fn library_errors_name_the_flags() {
        let cases = [
            (
                SignalError::Selector {
                    value: "d".into(),
                    why: "expected ROLE={...}".into(),
                },
                "--selector \"d\": expected ROLE={...}",
            ),
            (
                SignalError::Scrape {
                    value: "ftp://x".into(),
                    why: "w".into(),
                },
                "--scrape \"ftp://x\": w",
            ),
            (
                SignalError::Metric {
                    value: "x".into(),
                    why: "w".into(),
                },
                "--metric \"x\": w",
            ),
            (
                SignalError::PrometheusUrl {
                    url: "u".into(),
                    why: "w".into(),
                },
                "--prometheus-url \"u\": w",
            ),
            (
                SignalError::NoRoles,
                "--prometheus-url needs roles: give --deploy-name NAME or at least one \
                 --selector ROLE={...}",
            ),
            (
                SignalError::BothSources,
                "give either --prometheus-url or --scrape, not both: they are two sources of \
                 the same signals",
            ),
            (
                SignalError::ZeroDuration {
                    option: "scrape_interval",
                },
                "--scrape-interval must be greater than zero",
            ),
            (SignalError::CaCert("bad".into()), "invalid --ca-cert: bad"),
            (
                SignalError::ClientCert(ClientCertError::Unreadable {
                    file: ClientCertFile::Key,
                    path: "/k.pem".into(),
                    why: "gone".into(),
                }),
                "--prometheus-client-key /k.pem: cannot read it: gone",
            ),
            (
                SignalError::ClientCert(ClientCertError::Unpaired),
                "give both --prometheus-client-cert and --prometheus-client-key",
            ),
        ];
        for (err, expected) in cases {
            assert_eq!(explain(err).to_string(), expected);
        }
    }

    #[test]
    fn preflight_hints_name_the_flags() {
        let role = BlindRole {
            summary: "role aggregate: no series".into(),
            hints: vec![
                Hint {
                    found: "found job=\"sg\", instance=\"h:1\" (sglang:num_queue_reqs)".into(),
                    suggestions: vec![
                        Suggestion::Server(Server::Sglang),
                        Suggestion::Selector {
                            role: "aggregate".into(),
                            matchers: "job=\"sg\", instance=\"h:1\"".into(),
                        },
                    ],
                },
                Hint {
                    found: "found job=\"vllm-aggregate\", pod=\"m-0\" (vllm:num_requests_waiting)"
                        .into(),
                    suggestions: vec![Suggestion::DeployName("m".into())],
                },
                Hint {
                    found: "and 3 more".into(),
                    suggestions: vec![],
                },
            ],
        };
        let shown = "role aggregate: no series\n  \
            found job=\"sg\", instance=\"h:1\" (sglang:num_queue_reqs); did you mean --server \
            sglang --selector aggregate='{job=\"sg\", instance=\"h:1\"}'?\n  \
            found job=\"vllm-aggregate\", pod=\"m-0\" (vllm:num_requests_waiting); did you mean \
            --deploy-name m?\n  and 3 more";
        let refused = SignalError::NothingFound(nyann_signals::NothingFound {
            roles: vec![role.clone()],
            kind: SourceKind::Prometheus,
        });
        assert_eq!(
            explain(refused).to_string(),
            format!(
                "{shown}\nfix --deploy-name or --selector (or --server); or pass \
                 --allow-missing-signals to start anyway (the role's signals then read 0 at \
                 every stage)"
            )
        );
        assert_eq!(
            warning(&PreflightWarning::Blind(role)),
            format!(
                "{shown}\nstarting anyway (--allow-missing-signals): every signal of the role \
                 reads 0, recorded as no data"
            )
        );
        let unreachable = SignalError::Unreachable {
            from: "http://h/metrics".into(),
            why: "refused".into(),
            kind: SourceKind::Scrape,
        };
        assert_eq!(
            explain(unreachable).to_string(),
            "cannot read server signals from http://h/metrics before the first stage: refused\n\
             check the --scrape URL (and --ca-cert for https); no load was sent"
        );
    }

    #[test]
    fn flags_parse_and_help_mentions_regexes() {
        use clap::{CommandFactory, Parser};
        let cli = Cli::try_parse_from([
            "x",
            "--prometheus-url",
            "http://127.0.0.1:9090",
            "--deploy-name",
            "m-decode",
            "--selector",
            r#"decode={job="a"}"#,
            "--selector",
            r#"prefill={job="b"}"#,
            "--scrape-interval",
            "500ms",
            "--prometheus-timeout",
            "1m30s",
            "--metric",
            "kv_cache_usage=x",
            "--settle-wait",
            "30",
            "--server",
            "sglang",
        ])
        .unwrap();
        let a = cli.signals;
        assert_eq!(a.selectors.len(), 2);
        assert_eq!(a.scrape_interval, Duration::from_millis(500));
        assert_eq!(a.prometheus_timeout, Duration::from_secs(90));
        assert_eq!(a.settle_wait, Duration::from_secs(30));
        assert_eq!(a.server, ServerFlag::Sglang);
        assert_eq!(a.scrape_timeout, SignalOptions::default().scrape_timeout);
        assert!(!a.allow_missing_signals);
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("regexes"), "{help}");
        assert!(Cli::try_parse_from(["x", "--settle", "soon"]).is_err());
        assert!(Cli::try_parse_from(["x", "--settle-wait", "1.5"]).is_err());
        // A client certificate needs its key, and the other way round.
        let e = Cli::try_parse_from(["x", "--prometheus-client-cert", "c.pem"]).unwrap_err();
        assert!(e.to_string().contains("--prometheus-client-key"), "{e}");
        assert!(Cli::try_parse_from(["x", "--prometheus-client-key", "k.pem"]).is_err());
    }
}
