//! `generate --workers N` (and `eval`'s): one sweep run by N processes
//! (Kubernetes pods of an Indexed Job), with one stop decision. Worker 0
//! leads: it compiles the scenario, serves the coordination endpoint, runs
//! the congestion check on the fleet's statistics and writes the merged
//! results; the others join it and run their share (they need no
//! scenario, policy or Prometheus). Here: the flags, resolved into this
//! process's [`Role`], and each role's words on the terminal (the steps
//! are `nyann_run`'s).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use nyann_fleet::protocol::build_id;
use nyann_fleet::{Coordinator, FleetError, OnWorkerLoss};
use nyann_load::RunOptions;
use nyann_model::{Scenario, parse_duration};
use nyann_run::fleet::{JoinError, Worker, WorkerRunError, WorkerSpec};
use nyann_run::{LeadSpec, Output, Run, RunSpec};

use super::Ui;
use super::defaults::duration;
use super::interrupt::cancel_on_signals;
use super::run::{self, Summary, print_summary, show_ending};

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
    #[arg(long, value_parser = parse_duration, default_value = shown!(duration(nyann_run::fleet::HEARTBEAT_TIMEOUT)))]
    pub heartbeat_timeout: Duration,

    /// How long the leader waits for every worker to join, and a worker
    /// for the leader to answer.
    #[arg(long, value_parser = parse_duration, default_value = shown!(duration(nyann_run::fleet::JOIN_TIMEOUT)))]
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

/// What this process is in a run.
pub enum Role {
    /// The only process.
    Alone,
    /// Worker 0 of several.
    Lead(LeadSpec),
    /// Worker 1..N-1.
    Work(WorkerRole),
}

/// A worker's place in the fleet, before its client flags are read.
pub struct WorkerRole {
    index: usize,
    coordinator: Coordinator,
    output: Output,
    fleet: FleetArgs,
}

impl FleetArgs {
    /// This process's role, `output` being the run directory given (a
    /// fleet needs one).
    pub fn role(&self, output: Option<Output>) -> anyhow::Result<Role> {
        if self.workers <= 1 {
            return Ok(Role::Alone);
        }
        let Some(index) = self.worker_index else {
            bail!(
                "--workers {} needs --worker-index I (0 leads), or $JOB_COMPLETION_INDEX as a \
                 Kubernetes Indexed Job sets it",
                self.workers
            );
        };
        if index >= self.workers {
            bail!(
                "--worker-index {index} is out of range: --workers {} counts 0..{}",
                self.workers,
                self.workers - 1
            );
        }
        let Some(output) = output else {
            bail!(
                "--workers needs --output-dir DIR: each worker keeps its records in DIR/worker-I \
                 and the leader writes the merged results in DIR"
            );
        };
        if index == 0 {
            return Ok(Role::Lead(LeadSpec {
                workers: self.workers,
                listen: self.leader_listen()?,
                heartbeat_timeout: self.heartbeat_timeout,
                join_timeout: self.join_timeout,
                on_loss: match self.on_worker_loss {
                    WorkerLoss::Continue => OnWorkerLoss::Continue,
                    WorkerLoss::Abort => OnWorkerLoss::Abort,
                },
                build: build(),
            }));
        }
        let Some(coordinator) = self.coordinator.clone() else {
            bail!(
                "worker {index} needs --coordinator HOST:PORT: the leader's (worker 0's) \
                 coordination endpoint, e.g. nyann-bench-0.nyann-bench:7300"
            );
        };
        Ok(Role::Work(WorkerRole {
            index,
            coordinator,
            output,
            fleet: self.clone(),
        }))
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
            (None, None) => Ok(SocketAddr::new(any, nyann_run::fleet::COORDINATOR_PORT)),
        }
    }
}

fn build() -> String {
    build_id(super::VERSION)
}

