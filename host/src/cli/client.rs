//! The client and run flags of `nyann-bench generate` (flattened into the
//! commands that send load), turned into the load library's [`RunOptions`],
//! whose `Default` gives the defaults they show.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};
use nyann_load::client::ClientError;
use nyann_load::http::{Proxies, TargetError, read_ca_certs};
use nyann_load::{Api, CancellationToken, ClientConfig, RunError, RunOptions};
use nyann_model::{parse_duration, parse_header};

use super::defaults::duration;

/// `--api`: which OpenAI API to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiFlag {
    /// `/chat/completions` with a `messages` list.
    Chat,
    /// `/completions` with a text `prompt`.
    Completions,
}

impl From<Api> for ApiFlag {
    fn from(api: Api) -> ApiFlag {
        match api {
            Api::Chat => ApiFlag::Chat,
            Api::Completions => ApiFlag::Completions,
        }
    }
}

impl From<ApiFlag> for Api {
    fn from(flag: ApiFlag) -> Api {
        match flag {
            ApiFlag::Chat => Api::Chat,
            ApiFlag::Completions => Api::Completions,
        }
    }
}

/// How to reach the server and what to do on failures.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// OpenAI base URL, up to and including `/v1` [default: the scenario's
    /// `target`, else http://localhost:8000/v1]. A stage's own `target` wins.
    /// Reached through HTTP_PROXY / HTTPS_PROXY when set, unless NO_PROXY
    /// names it or it is a loopback address.
    #[arg(long, value_name = "URL")]
    pub target: Option<String>,

    /// Model name [default: the scenario's `model`, else the first model
    /// listed by GET /v1/models]. A stage's own `model` wins.
    #[arg(long)]
    pub model: Option<String>,

    /// Which OpenAI API to call.
    #[arg(long, value_enum, default_value_t = ApiFlag::from(RunOptions::default().client.api))]
    pub api: ApiFlag,

    /// Ask for token usage in the stream (`stream_options.include_usage`), so
    /// output tokens come from the server instead of counted chunks.
    #[arg(long)]
    pub stream_usage: bool,

    /// Do not send vLLM's `ignore_eos`/`min_tokens` extensions (for strict
    /// OpenAI servers; outputs may then be shorter than the workload's osl).
    #[arg(long)]
    pub strict_openai: bool,

    /// API key, sent as `Authorization: Bearer KEY`.
    #[arg(long, env = "NYANN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Extra request header, `'Name: value'` (repeatable).
    #[arg(long = "header", value_name = "'NAME: VALUE'")]
    pub headers: Vec<String>,

    /// PEM file of CA certificates to trust for an https target, Prometheus
    /// or --scrape URL, in addition to the system's (repeatable; for servers
    /// behind a private CA).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,

    /// Time limit of one request, from send to the end of its stream.
    #[arg(long, value_parser = parse_duration, default_value = shown!(duration(RunOptions::default().client.request_timeout)))]
    pub request_timeout: Duration,

    /// Abort the run after this many failed requests in a row (0 = never).
    /// Rejections (429, 503 with Retry-After: a busy server) do not count.
    #[arg(long, default_value_t = RunOptions::default().max_consecutive_errors)]
    pub max_consecutive_errors: u32,

    /// Seed of every random choice (prompts, Poisson arrivals, cache salts)
    /// [default: random, printed in the summary].
    #[arg(long)]
    pub seed: Option<u64>,

    /// How long to wait for GET /v1/models to answer before sending load.
    #[arg(long, value_parser = parse_duration, default_value = shown!(duration(RunOptions::default().ready_timeout)))]
    pub ready_timeout: Duration,

    /// After Ctrl-C/SIGTERM or an abort: how long in-flight requests may still
    /// finish before they are cancelled (a second Ctrl-C/SIGTERM cancels
    /// them at once; results are written either way).
    #[arg(long, value_parser = parse_duration, default_value = shown!(duration(RunOptions::default().grace)))]
    pub grace: Duration,

    /// At a stage's end, how long its requests still in flight may take to
    /// finish (at least: twice the stage's E2E p99 when that is longer)
    /// before they are abandoned, recorded as `late`, and the next stage
    /// starts.
    #[arg(long, value_parser = parse_duration, default_value = shown!(duration(RunOptions::default().drain_timeout)))]
    pub drain_timeout: Duration,

    /// Serve client-side Prometheus metrics (`nyann_*`) on this address, e.g. 127.0.0.1:9400.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
}

impl ClientArgs {
    /// The run options these flags describe (no output dir, a fresh
    /// interrupt token). Reads the `--ca-cert` files.
    pub fn to_options(&self) -> anyhow::Result<RunOptions> {
        if self.request_timeout.is_zero() {
            bail!(
                "--request-timeout 0s would time out every request: give it a time \
                 that a whole response fits in (default {})",
                duration(RunOptions::default().client.request_timeout)
            );
        }
        let headers = self
            .headers
            .iter()
            .map(|h| {
                parse_header(h)
                    .ok_or_else(|| anyhow!("invalid --header {h:?}: write it as 'Name: value'"))
            })
            .collect::<anyhow::Result<_>>()?;
        let mut ca_certs = Vec::new();
        for path in &self.ca_cert {
            ca_certs.extend(read_ca_certs(path).map_err(|e| anyhow!("invalid --ca-cert: {e}"))?);
        }
        let seed = self.seed.unwrap_or_else(rand::random);
        Ok(RunOptions {
            client: ClientConfig {
                api: self.api.into(),
                stream_usage: self.stream_usage,
                length_extensions: !self.strict_openai,
                api_key: self.api_key.clone(),
                headers,
                request_timeout: self.request_timeout,
                ca_certs,
                proxies: Proxies::from_env()
                    .map_err(|e| anyhow!("invalid proxy setting in the environment: {e}"))?,
            },
            target: self.target.clone(),
            model: self.model.clone(),
            seed,
            max_consecutive_errors: self.max_consecutive_errors,
            ready_timeout: self.ready_timeout,
            grace: self.grace,
            drain_timeout: self.drain_timeout,
            output_dir: None,
            interrupt: CancellationToken::new(),
            interrupt_now: CancellationToken::new(),
            live: None,
            first_id: 0,
            dataset_share: None,
        })
    }
}

