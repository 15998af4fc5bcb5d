//! A fleet's processes: one sweep run by N of them, with one stop decision
//! (the protocol, the division of the load and the merge are
//! `nyann_fleet`'s). Worker 0 leads: it is a [`Run`](crate::Run) with a
//! [`LeadSpec`](crate::LeadSpec), whose execution here gathers the
//! workers, runs its own share, waits for theirs and merges everyone's
//! results into the run directory. Every other worker is a [`Worker`]: it
//! joins the leader, runs the share handed out and uploads its records
//! (it needs no scenario, policy or signal source).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nyann_check::conclusion::{self, Conclusion};
use nyann_check::{CongestionCheck, RunResult};
use nyann_fleet::protocol::scenario_digest;
use nyann_fleet::share::{dataset_share, first_id, scenario_share, worker_seed};
use nyann_fleet::{Coordinator, FleetError, WorkerConfig, WorkerGate, worker_dir};
use nyann_load::workload::{PromptGen, WorkloadError};
use nyann_load::{Live, RunOptions};
use nyann_model::{Scenario, Step};

use crate::execute::{ExecuteError, Executed, FleetEnding};
use crate::finish::save_metrics_texts;
use crate::prepare::{Lead, PreviousRun, refuse_a_run_in};
use crate::spec::{Output, RunSpec};
use crate::stop::Stop;

/// A peer (worker or leader) that sends nothing for this long is lost,
/// unless told otherwise.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a leader waits for its workers to join, and a worker for its
/// leader to answer, unless told otherwise.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(300);
/// The port a leader listens on, unless told otherwise.
pub const COORDINATOR_PORT: u16 = 7300;

/// A leader, prepared: its endpoint bound, its workers not gathered yet.
pub(crate) struct Leading {
    pub(crate) spec: RunSpec,
    pub(crate) stop: Stop,
    pub(crate) check: Option<CongestionCheck>,
    pub(crate) live: Arc<Live>,
    pub(crate) lead: Lead,
}

/// The time a worker's records may take to arrive after the leader's run,
/// on top of the drain and grace times, which the workers' last stage may
/// take too.
const UPLOAD_TIME: Duration = Duration::from_secs(60);

impl Leading {
    /// Gathers the workers, runs the leader's share of every stage with
    /// them, waits for their records and writes the fleet's results.
    pub(crate) async fn execute(self) -> Result<Executed, ExecuteError> {
        let Leading {
            spec,
            stop,
            check,
            live,
            lead:
                Lead {
                    leader,
                    spec: lead,
                    dir,
                },
        } = self;
        let workers = lead.workers;
        save_metrics_texts(&spec.signals, Some(&dir), "start").await;
        if let Some(check) = &check {
            check.start();
        }
        let mut options = spec.load;
        let seed = options.seed;
        refuse_small_eval_sets(&spec.scenario, seed, workers)?;
        tracing::info!("seed {seed}; waiting for {} worker(s) to join", workers - 1);
        let mut gate = leader
            .gather(
                &spec.scenario,
                seed,
                check,
                options.interrupt.clone(),
                options.interrupt_now.clone(),
            )
            .await?;
        let own_dir = worker_dir(&dir, 0);
        options.output_dir = Some(own_dir.clone());
        options.seed = worker_seed(seed, 0);
        options.first_id = first_id(0);
        options.dataset_share = Some(dataset_share(seed, 0, workers));
        options.live = Some(live);
        let grace = options.grace + options.drain_timeout;
        let share = scenario_share(&spec.scenario, workers, 0).map_err(FleetError::from)?;
        let result = nyann_load::run(&share, options, &mut gate).await?;
        let waited = gate
            .finish(
                result,
                Some(own_dir.join(nyann_results::REQUESTS)),
                grace + UPLOAD_TIME,
            )
            .await;
        save_metrics_texts(&spec.signals, Some(&dir), "end").await;
        let merged =
            nyann_fleet::merge::write(&waited, &dir).map_err(|source| ExecuteError::Merge {
                dir: dir.clone(),
                source,
            })?;
        copy_server_facts(&own_dir, &dir);
        Ok(Executed {
            scenario: spec.scenario,
            source: spec.source,
            dir: Some(dir),
            stop,
            workers,
            result: merged.result,
            fleet: Some(Box::new(FleetEnding {
                summary: merged.summary,
                departed: waited.departed,
            })),
        })
    }
}

