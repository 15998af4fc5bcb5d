//! `nyann-bench kube render`: print the Kubernetes manifests (ConfigMap,
//! headless Service, Indexed Job) of a scale-out run, for `kubectl apply -f -`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use nyann_kube::RenderConfig;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print the manifests of an N-worker run as a JSON `List` on stdout.
    Render(RenderArgs),
}

#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    /// Scenario file (`.star` or IR `.json`): compiled now, carried in the ConfigMap.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Workers (pods); worker 0 leads.
    #[arg(long, value_name = "N")]
    pub workers: usize,
    /// Container image with the nyann-bench binary (see the Containerfile).
    #[arg(long)]
    pub image: String,
    /// Name of the Job, Service and ConfigMap.
    #[arg(long, default_value = "nyann-bench")]
    pub name: String,
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Coordination port of the leader.
    #[arg(long, default_value_t = 7300)]
    pub port: u16,
    /// Policy component (`.wasm`) carried in the ConfigMap [default: the built-in policy].
    #[arg(long, value_name = "FILE.wasm")]
    pub policy: Option<PathBuf>,
    /// CPU of each pod (request = limit), e.g. `2`.
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory of each pod (request = limit), e.g. `2Gi`.
    #[arg(long)]
    pub memory: Option<String>,
    /// A PersistentVolumeClaim to write the results to [default: an emptyDir,
    /// whose files leave with the pod: the summary stays in pod 0's log].
    #[arg(long, value_name = "CLAIM")]
    pub results_claim: Option<String>,
    /// More `generate` flags for every worker, after `--`: e.g. `-- --target
    /// http://vllm:8000/v1 --prometheus-url http://prometheus:9090 --deploy-name vllm`.
    #[arg(last = true, value_name = "GENERATE FLAGS")]
    pub generate: Vec<String>,
}

pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    let Command::Render(args) = command;
    let scenario = nyann_scenario::load_file(&args.config)?;
    let policy = match &args.policy {
        Some(path) => Some(
            std::fs::read(path).with_context(|| format!("reading --policy {}", path.display()))?,
        ),
        None => None,
    };
    // The division is checked now, not when the pods start.
    for i in 0..args.workers {
        nyann_fleet::share::scenario_share(&scenario, args.workers, i)?;
    }
    let manifests = nyann_kube::render(&RenderConfig {
        name: args.name,
        namespace: args.namespace,
        image: args.image,
        workers: args.workers,
        port: args.port,
        scenario,
        policy,
        generate_args: args.generate,
        cpu: args.cpu,
        memory: args.memory,
        results_claim: args.results_claim,
    })?;
    println!("{}", serde_json::to_string_pretty(&manifests.to_list())?);
    Ok(ExitCode::SUCCESS)
}
