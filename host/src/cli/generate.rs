//! `nyann-bench generate`: run a scenario (or a single stage described by
//! flags) against an OpenAI-compatible server, print the per-stage table and
//! the conclusion on stderr, the JSON summary on stdout when it is not a
//! terminal (or with `--json`), and write `--output-dir` files. The flags
//! are resolved once into the run library's spec ([`Args::spec`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use nyann_model::{Mode, Scenario, Slo, Stage, Step, Workload, WorkloadType, parse_duration};
use nyann_run::{LeadSpec, RunSpec};

use super::Ui;
use super::check::PolicyArgs;
use super::client::ClientArgs;
use super::defaults::duration;
use super::fleet::{self, FleetArgs, Role};
use super::progress;
use super::run::{self, OutputArgs};
use super::signals::SignalArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Scenario file: Starlark (`.star`) or the IR as JSON (`.json`). Without
    /// it, one stage is described by --mode/--concurrency/--rate/--duration.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub output: OutputArgs,

    /// Off a terminal (a CI log, a pod's log), a progress line this often
    /// during each stage: its figures so far and how long the run has left
    /// at most. On a terminal a progress bar says the same.
    #[arg(long, value_name = "DURATION", default_value = shown!(duration(progress::DEFAULT_INTERVAL)), value_parser = parse_duration)]
    pub progress_interval: Duration,

    #[command(flatten)]
    pub client: Box<ClientArgs>,

    #[command(flatten)]
    pub single: Box<SingleStageArgs>,

    #[command(flatten)]
    pub signals: Box<SignalArgs>,

    #[command(flatten)]
    pub policy: PolicyArgs,

    #[command(flatten)]
    pub fleet: Box<FleetArgs>,
}

pub async fn run(args: Args, ui: Ui) -> anyhow::Result<ExitCode> {
    let summary = args.output.summary();
    match args.fleet.role(args.output.output())? {
        Role::Alone => run::alone(args.spec(None)?, summary, args.progress_interval, ui).await,
        Role::Lead(lead) => fleet::lead(args.spec(Some(lead))?, summary, ui).await,
        Role::Work(work) => {
            // A worker needs no scenario; given one, it must be the leader's.
            let given = match &args.config {
                Some(_) => Some(args.scenario()?.0),
                None => None,
            };
            let spec = work.spec(args.client.to_options()?, given);
            fleet::work(spec, args.output.json, ui).await
        }
    }
}

impl Args {
    /// The run these flags describe: the scenario compiled, the client's
    /// files read, every flag turned into its typed value.
    pub(super) fn spec(&self, lead: Option<LeadSpec>) -> anyhow::Result<RunSpec> {
        let (scenario, source) = self.scenario()?;
        let load = self.client.to_options()?;
        let signals = self.signals.to_options(super::client::ca_certs(&load));
        Ok(RunSpec {
            scenario,
            source,
            load,
            signals,
            policy: self.policy.spec(&self.client.ca_cert)?,
            output: self.output.output(),
            client_metrics: self.client.metrics,
            lead,
        })
    }

    /// The scenario of `--config`, or of the single-stage flags; with the
    /// Starlark source when it was compiled from one.
    fn scenario(&self) -> anyhow::Result<(Scenario, Option<String>)> {
        Ok(match &self.config {
            Some(path) => {
                if let Some(slo) = &self.single.slo {
                    anyhow::bail!(
                        "--slo is for a single stage (without --config): in a scenario, give \
                         scenario(..., slo=slo({})) (or stage(..., slo=...) for one stage)",
                        slo_call(slo)
                    );
                }
                if self.single.any() {
                    anyhow::bail!(
                        "--config describes the stages: drop the single-stage flags (--mode, --concurrency, --rate, ...)"
                    );
                }
                // Its errors name the file (and line) themselves.
                let (scenario, source) = nyann_scenario::load_file_with_source(path)?;
                // The source is saved with the results when it was Starlark (a
                // JSON IR is saved as scenario.json anyway).
                let starlark = path.extension().is_some_and(|e| e == "star");
                (scenario, starlark.then_some(source))
            }
            None => (self.single.scenario()?, None),
        })
    }
}

/// A single stage's duration without --duration (its help says so).
const STAGE_DURATION: Duration = Duration::from_secs(60);
/// A single stage's streams without --concurrency (its help says so).
const STAGE_CONCURRENCY: u32 = 1;