/// What the servers said of themselves (`server.json`), as the leader
/// asked them, into the fleet's results.
fn copy_server_facts(own_dir: &Path, dir: &Path) {
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
}

/// Refuses, before a worker joins, an eval dataset with fewer questions
/// than the fleet has workers: the last worker (whose chunk is the
/// smallest) would have none to ask. (A ShareGPT file's share is known
/// only once tokens are counted: its worker says so.)
fn refuse_small_eval_sets(
    scenario: &Scenario,
    seed: u64,
    workers: usize,
) -> Result<(), WorkloadError> {
    let stages = scenario.steps.iter().filter_map(|step| match step {
        Step::Stage(stage) => stage.workload.as_ref(),
        Step::Barrier { .. } => None,
    });
    let last = dataset_share(seed, workers - 1, workers);
    for workload in std::iter::once(&scenario.workload).chain(stages) {
        if workload.kind.is_eval() {
            PromptGen::new(workload, seed, last)?;
        }
    }
    Ok(())
}

/// Everything a fleet's worker 1..N-1 needs.
#[derive(Debug)]
pub struct WorkerSpec {
    /// The client and the run's timeouts (the leader hands out the seed,
    /// the first id and the dataset share; the run sets `output_dir`).
    pub load: RunOptions,
    /// The fleet's run directory: the worker keeps its own results in
    /// `worker-I/` under it.
    pub output: Output,
    /// The scenario, if the worker was given one: it must then be the
    /// leader's.
    pub scenario: Option<Scenario>,
    /// The leader's coordination endpoint.
    pub coordinator: Coordinator,
    /// This worker's index, 1..N-1.
    pub index: usize,
    pub workers: usize,
    /// The leader is lost when it sends nothing for this long.
    pub heartbeat_timeout: Duration,
    /// How long to keep trying to reach the leader.
    pub join_timeout: Duration,
    /// This binary's [`build_id`](nyann_fleet::protocol::build_id).
    pub build: String,
}

/// A worker not joined yet.
pub struct Worker {
    spec: WorkerSpec,
    stop: Stop,
}

/// Why a worker did not join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    PreviousRun(PreviousRun),
    /// The stop was requested while waiting for the leader.
    #[error("interrupted while waiting to join the leader")]
    Interrupted,
    #[error(transparent)]
    Fleet(FleetError),
}

/// A worker joined, its share of the run handed out.
pub struct Joined {
    spec: WorkerSpec,
    joined: nyann_fleet::worker::Joined,
}

/// Why a worker's run did not end with results.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct WorkerRunError {
    #[source]
    pub error: nyann_load::RunError,
    /// Why the leader was lost, if it was (an interrupt then came from it).
    pub leader_lost: Option<String>,
}

/// A worker's run ended, its records not uploaded yet.
pub struct WorkerRan {
    /// What the worker shows of its run: its stages without verdicts (the
    /// leader judged), the leader's abort as its outcome.
    pub judged: RunResult,
    pub conclusion: Conclusion,
    /// The worker's own results directory.
    pub own_dir: PathBuf,
    result: nyann_load::RunResult<serde_json::Value>,
    gate: WorkerGate,
    dir: PathBuf,
    leader_lost: Option<String>,
    aborted: Option<String>,
}

/// How a worker's run ended, its records uploaded or not.
#[derive(Debug)]
pub struct Uploaded {
    /// Why the records did not reach the leader, if they did not.
    pub upload: Result<(), FleetError>,
    /// Why the leader was lost, if it was.
    pub leader_lost: Option<String>,
    /// The leader's abort reason, if it aborted the run.
    pub aborted: Option<String>,
    /// Records kept in the worker's own directory.
    pub requests_recorded: u64,
    judged_exit_code: u8,
}

/// How long one upload attempt of the records may take.
const UPLOAD_ATTEMPT_TIME: Duration = Duration::from_secs(120);

