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
use nyann_service::http::{self, App};
use nyann_service::{Config, Job, Launcher, Service, Targets};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on. The default is loopback only; give a routable
    /// address to serve others (with TLS in front).
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
    let config = Config {
        data_dir: args.data_dir.clone(),
        max_running: usize::from(args.max_running),
    };
    let service = Service::open(config, targets, Arc::new(ChildCommands { exe }))
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot open the service's data in {}: {e}",
                args.data_dir.display()
            )
        })?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", args.listen))?;
    let local = listener.local_addr().context("the listening address")?;
    // The address as bound (a test gives port 0), on stdout for whoever started us.
    println!("listening on http://{local}");
    tracing::info!(
        "serving on http://{local}, data in {}",
        args.data_dir.display()
    );
    let allowed_hosts = http::allowed_hosts(local, &args.allow_origins, &args.allow_hosts);
    let app = App {
        service: Arc::clone(&service),
        tokens: Arc::new(tokens),
        allowed_origins: Arc::new(args.allow_origins),
        allowed_hosts: Arc::new(allowed_hosts),
    };
    http::serve(listener, http::router(app), shutdown_signal())
        .await
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
    fn compile(&self, scenario: &Path, policy: &str) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .args(["--color", "never", "scenario"])
            .arg(scenario)
            .args(["--policy", policy]);
        command
    }

    fn run(&self, job: Job<'_>) -> tokio::process::Command {
        let target = job.target;
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .args(["--color", "never", "generate", "--config"])
            .arg(job.scenario)
            .arg("--output-dir")
            .arg(job.output_dir)
            .args(["--target", &target.url, "--policy", job.policy]);
        if let Some(model) = &target.model {
            command.args(["--model", model]);
        }
        let signals = &target.signals;
        if let Some(url) = &signals.prometheus_url {
            command.args(["--prometheus-url", url]);
        }
        if let Some(deploy) = &signals.deploy_name {
            command.args(["--deploy-name", deploy]);
        }
        for scrape in &signals.scrape {
            command.args(["--scrape", scrape]);
        }
        if let Some(server) = &signals.server {
            command.args(["--server", server]);
        }
        command
    }
}