/// The `--ca-cert` certificates of `options` (DER): the signal sources
/// trust them for Prometheus and `--scrape` URLs as the client does for
/// the target.
pub fn ca_certs(options: &RunOptions) -> Vec<Vec<u8>> {
    let certs = options.client.ca_certs.iter();
    certs.map(|c| c.as_ref().to_vec()).collect()
}

/// A load library error as users read it: with the flags that fix it.
pub fn explain(err: RunError) -> anyhow::Error {
    match &err {
        RunError::Client(ClientError::NotReady { .. }) => {
            anyhow!("{err}; start it, check --target, or raise --ready-timeout")
        }
        RunError::Client(ClientError::NoModel { .. }) => anyhow!("{err}: pass --model"),
        RunError::Client(ClientError::UnknownModel { .. }) => {
            anyhow!("{err}: pass one of them with --model (or model= in the scenario)")
        }
        RunError::Client(ClientError::Certificate { .. }) => anyhow!(
            "{err}; for a private CA or a self-signed server certificate, give it with \
             --ca-cert FILE (PEM)"
        ),
        RunError::Client(ClientError::MissingV1 { suggested, .. }) => {
            anyhow!("{err}: did you mean --target {suggested}?")
        }
        RunError::Client(ClientError::Target {
            reason: TargetError::Credentials,
            ..
        }) => anyhow!("{err}: use --api-key or --header"),
        _ => err.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        client: ClientArgs,
    }

    #[test]
    fn durations_and_headers() {
        let cli = Cli::parse_from([
            "x",
            "--header",
            "X-A: b: c",
            "--seed",
            "3",
            "--request-timeout",
            "2s",
        ]);
        let options = cli.client.to_options().unwrap();
        assert_eq!(
            options.client.headers,
            vec![("X-A".to_string(), "b: c".to_string())]
        );
        assert_eq!(options.seed, 3);
        assert_eq!(options.client.request_timeout, Duration::from_secs(2));
        assert_eq!(options.max_consecutive_errors, 5);
        let bad = Cli::parse_from(["x", "--header", "nocolon"]);
        assert!(bad.client.to_options().is_err());
    }

    #[test]
    fn library_errors_get_the_flags_that_fix_them() {
        let not_ready = RunError::Client(ClientError::NotReady {
            url: "http://127.0.0.1:1/v1/models".into(),
            waited: Duration::from_secs(1),
            last: "refused".into(),
        });
        assert_eq!(
            explain(not_ready).to_string(),
            "the server at http://127.0.0.1:1/v1/models did not answer GET /models within 1s \
             (last error: refused); start it, check --target, or raise --ready-timeout"
        );
        let no_model = RunError::Client(ClientError::NoModel {
            url: "http://h/v1/models".into(),
        });
        assert_eq!(
            explain(no_model).to_string(),
            "GET http://h/v1/models lists no model: pass --model"
        );
        let certificate = RunError::Client(ClientError::Certificate {
            url: "https://h/v1/models".into(),
            why: "cannot connect to h:443: TLS handshake failed: invalid peer certificate: UnknownIssuer".into(),
        });
        assert!(
            explain(certificate)
                .to_string()
                .ends_with("give it with --ca-cert FILE (PEM)")
        );
        let typo = RunError::Client(ClientError::UnknownModel {
            model: "lama".into(),
            url: "http://h/v1/models".into(),
            served: vec!["llama".into(), "qwen".into()],
        });
        assert_eq!(
            explain(typo).to_string(),
            "model \"lama\" is not served at http://h/v1/models (it serves llama, qwen): pass \
             one of them with --model (or model= in the scenario)"
        );
        let no_v1 = RunError::Client(ClientError::MissingV1 {
            url: "http://h:8000/models".into(),
            suggested: "http://h:8000/v1".into(),
        });
        assert_eq!(
            explain(no_v1).to_string(),
            "http://h:8000/models is not found (HTTP 404), but http://h:8000/v1/models answers: \
             did you mean --target http://h:8000/v1?"
        );
        let credentials = RunError::Client(ClientError::Target {
            base: "http://u:p@h/v1".into(),
            reason: TargetError::Credentials,
        });
        assert_eq!(
            explain(credentials).to_string(),
            "invalid target URL \"http://u:p@h/v1\": user names and passwords in the URL are \
             not supported: use --api-key or --header"
        );
    }

    #[test]
    fn a_zero_request_timeout_is_refused() {
        for zero in ["0s", "0", "0ms"] {
            let cli = Cli::parse_from(["x", "--request-timeout", zero]);
            let err = cli.client.to_options().unwrap_err().to_string();
            assert!(err.contains("--request-timeout 0s"), "{zero}: {err}");
        }
    }
}
