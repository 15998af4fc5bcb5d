//! `generate --workers N`: one sweep run by N processes (Kubernetes pods of
//! an Indexed Job), with one stop decision. Worker 0 leads: it compiles the
//! scenario, serves the coordination endpoint, runs the congestion check on
//! the fleet's statistics and writes the merged results; the others join
//! it and run their share (they need no scenario, policy or Prometheus).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use nyann_fleet::protocol::{build_id, scenario_digest};
use nyann_fleet::share::{dataset_share, first_id, scenario_share, worker_seed};
use nyann_fleet::{Coordinator, Leader, LeaderConfig, OnWorkerLoss, WorkerConfig, worker_dir};
use nyann_model::{Scenario, Step, parse_duration};

use super::Ui;
use super::generate::{Args, load_scenario};
use super::interrupt::cancel_on_signals;
use super::run::{
    self, Ending, Prepared, Summary, exit_code, print_summary, refuse_a_previous_run, show_ending,
};
use nyann_check::{Conclusion, RunResult};

/// Flags of a run by several workers.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Scale-out (several workers, e.g. a Kubernetes Indexed Job)")]
pub struct FleetArgs {
    /// Workers running this sweep together, each with this same command
    /// (1: this process alone). The load of every stage is divided between them.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = parse_workers)]
    pub workers: usize,

    /// This worker's index, 0..N-1; 0 leads [default: $JOB_COMPLETION_INDEX,
    /// which a Kubernetes Indexed Job sets].
    #[arg(long, env = "JOB_COMPLETION_INDEX", value_name = "I")]
    pub worker_index: Option<usize>,

    /// The leader's coordination endpoint, HOST:PORT or http://HOST:PORT
    /// (needed by workers 1..N-1).
    #[arg(long, value_name = "HOST:PORT")]
    pub coordinator: Option<Coordinator>,

    /// Where the leader (worker 0) serves the coordination endpoint
    /// [default: 0.0.0.0:7300, or 0.0.0.0 and the port of --coordinator
    /// when the leader is given it too].
    #[arg(long, value_name = "ADDR")]
    pub coordinator_listen: Option<SocketAddr>,

    /// A worker (or leader) that sends nothing for this long is lost.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub heartbeat_timeout: Duration,

    /// How long the leader waits for every worker to join, and a worker
    /// for the leader to answer.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub join_timeout: Duration,

    /// What the leader does when a worker is lost or leaves: `continue`
    /// with the others (later stages run at the level the others' shares
    /// add up to; the run ends `degraded`, exit 3), or `abort` the run (exit 1).
    #[arg(long, value_enum, default_value_t = WorkerLoss::Continue)]
    pub on_worker_loss: WorkerLoss,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkerLoss {
    Continue,
    Abort,
}

/// `--workers`: at least 1 (0 would silently run as one process).
fn parse_workers(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 workers cannot run anything: give 1 (this process alone) or more".into()),
        Ok(n) => Ok(n),
        Err(err) => Err(err.to_string()),
    }
}

/// The coordination port a leader listens on without --coordinator-listen.
const DEFAULT_COORDINATOR_PORT: u16 = 7300;

impl FleetArgs {
    /// Whether this run is one of several workers.
    pub fn active(&self) -> bool {
        self.workers > 1
    }

    /// Where the leader listens: `--coordinator-listen`, else the port the
    /// workers were told (`--coordinator`, when every process gets the
    /// same command), else 7300. A listen port that cannot be the one the
    /// workers were told is refused: they would wait for nothing.
    fn leader_listen(&self) -> anyhow::Result<SocketAddr> {
        let any = std::net::Ipv4Addr::UNSPECIFIED.into();
        match (self.coordinator_listen, &self.coordinator) {
            (Some(listen), Some(told)) if listen.port() != 0 && listen.port() != told.port => {
                bail!(
                    "--coordinator-listen {listen} and --coordinator {told}: the workers look for the \
                 leader on port {}, but it would listen on port {}: give both the same port (or \
                 drop --coordinator-listen: the leader then listens on port {})",
                    told.port,
                    listen.port(),
                    told.port
                )
            }
            (Some(listen), _) => Ok(listen),
            (None, Some(told)) => Ok(SocketAddr::new(any, told.port)),
            (None, None) => Ok(SocketAddr::new(any, DEFAULT_COORDINATOR_PORT)),
        }
    }
}