impl Worker {
    pub fn new(spec: WorkerSpec) -> Worker {
        let stop = Stop::of(&spec.load);
        Worker { spec, stop }
    }

    /// Stops this worker, from its wait for the leader on (passed on to
    /// the leader as its leaving).
    pub fn stop(&self) -> Stop {
        self.stop.clone()
    }

    pub fn index(&self) -> usize {
        self.spec.index
    }

    /// Refuses a run its own directory holds already, then joins the
    /// leader (retrying until the join timeout).
    pub async fn join(self) -> Result<Joined, JoinError> {
        let spec = self.spec;
        refuse_a_run_in(
            &worker_dir(&spec.output.dir, spec.index),
            spec.output.overwrite,
        )
        .map_err(JoinError::PreviousRun)?;
        let config = WorkerConfig {
            coordinator: spec.coordinator.clone(),
            index: spec.index,
            workers: spec.workers,
            heartbeat_timeout: spec.heartbeat_timeout,
            join_timeout: spec.join_timeout,
            build: spec.build.clone(),
            scenario_digest: spec.scenario.as_ref().map(scenario_digest),
        };
        let joined = tokio::select! {
            joined = nyann_fleet::join(&config) => joined.map_err(JoinError::Fleet)?,
            () = self.stop.cancelled() => return Err(JoinError::Interrupted),
        };
        tracing::info!(
            "worker {}: joined; seed {}",
            spec.index,
            joined.assignment.seed
        );
        Ok(Joined { spec, joined })
    }
}

impl Joined {
    /// The seed the leader handed out.
    pub fn seed(&self) -> u64 {
        self.joined.assignment.seed
    }

    /// Runs the share the leader handed out, stage by stage as the leader
    /// says.
    pub async fn execute(self) -> Result<WorkerRan, WorkerRunError> {
        let Joined { spec, joined } = self;
        nyann_load::raise_fd_limit();
        let dir = spec.output.dir;
        let own_dir = worker_dir(&dir, spec.index);
        let mut options = spec.load;
        options.output_dir = Some(own_dir.clone());
        options.seed = joined.assignment.seed;
        options.first_id = joined.assignment.first_id;
        options.dataset_share = Some(joined.assignment.dataset_share);
        let scenario = joined.assignment.scenario.clone();
        let mut gate = joined.start(options.interrupt.clone(), options.interrupt_now.clone());
        let result = nyann_load::run(&scenario, options, &mut gate).await;
        let leader_lost = gate.leader_lost();
        let aborted = gate.aborted();
        let result = result.map_err(|error| WorkerRunError {
            error,
            leader_lost: leader_lost.clone(),
        })?;
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
        Ok(WorkerRan {
            judged,
            conclusion,
            own_dir,
            result,
            gate,
            dir,
            leader_lost,
            aborted,
        })
    }
}

impl WorkerRan {
    /// The worker's summary, with its conclusion (for stdout).
    pub fn summary_json(&self) -> serde_json::Result<String> {
        conclusion::summary_json(&self.judged, &self.conclusion)
    }

    /// Sends the result and the records to the leader (each attempt within
    /// two minutes; none when the leader shares the run directory and
    /// reads them there).
    pub async fn upload(self) -> Uploaded {
        let records = self.own_dir.join(nyann_results::REQUESTS);
        let upload = self
            .gate
            .upload(
                &self.result,
                Some(&records),
                Some(&self.dir),
                UPLOAD_ATTEMPT_TIME,
            )
            .await
            .map(|_shared| ());
        Uploaded {
            upload,
            leader_lost: self.leader_lost,
            aborted: self.aborted,
            requests_recorded: self.result.requests_recorded,
            judged_exit_code: crate::exit_code(&self.judged),
        }
    }
}

impl Uploaded {
    /// 1 when the leader was lost or aborted the run; the run's own code
    /// otherwise, degraded (3) when its records did not reach the leader.
    pub fn exit_code(&self) -> u8 {
        if self.leader_lost.is_some() || self.aborted.is_some() {
            return 1;
        }
        match self.judged_exit_code {
            // Its records are not in the leader's results: the run is degraded.
            0 if self.upload.is_err() => nyann_load::EXIT_DEGRADED,
            code => code,
        }
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
