//! `nyann-bench kube render`: print the Kubernetes manifests (ConfigMap,
//! headless Service, Indexed Job) of a scale-out run, for `kubectl apply -f -`.
//! The pods' command is parsed here with `generate`'s own parser, so that a
//! mistyped flag after `--` fails now, not in every pod.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use nyann_kube::{PolicyDelivery, RenderConfig};
use nyann_oci::OciReference;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print the manifests of an N-worker run on stdout (a JSON `List`, or
    /// multi-document YAML).
    Render(RenderArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A `v1` `List` of the objects.
    Json,
    /// One YAML document per object, every string quoted.
    Yaml,
}

/// `--policy-delivery`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Delivery {
    ImageVolume,
    Pull,
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
    #[arg(long, default_value_t = nyann_run::fleet::COORDINATOR_PORT)]
    pub port: u16,
    /// The policy [default: the built-in]: a component file (`.wasm`),
    /// carried in the ConfigMap (1 MiB with the scenario), or one in a
    /// registry pinned by digest, `oci://REGISTRY/REPO@sha256:...` (what
    /// `policy push` prints), delivered as --policy-delivery says.
    #[arg(long, value_name = "FILE.wasm|oci://REF@sha256:DIGEST")]
    pub policy: Option<String>,
    /// How a registry's policy reaches the pods: `image-volume` mounts it
    /// (Kubernetes 1.33+, a runtime with image volumes); `pull` has the
    /// leader pull it itself at start (any cluster; the pod needs the
    /// registry's network, and credentials if it is private).
    #[arg(long, value_enum, default_value_t = Delivery::ImageVolume)]
    pub policy_delivery: Delivery,
    /// CPU of each pod (request = limit), e.g. `2`.
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory of each pod (request = limit), e.g. `2Gi`.
    #[arg(long)]
    pub memory: Option<String>,
    /// A PersistentVolumeClaim to write the results to, with access mode
    /// ReadWriteMany (every pod mounts it) [default: an emptyDir, whose files
    /// leave with the pod: the summary stays in pod 0's log].
    #[arg(long, value_name = "CLAIM")]
    pub results_claim: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
    /// More `generate` flags for every worker, after `--`: e.g. `-- --target
    /// http://vllm:8000/v1 --prometheus-url http://prometheus:9090 --deploy-name vllm`.
    #[arg(last = true, value_name = "GENERATE FLAGS")]
    pub generate: Vec<String>,
}

/// How `--policy` reaches the pods: a file's bytes in the ConfigMap, a
/// registry's component by digest (a tag is refused: every pod, and every
/// rerun of the manifests, must judge with the same bytes).
fn delivery(policy: &str, how: Delivery) -> anyhow::Result<PolicyDelivery> {
    if !OciReference::is_reference(policy) {
        let path = PathBuf::from(policy);
        let wasm = std::fs::read(&path).with_context(|| format!("reading --policy {policy}"))?;
        return Ok(PolicyDelivery::Inline(wasm));
    }
    let reference = OciReference::parse(policy)?;
    let Some(image) = reference.by_digest() else {
        bail!(
            "--policy {policy}: pin it by digest, oci://{}/{}@sha256:... (`nyann-bench policy \
             push` prints it; the manifests must name the same bytes whenever they are applied)",
            reference.registry(),
            reference.repository()
        );
    };
    Ok(match how {
        Delivery::ImageVolume => PolicyDelivery::ImageVolume { image },
        Delivery::Pull => PolicyDelivery::Pull {
            reference: reference.to_string(),
        },
    })
}

pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    let Command::Render(args) = command;
    if args.workers < 2 {
        bail!(
            "--workers {n}: a scale-out run needs at least 2 workers, not {n} (one process needs \
             no Kubernetes Job): run `nyann-bench generate` instead",
            n = args.workers
        );
    }
    let scenario = nyann_scenario::load_file(&args.config)?;
    let policy = match &args.policy {
        Some(policy) => Some(delivery(policy, args.policy_delivery)?),
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
        results_subdir: None,
        drain_grace_s: None,
    })?;
    // Every pod runs this command: it must parse as `generate` does.
    let command = manifests
        .job
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref())
        .and_then(|pod| pod.containers.first())
        .and_then(|container| container.args.clone())
        .unwrap_or_default();
    let argv = std::iter::once("nyann-bench".to_string()).chain(command);
    if let Err(err) = <super::Cli as clap::CommandFactory>::command().try_get_matches_from(argv) {
        let rendered = err.render().to_string();
        let first = rendered.lines().next().unwrap_or_default();
        bail!(
            "the generate flags after -- do not parse: {}",
            first.trim_start_matches("error: ")
        );
    }
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&manifests.to_list())?),
        Format::Yaml => print!("{}", manifests.to_yaml()),
    }
    Ok(ExitCode::SUCCESS)
}