fn build() -> String {
    build_id(super::VERSION)
}

/// Runs this process's part of a fleet run.
pub async fn run(args: Args, ui: Ui) -> anyhow::Result<ExitCode> {
    let fleet = &args.fleet;
    let Some(index) = fleet.worker_index else {
        bail!(
            "--workers {} needs --worker-index I (0 leads), or $JOB_COMPLETION_INDEX as a \
             Kubernetes Indexed Job sets it",
            fleet.workers
        );
    };
    if index >= fleet.workers {
        bail!(
            "--worker-index {index} is out of range: --workers {} counts 0..{}",
            fleet.workers,
            fleet.workers - 1
        );
    }
    let Some(dir) = args.output_dir.clone() else {
        bail!(
            "--workers needs --output-dir DIR: each worker keeps its records in DIR/worker-I \
             and the leader writes the merged results in DIR"
        );
    };
    if index == 0 {
        lead(&args, &dir, ui).await
    } else {
        follow(&args, index, &dir, ui).await
    }
}

async fn lead(args: &Args, dir: &Path, ui: Ui) -> anyhow::Result<ExitCode> {
    let fleet = &args.fleet;
    let (scenario, source) = load_scenario(args)?;
    // A stage that cannot be divided is refused before anyone waits.
    for i in 0..fleet.workers {
        scenario_share(&scenario, fleet.workers, i)?;
    }
    let Prepared {
        mut options,
        check,
        signals: signal_options,
        interrupts: signals,
    } = run::prepare(args, &scenario, Some(dir)).await?;
    run::save_metrics_texts(&signal_options, Some(dir), "start").await;
    let leader = Leader::bind(
        fleet.leader_listen()?,
        LeaderConfig {
            workers: fleet.workers,
            heartbeat_timeout: fleet.heartbeat_timeout,
            join_timeout: fleet.join_timeout,
            on_loss: match fleet.on_worker_loss {
                WorkerLoss::Continue => OnWorkerLoss::Continue,
                WorkerLoss::Abort => OnWorkerLoss::Abort,
            },
            build: build(),
            output_dir: dir.to_path_buf(),
        },
    )
    .await?;
    if let Some(addr) = leader.local_addr() {
        // A fixed line (not a log line): scripts and tests read the port from it.
        eprintln!("coordinator listening on {addr}");
    }
    if let Some(check) = &check {
        check.start();
    }
    let seed = options.seed;
    refuse_small_eval_sets(&scenario, seed, fleet.workers)?;
    tracing::info!(
        "seed {seed}; waiting for {} worker(s) to join",
        fleet.workers - 1
    );
    let gathered = leader
        .gather(
            &scenario,
            seed,
            check,
            options.interrupt.clone(),
            options.interrupt_now.clone(),
        )
        .await;
    let mut gate = match gathered {
        Ok(gate) => gate,
        Err(nyann_fleet::FleetError::Interrupted) => return Ok(run::interrupted_before_load()),
        Err(err) => return Err(err.into()),
    };
    let own_dir = worker_dir(dir, 0);
    options.output_dir = Some(own_dir.clone());
    options.seed = worker_seed(seed, 0);
    options.first_id = first_id(0);
    options.dataset_share = Some(dataset_share(seed, 0, fleet.workers));
    let grace = options.grace + options.drain_timeout;
    let share = scenario_share(&scenario, fleet.workers, 0)?;
    let result = nyann_load::run(&share, options, &mut gate).await;
    let result = match result {
        Ok(result) => result,
        Err(nyann_load::RunError::Interrupted) => return Ok(run::interrupted_before_load()),
        Err(err) => return Err(super::client::explain(err)),
    };
    // The workers end their last stage as the leader does; their uploads
    // may take the drain and grace times and a transfer.
    let waited = gate
        .finish(
            result,
            Some(own_dir.join(nyann_results::REQUESTS)),
            grace + Duration::from_secs(60),
        )
        .await;
    run::save_metrics_texts(&signal_options, Some(dir), "end").await;
    let merged = nyann_fleet::merge::write(&waited, dir)
        .with_context(|| format!("writing the fleet's results to {}", dir.display()))?;
    // What the servers said of themselves, as the leader asked them.
    let facts = own_dir.join(nyann_results::SERVER);
    if facts.exists()
        && let Err(err) = std::fs::copy(&facts, dir.join(nyann_results::SERVER))
    {
        tracing::warn!(
            "{} was not copied into {}: {err}",
            facts.display(),
            dir.display()
        );
    }
    for gone in &waited.departed {
        eprintln!(
            "worker {} {} in step {}: {}",
            gone.worker,
            if gone.left { "left" } else { "was lost" },
            gone.step,
            gone.reason
        );
    }
    if let nyann_load::RunOutcome::Degraded {
        missing_records, ..
    } = &merged.result.outcome
    {
        for worker in missing_records {
            eprintln!(
                "worker {worker}: its records are NOT in the results ({}); they stay in its own \
                 --output-dir, worker-{worker}/",
                merged_reason(&merged.summary, *worker)
            );
        }
    }
    let ending = Ending {
        scenario: &scenario,
        source: source.as_deref(),
        dir: Some(dir),
        summary: Summary::Stdout { json: args.json },
        workers: fleet.workers,
    };
    ending
        .finish(&merged.result, &merged.summary, &signals, ui)
        .await
}