impl WorkerRole {
    /// The worker's run: its client's `load`, and the scenario it was
    /// given, if any (the leader's, checked by its digest).
    pub fn spec(self, load: RunOptions, scenario: Option<Scenario>) -> WorkerSpec {
        WorkerSpec {
            load,
            output: self.output,
            scenario,
            coordinator: self.coordinator,
            index: self.index,
            workers: self.fleet.workers,
            heartbeat_timeout: self.fleet.heartbeat_timeout,
            join_timeout: self.fleet.join_timeout,
            build: build(),
        }
    }
}

/// Leads the fleet's run of `spec`: says where the workers find it, who
/// was lost and whose records are missing, and ends the run.
pub async fn lead(spec: RunSpec, summary: Summary, ui: Ui) -> anyhow::Result<ExitCode> {
    let run = Run::new(spec);
    cancel_on_signals(run.stop());
    let prepared = run
        .prepare(&run::notice)
        .await
        .map_err(run::explain_prepare)?;
    if let Some(addr) = prepared.coordinator() {
        // A fixed line (not a log line): scripts and tests read the port from it.
        eprintln!("coordinator listening on {addr}");
    }
    let executed = match prepared.execute().await {
        Ok(executed) => executed,
        Err(err) if err.is_interrupted() => return Ok(run::interrupted_before_load()),
        Err(err) => return Err(run::explain_execute(err)),
    };
    for gone in executed.departed() {
        eprintln!(
            "worker {} {} in step {}: {}",
            gone.worker,
            if gone.left { "left" } else { "was lost" },
            gone.step,
            gone.reason
        );
    }
    for missing in executed.missing_records() {
        eprintln!(
            "worker {worker}: its records are NOT in the results ({}); they stay in its own \
             --output-dir, worker-{worker}/",
            missing.reason,
            worker = missing.worker,
        );
    }
    run::end(executed, summary, ui).await
}

/// Runs worker `spec.index`'s part: joins the leader, runs the share it
/// hands out, shows its own ending and uploads its records.
pub async fn work(spec: WorkerSpec, json: bool, ui: Ui) -> anyhow::Result<ExitCode> {
    let index = spec.index;
    let worker = Worker::new(spec);
    // Ctrl-C and SIGTERM are handled from here on, also while the worker
    // waits to join (a script's `&` may have left SIGINT ignored).
    cancel_on_signals(worker.stop());
    let joined = match worker.join().await {
        Ok(joined) => joined,
        Err(JoinError::Interrupted) => {
            eprintln!("worker {index}: interrupted while waiting to join the leader");
            return Ok(ExitCode::from(130));
        }
        Err(JoinError::PreviousRun(previous)) => return Err(run::previous_run(&previous)),
        Err(JoinError::Fleet(err @ FleetError::Unreachable { .. })) => bail!(
            "{err}; --coordinator gives the leader's HOST:PORT, --join-timeout how long to wait"
        ),
        Err(JoinError::Fleet(err)) => return Err(err.into()),
    };
    let ran = match joined.execute().await {
        Ok(ran) => ran,
        Err(WorkerRunError {
            error: nyann_load::RunError::Interrupted,
            leader_lost,
        }) => {
            eprintln!("interrupted before any load was sent");
            return Ok(ExitCode::from(if leader_lost.is_some() { 1 } else { 130 }));
        }
        Err(err) => return Err(super::client::explain(err.error)),
    };
    show_ending(&ran.judged, &ran.conclusion, Some(&ran.own_dir), ui);
    print_summary(|| ran.summary_json(), json)?;
    let own_dir = ran.own_dir.clone();
    let uploaded = ran.upload().await;
    if let Err(err) = &uploaded.upload {
        eprintln!(
            "worker {index}: the records were not uploaded to the leader ({err}); they are in {}",
            own_dir.display()
        );
    }
    if let Some(reason) = &uploaded.leader_lost {
        let kept = match uploaded.requests_recorded {
            0 => "it sent no load, so there is no record to keep".to_string(),
            n => format!("its {n} records are kept in {}", own_dir.display()),
        };
        eprintln!("worker {index}: leader lost ({reason}); {kept}");
    }
    Ok(ExitCode::from(uploaded.exit_code()))
}
