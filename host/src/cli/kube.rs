//! `nyann-bench kube render`: print the Kubernetes manifests (ConfigMap,
//! headless Service, Indexed Job) of a scale-out run, for `kubectl apply -f -`.
//! The pods' command is parsed here with `generate`'s own parser, so that a
//! mistyped flag after `--` fails now, not in every pod.
//!
//! `kube render service`: those of the run service itself (`serve` as a
//! Deployment, its Role, files, claim, Service and NetworkPolicy), its
//! targets and tokens files checked now by the service's own loaders, so
//! that a mistake fails here rather than in a pod that never starts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use nyann_kube::{
    ConfigFile, DEFAULT_RESULTS_SIZE, Field, PolicyDelivery, RenderConfig, RenderError,
    ResultsClaim, ServiceConfig,
};
use nyann_oci::OciReference;
use nyann_service::Targets;
use nyann_service::auth::Tokens;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print the manifests of an N-worker run on stdout (a JSON `List`, or
    /// multi-document YAML); `render service`: those of the run service.
    Render(RenderArgs),
}

/// What `kube render` renders besides a run.
#[derive(Debug, clap::Subcommand)]
pub enum Render {
    /// Print the run service's own manifests on stdout (a JSON `List`, or
    /// multi-document YAML): `serve` as a Deployment with its
    /// ServiceAccount, Role and RoleBinding, the targets and tokens files,
    /// the results claim, a Service and a NetworkPolicy (docs/service.md).
    Service(Box<ServiceArgs>),
}

#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    /// The namespace of every object, where the service starts its runs
    /// (its Role is namespaced, its DNS names contain it).
    #[arg(long, value_name = "NS")]
    pub namespace: String,
    /// Container image with the nyann-bench binary, for the service and the
    /// runs it starts.
    #[arg(long)]
    pub image: String,
    /// The targets file (TOML, or JSON ending in .json), checked now as
    /// `serve` checks it, carried in a ConfigMap.
    #[arg(long, value_name = "FILE")]
    pub targets: PathBuf,
    /// The tokens file (the tokens' SHA-256 digests), checked now as `serve`
    /// checks it, carried in a Secret.
    #[arg(long, value_name = "FILE")]
    pub tokens: PathBuf,
    /// Name of the objects (the ConfigMap's, the Secret's and the claim's
    /// end in -targets, -tokens and -results).
    #[arg(long, default_value = "nyann-bench")]
    pub name: String,
    /// Name of the results claim rendered (ReadWriteMany: the service and
    /// its runs' pods mount it) [default: NAME-results].
    #[arg(long, value_name = "CLAIM", conflicts_with = "existing_claim")]
    pub results_claim: Option<String>,
    /// A ReadWriteMany claim that exists already, for the results: none is
    /// rendered.
    #[arg(long, value_name = "CLAIM")]
    pub existing_claim: Option<String>,
    /// Size of the results claim rendered.
    #[arg(long, value_name = "SIZE", default_value = DEFAULT_RESULTS_SIZE, conflicts_with = "existing_claim")]
    pub results_size: String,
    /// Storage class of the results claim rendered (one that offers
    /// ReadWriteMany) [default: the cluster's default class].
    #[arg(long, value_name = "SC", conflicts_with = "existing_claim")]
    pub storage_class: Option<String>,
    /// CPU of the service's pod (request = limit), e.g. `1`.
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory of the service's pod (request = limit), e.g. `1Gi`.
    #[arg(long)]
    pub memory: Option<String>,
    /// Let only the pods of this namespace reach the service (by its
    /// `kubernetes.io/metadata.name` label). Repeatable [default: any pod].
    #[arg(long = "allow-from-namespace", value_name = "NS")]
    pub allow_from_namespaces: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
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

// A run's flags are required unless `service` is given instead; then none
// of them may be.
#[derive(Debug, clap::Args)]
#[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
pub struct RenderArgs {
    /// Scenario file (`.star` or IR `.json`): compiled now, carried in the ConfigMap.
    #[arg(long, value_name = "FILE", required = true)]
    pub config: Option<PathBuf>,
    /// Workers (pods); worker 0 leads.
    #[arg(long, value_name = "N", required = true)]
    pub workers: Option<usize>,
    /// Container image with the nyann-bench binary (see the Containerfile).
    #[arg(long, required = true)]
    pub image: Option<String>,
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
    /// Not a run: the run service's own manifests.
    #[command(subcommand)]
    pub what: Option<Render>,
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
    match args.what {
        Some(Render::Service(service)) => render_service(*service),
        None => render_run(args),
    }
}