/// Why `worker`'s records are missing, as `fleet.json` says.
fn merged_reason<A>(summary: &nyann_load::RunResult<A>, worker: usize) -> String {
    match &summary.outcome {
        nyann_load::RunOutcome::Degraded { reasons, .. } => reasons
            .iter()
            .find(|r| r.starts_with(&format!("the records of worker {worker} ")))
            .cloned()
            .unwrap_or_else(|| "see fleet.json".into()),
        _ => "see fleet.json".into(),
    }
}

/// Refuses, before a worker joins, an eval dataset with fewer questions
/// than the fleet has workers: the last worker (whose chunk is the
/// smallest) would have none to ask. (A ShareGPT file's share is known
/// only once tokens are counted: its worker says so.)
fn refuse_small_eval_sets(scenario: &Scenario, seed: u64, workers: usize) -> anyhow::Result<()> {
    let stages = scenario.steps.iter().filter_map(|step| match step {
        Step::Stage(stage) => stage.workload.as_ref(),
        Step::Barrier { .. } => None,
    });
    let last = dataset_share(seed, workers - 1, workers);
    for workload in std::iter::once(&scenario.workload).chain(stages) {
        if workload.kind.is_eval() {
            nyann_load::workload::PromptGen::new(workload, seed, last)?;
        }
    }
    Ok(())
}