/// A one-stage scenario from flags (only without --config): what the
/// flags leave out is the workload's `Default` and the two values above.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Single stage (without --config)")]
pub struct SingleStageArgs {
    /// Load mode [default: concurrent, or constant when --rate is given].
    #[arg(long, value_parser = ["concurrent", "constant", "poisson"])]
    pub mode: Option<String>,
    /// Closed-loop streams (concurrent mode) [default: 1].
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// Arrivals per second (constant and poisson modes).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stage duration [default: 60s].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// End the stage after this many requests [default: no limit].
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// Open loop: at most this many requests in flight; later arrivals are dropped.
    #[arg(long)]
    pub max_inflight: Option<u32>,
    /// Prompt generator [default: faker].
    #[arg(long, value_parser = ["synthetic", "faker", "corpus"])]
    pub workload: Option<String>,
    /// Corpus file or directory (workload corpus).
    #[arg(long, value_name = "PATH")]
    pub corpus: Option<String>,
    /// Input length in tokens [default: 128].
    #[arg(long)]
    pub isl: Option<u32>,
    /// Output length in tokens [default: 256].
    #[arg(long)]
    pub osl: Option<u32>,
    /// Turns per conversation [default: 1].
    #[arg(long)]
    pub turns: Option<u32>,
    /// Latency goals: each request says whether it met them, the stage its
    /// goodput (requests/s that met every goal) and attainment. GOAL is
    /// ttft, tpot (time per output token after the first, as vLLM's) or
    /// e2e: `--slo ttft=500ms,tpot=50ms`.
    #[arg(long, value_name = "GOAL=DURATION,...", value_parser = Slo::parse)]
    pub slo: Option<Slo>,
}

/// `ttft="500ms", tpot="50ms"`: the keywords of `slo(...)` giving `slo`.
fn slo_call(slo: &Slo) -> String {
    slo.goals()
        .map(|(o, g)| format!("{}=\"{}\"", o.name(), nyann_model::slo::show_seconds(g)))
        .collect::<Vec<_>>()
        .join(", ")
}

impl SingleStageArgs {
    fn any(&self) -> bool {
        self.mode.is_some()
            || self.concurrency.is_some()
            || self.rate.is_some()
            || self.duration.is_some()
            || self.max_requests.is_some()
            || self.max_inflight.is_some()
            || self.workload.is_some()
            || self.corpus.is_some()
            || self.isl.is_some()
            || self.osl.is_some()
            || self.turns.is_some()
    }

    pub(super) fn scenario(&self) -> anyhow::Result<Scenario> {
        // The scenario language refuses these too: a stage is a closed loop
        // of streams or an open loop at a rate, never both.
        match (self.mode.as_deref(), self.rate, self.concurrency) {
            (_, Some(rate), Some(c)) => anyhow::bail!(
                "--rate {rate} and --concurrency {c} are two kinds of load: --concurrency runs \
                 closed-loop streams, --rate an open loop of arrivals per second; give one \
                 (an open loop caps its requests in flight with --max-inflight)"
            ),
            (Some("concurrent"), Some(_), None) => anyhow::bail!(
                "--mode concurrent runs closed-loop streams: give --concurrency, or --mode \
                 constant/poisson with --rate"
            ),
            (Some(mode @ ("constant" | "poisson")), None, Some(_)) => anyhow::bail!(
                "--mode {mode} is an open loop at --rate arrivals per second: give --rate, or \
                 --mode concurrent with --concurrency"
            ),
            _ => {}
        }
        let mode = match (self.mode.as_deref(), self.rate) {
            (Some("constant"), _) | (None, Some(_)) => Mode::Constant,
            (Some("poisson"), _) => Mode::Poisson,
            _ => Mode::Concurrent,
        };
        if mode != Mode::Concurrent && self.rate.is_none() {
            anyhow::bail!("--mode constant/poisson needs --rate");
        }
        let defaults = Workload::default();
        let kind = match self.workload.as_deref() {
            Some("synthetic") => WorkloadType::Synthetic,
            Some("corpus") => WorkloadType::Corpus,
            Some("faker") => WorkloadType::Faker,
            _ => defaults.kind,
        };
        let workload = Workload {
            kind,
            isl: self.isl.unwrap_or(defaults.isl),
            osl: self.osl.unwrap_or(defaults.osl),
            turns: self.turns.unwrap_or(defaults.turns),
            corpus_path: self.corpus.clone(),
            ..defaults
        };
        let duration_s = self.duration.unwrap_or(STAGE_DURATION).as_secs_f64();
        let stage = Stage {
            concurrency: (mode == Mode::Concurrent)
                .then(|| self.concurrency.unwrap_or(STAGE_CONCURRENCY)),
            rate: if mode == Mode::Concurrent {
                None
            } else {
                self.rate
            },
            max_inflight: self.max_inflight.unwrap_or(0),
            max_requests: self.max_requests.unwrap_or(0),
            slo: self.slo,
            ..Stage::new(duration_s, mode)
        };
        Ok(Scenario {
            target: None,
            model: None,
            workload,
            steps: vec![Step::Stage(stage)],
        })
    }
}