/// A scale-out run's manifests.
fn render_run(args: RenderArgs) -> anyhow::Result<ExitCode> {
    // Required by clap without a subcommand: this never fires.
    let (Some(config), Some(workers), Some(image)) = (args.config, args.workers, args.image) else {
        bail!("a run's manifests need --config, --workers and --image");
    };
    if workers < 2 {
        bail!(
            "--workers {workers}: a scale-out run needs at least 2 workers, not {workers} (one \
             process needs no Kubernetes Job): run `nyann-bench generate` instead"
        );
    }
    let scenario = nyann_scenario::load_file(&config)?;
    let policy = match &args.policy {
        Some(policy) => Some(delivery(policy, args.policy_delivery)?),
        None => None,
    };
    // The division is checked now, not when the pods start.
    for i in 0..workers {
        nyann_fleet::share::scenario_share(&scenario, workers, i)?;
    }
    let manifests = nyann_kube::render(&RenderConfig {
        name: args.name,
        namespace: args.namespace,
        image,
        workers,
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

/// The run service's manifests, once its files pass the checks `serve`
/// makes at start.
fn render_service(args: ServiceArgs) -> anyhow::Result<ExitCode> {
    let targets = config_file(&args.targets, "--targets", "targets")?;
    Targets::parse(
        &args.targets.display().to_string(),
        &targets.text,
        targets.json,
    )
    .map_err(|e| {
        anyhow!("the targets file (--targets: the servers runs may target) is not valid:\n{e}")
    })
    .and_then(|parsed| in_the_pod(&parsed))?;
    let tokens = config_file(&args.tokens, "--tokens", "tokens")?;
    Tokens::parse(
        &args.tokens.display().to_string(),
        &tokens.text,
        tokens.json,
    )
    .map_err(|e| {
        anyhow!("the tokens file (--tokens: the clients' token digests) is not valid:\n{e}")
    })?;
    let results = match (args.existing_claim.clone(), args.results_claim.clone()) {
        (Some(existing), _) => ResultsClaim::Existing(existing),
        (None, name) => ResultsClaim::New {
            name: name.unwrap_or_else(|| format!("{}-results", args.name)),
            size: args.results_size.clone(),
            storage_class: args.storage_class.clone(),
        },
    };
    let config = ServiceConfig {
        name: args.name.clone(),
        namespace: args.namespace.clone(),
        image: args.image.clone(),
        targets,
        tokens,
        results,
        cpu: args.cpu.clone(),
        memory: args.memory.clone(),
        allow_from_namespaces: args.allow_from_namespaces.clone(),
    };
    let manifests = nyann_kube::render_service(&config).map_err(|err| match &err {
        RenderError::Name(name) => anyhow!("--name {name}: {err}"),
        RenderError::Invalid { field, value, .. } => {
            anyhow!("{} {value}: {err}", flag(*field, &args))
        }
        RenderError::FileTooLarge { field, .. } => anyhow!("{}: {err}", flag(*field, &args)),
        _ => anyhow!("{err}"),
    })?;
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&manifests.to_list())?),
        Format::Yaml => print!("{}", manifests.to_yaml()),
    }
    Ok(ExitCode::SUCCESS)
}

/// A file the service reads in its pod: its text, and whether it is JSON
/// (by its extension, as the service's loaders tell).
fn config_file(path: &Path, flag: &str, what: &str) -> anyhow::Result<ConfigFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{flag} {}: cannot read the {what} file", path.display()))?;
    Ok(ConfigFile {
        text,
        json: path.extension().is_some_and(|e| e == "json"),
    })
}

/// The pod has the targets file, the built-in policy and the registries
/// it reaches, not the component files of this machine that a target may
/// allow.
fn in_the_pod(targets: &Targets) -> anyhow::Result<()> {
    for target in targets.iter() {
        if let Some(file) = target
            .policies
            .iter()
            .find(|p| *p != "builtin" && !OciReference::is_reference(p))
        {
            bail!(
                "the targets file (--targets): target {:?} allows the policy component {file:?}, \
                 a file of this machine that the service's pod does not have: list \
                 \"builtin\" or a registry's component pinned by digest \
                 (oci://REGISTRY/REPO@sha256:..., what `nyann-bench policy push` prints)",
                target.name
            );
        }
    }
    Ok(())
}

/// The flag that gave `field`'s value.
fn flag(field: Field, args: &ServiceArgs) -> String {
    match field {
        Field::Namespace => "--namespace".into(),
        Field::Image => "--image".into(),
        Field::Claim if args.existing_claim.is_some() => "--existing-claim".into(),
        Field::Claim => "--results-claim".into(),
        Field::Size => "--results-size".into(),
        Field::StorageClass => "--storage-class".into(),
        Field::Cpu => "--cpu".into(),
        Field::Memory => "--memory".into(),
        Field::AllowedNamespace => "--allow-from-namespace".into(),
        Field::Targets => format!("--targets {}", args.targets.display()),
        Field::Tokens => format!("--tokens {}", args.tokens.display()),
    }
}