async fn follow(args: &Args, index: usize, dir: &Path, ui: Ui) -> anyhow::Result<ExitCode> {
    let fleet = &args.fleet;
    let Some(coordinator) = fleet.coordinator.clone() else {
        bail!(
            "worker {index} needs --coordinator HOST:PORT: the leader's (worker 0's) \
             coordination endpoint, e.g. nyann-bench-0.nyann-bench:7300"
        );
    };
    // A worker needs no scenario; given one, it must be the leader's.
    let digest = if args.config.is_some() || args.scenario.is_some() {
        Some(scenario_digest(&load_scenario(args)?.0))
    } else {
        None
    };
    refuse_a_previous_run(&worker_dir(dir, index), args.overwrite)?;
    let mut options = args.client.to_options()?;
    // Ctrl-C and SIGTERM are handled from here on, also while the worker
    // waits to join (a script's `&` may have left SIGINT ignored).
    let _signals = cancel_on_signals(options.interrupt.clone(), options.interrupt_now.clone());
    let config = WorkerConfig {
        coordinator,
        index,
        workers: fleet.workers,
        heartbeat_timeout: fleet.heartbeat_timeout,
        join_timeout: fleet.join_timeout,
        build: build(),
        scenario_digest: digest,
    };
    let joined = tokio::select! {
        joined = nyann_fleet::join(&config) => joined,
        () = options.interrupt.cancelled() => {
            eprintln!("worker {index}: interrupted while waiting to join the leader");
            return Ok(ExitCode::from(130));
        }
    };
    let joined = joined.map_err(|err| match err {
        nyann_fleet::FleetError::Unreachable { .. } => anyhow::anyhow!(
            "{err}; --coordinator gives the leader's HOST:PORT, --join-timeout how long to wait"
        ),
        err => err.into(),
    })?;
    tracing::info!("worker {index}: joined; seed {}", joined.assignment.seed);
    nyann_load::raise_fd_limit();
    let own_dir: PathBuf = worker_dir(dir, index);
    options.output_dir = Some(own_dir.clone());
    options.seed = joined.assignment.seed;
    options.first_id = joined.assignment.first_id;
    options.dataset_share = Some(joined.assignment.dataset_share);
    let scenario = joined.assignment.scenario.clone();
    let mut gate = joined.start(options.interrupt.clone(), options.interrupt_now.clone());
    let result = nyann_load::run(&scenario, options, &mut gate).await;
    let lost = gate.leader_lost();
    let aborted = gate.aborted();
    let result = match result {
        Ok(result) => result,
        Err(nyann_load::RunError::Interrupted) => {
            eprintln!("interrupted before any load was sent");
            return Ok(ExitCode::from(if lost.is_some() { 1 } else { 130 }));
        }
        Err(err) => return Err(super::client::explain(err)),
    };
    // A worker judged nothing: its table has no verdicts.
    let mut judged: RunResult = result.clone().map_annotations(|_, _| None);
    if let Some(reason) = &aborted {
        // Its own files say what happened, not "interrupted".
        judged.outcome = nyann_load::RunOutcome::Aborted {
            reason: format!("the leader aborted the run: {reason}"),
        };
        if let Err(err) = judged.write_files(&own_dir) {
            tracing::warn!("{}: {err}", own_dir.display());
        }
    }
    let conclusion = Conclusion::of(&judged, 1);
    show_ending(&judged, &conclusion, Some(&own_dir), ui);
    print_summary(&judged, &conclusion, args.json)?;
    let records = own_dir.join(nyann_results::REQUESTS);
    let uploaded = gate
        .upload(&result, Some(&records), Some(dir), Duration::from_secs(120))
        .await;
    if let Err(err) = &uploaded {
        eprintln!(
            "worker {index}: the records were not uploaded to the leader ({err}); they are in {}",
            own_dir.display()
        );
    }
    if let Some(reason) = lost {
        let kept = match result.requests_recorded {
            0 => "it sent no load, so there is no record to keep".to_string(),
            n => format!("its {n} records are kept in {}", own_dir.display()),
        };
        eprintln!("worker {index}: leader lost ({reason}); {kept}");
        return Ok(ExitCode::from(1));
    }
    if aborted.is_some() {
        return Ok(ExitCode::from(1));
    }
    match exit_code(&judged) {
        // Its records are not in the leader's results: the run is degraded.
        0 if uploaded.is_err() => Ok(ExitCode::from(nyann_load::EXIT_DEGRADED)),
        code => Ok(ExitCode::from(code)),
    }
}

#[cfg(test)]
mod tests {
    use nyann_model::{Mode, Stage, Workload, WorkloadType};

    use super::*;

    #[test]
    fn a_leader_refuses_an_eval_set_smaller_than_the_fleet() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        nyann_testkit::datasets::write_gsm8k(&path, 2);
        let questions = Workload {
            kind: WorkloadType::Gsm8k,
            path: Some(path.display().to_string()),
            ..Workload::default()
        };
        // The eval workload is a stage's own, after a plain one.
        let scenario = Scenario {
            target: None,
            model: None,
            workload: Workload::default(),
            steps: vec![
                Step::Stage(Stage::new(1.0, Mode::Concurrent)),
                Step::Stage(Stage {
                    workload: Some(questions),
                    ..Stage::new(1.0, Mode::Concurrent)
                }),
            ],
        };
        assert!(refuse_small_eval_sets(&scenario, 1, 2).is_ok());
        let err = refuse_small_eval_sets(&scenario, 1, 3).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("t.jsonl: 2 questions for 3 workers leave worker 2 none: use fewer workers or a larger file"),
            "{err}"
        );
    }
}
