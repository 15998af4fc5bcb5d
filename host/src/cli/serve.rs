//! `nyann-bench serve`: the run service (`nyann_service`) for teams and
//! agents. The flags resolve into its [`Config`], and this file says how
//! its child processes are started: this binary's own `scenario` (the
//! bounded compile of a plan) and `generate` (a run).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use nyann_service::auth::Tokens;
use nyann_service::http::{self, App, tls};
use nyann_service::service::ServiceError;
use nyann_service::{ClusterSettings, Config, Job, Launcher, Service, Target, Targets};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on. The default is loopback only; give a routable
    /// address to serve others (with --tls-cert, or TLS in front).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8089")]
    pub listen: SocketAddr,

    /// Where the run database, the runs' directories and logs are kept.
    #[arg(long, value_name = "DIR")]
    pub data_dir: PathBuf,

    /// The targets clients may name (TOML, or JSON ending in .json): each a
    /// server's URL, model, signal source, bounds and allowed policies.
    /// See docs/service.md.
    #[arg(long, value_name = "FILE")]
    pub targets: PathBuf,

    /// The clients' bearer tokens as SHA-256 digests, each with a name and
    /// a scope (read, submit, admin). See docs/service.md.
    #[arg(long, value_name = "FILE")]
    pub tokens: PathBuf,

    /// Runs at once over all targets (one at a time per target).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_running: u16,

    /// A web origin (scheme://host:port) whose pages may call the service,
    /// besides its own. Repeatable.
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    pub allow_origins: Vec<String>,

    /// A name (host or host:port) clients reach the service by, for MCP's
    /// Host check against DNS rebinding, besides the loopback names, the
    /// --listen address and the --allow-origin hosts (e.g. the in-cluster
    /// Service's DNS name). Repeatable.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,

    /// Serve HTTPS with this certificate chain (PEM), with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Where runs execute: `local`, each a child process on this machine;
    /// `kubernetes`, each a Job in the cluster the service runs in (or
    /// KUBECONFIG names), writing its results on --kube-results-claim,
    /// which must hold --data-dir. See docs/service.md.
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,

    /// The namespace of the runs' Jobs [default: the service's own, or
    /// the kubeconfig's].
    #[arg(long, value_name = "NS")]
    pub kube_namespace: Option<String>,

    /// The image of the runs' pods (with this binary; see the Containerfile).
    #[arg(long, value_name = "IMAGE", required_if_eq("backend", "kubernetes"))]
    pub kube_image: Option<String>,

    /// The PersistentVolumeClaim (ReadWriteMany) that --data-dir is on: the
    /// runs' pods mount it and write their run directories under `runs/`.
    #[arg(long, value_name = "CLAIM", required_if_eq("backend", "kubernetes"))]
    pub kube_results_claim: Option<String>,
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Local,
    Kubernetes,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let targets = Targets::load(&args.targets).map_err(|e| {
        anyhow::anyhow!(
            "the targets file (--targets: the servers runs may target) is not valid:\n{e}"
        )
    })?;
    let tokens = Tokens::load(&args.tokens).map_err(|e| {
        anyhow::anyhow!("the tokens file (--tokens: the clients' token digests) is not valid:\n{e}")
    })?;
    let exe = std::env::current_exe().context("cannot find this binary to start runs with")?;
    let backend = args.backend;
    let cluster = match (args.backend, args.kube_image, args.kube_results_claim) {
        (Backend::Kubernetes, Some(image), Some(results_claim)) => Some(ClusterSettings {
            namespace: args.kube_namespace,
            image,
            results_claim,
        }),
        _ => None,
    };
    let config = Config {
        data_dir: args.data_dir.clone(),
        max_running: usize::from(args.max_running),
        cluster,
    };
    let service = Service::open(config, targets, Arc::new(ChildCommands { exe }))
        .await
        .map_err(|e| match e {
            ServiceError::Cluster(e) => {
                let backend = clap::ValueEnum::to_possible_value(&backend)
                    .map(|v| v.get_name().to_string())
                    .unwrap_or_default();
                anyhow::anyhow!("--backend {backend}: {e}")
            }
            e => anyhow::anyhow!(
                "cannot open the service's data in {}: {e}",
                args.data_dir.display()
            ),
        })?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            tls::server_config(cert, key)
                .map_err(|e| anyhow::anyhow!("--tls-cert/--tls-key: {e}"))?,
        ),
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", args.listen))?;
    let local = listener.local_addr().context("the listening address")?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    // The address as bound (a test gives port 0), on stdout for whoever started us.
    println!("listening on {scheme}://{local}");
    tracing::info!(
        "serving on {scheme}://{local}, data in {}",
        args.data_dir.display()
    );
    let allowed_hosts = http::allowed_hosts(local, &args.allow_origins, &args.allow_hosts);
    let app = App {
        service: Arc::clone(&service),
        tokens: Arc::new(tokens),
        allowed_origins: Arc::new(args.allow_origins),
        allowed_hosts: Arc::new(allowed_hosts),
    };
    let router = http::router(app);
    match tls {
        Some(config) => {
            let listener =
                tls::TlsListener::new(listener, config).context("the listening address")?;
            http::serve(listener, router, shutdown_signal()).await
        }
        None => http::serve(listener, router, shutdown_signal()).await,
    }
    .context("the HTTP server failed")?;
    tracing::info!("shutting down: interrupting the running runs and waiting for their drains");
    service.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// The first Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// This binary's commands, as the service's child processes.
struct ChildCommands {
    exe: PathBuf,
}

impl Launcher for ChildCommands {
    fn compile(&self, scenario: &Path, policy: &str, max_steps: u64) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .args(["--color", "never", "scenario"])
            .arg(scenario)
            .args(["--policy", policy])
            .args(["--max-steps", &max_steps.to_string()]);
        command
    }

    fn run(&self, job: Job<'_>) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .args(["--color", "never", "generate", "--config"])
            .arg(job.scenario)
            .arg("--output-dir")
            .arg(job.output_dir)
            .args(["--policy", job.policy])
            .args(self.target_flags(job.target));
        command
    }

    fn target_flags(&self, target: &Target) -> Vec<String> {
        let mut flags = vec!["--target".to_string(), target.url.clone()];
        let mut flag =
            |name: &str, value: &str| flags.extend([name.to_string(), value.to_string()]);
        if let Some(model) = &target.model {
            flag("--model", model);
        }
        let signals = &target.signals;
        if let Some(url) = &signals.prometheus_url {
            flag("--prometheus-url", url);
        }
        if let Some(deploy) = &signals.deploy_name {
            flag("--deploy-name", deploy);
        }
        for scrape in &signals.scrape {
            flag("--scrape", scrape);
        }
        if let Some(server) = &signals.server {
            flag("--server", server);
        }
        flags
    }
}
