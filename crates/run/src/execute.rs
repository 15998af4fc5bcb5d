//! The load: one process's run of the scenario, or a fleet leader's run of
//! its share with its workers ([`crate::fleet`]). The server's `/metrics`
//! texts are saved at both ends.

use std::net::SocketAddr;
use std::path::PathBuf;

use nyann_check::RunResult;
use nyann_fleet::FleetError;
use nyann_fleet::merge::{FleetAnnotation, LostWorker, MissingRecords};
use nyann_model::Scenario;

use crate::finish::save_metrics_texts;
use crate::prepare::{Prepared, Role};
use crate::stop::Stop;

/// Why the load did not run to its end with results.
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    #[error("cannot serve the client metrics on {addr}")]
    ClientMetrics {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The runner's: the scenario, the server or the workload refused, or
    /// the stop was requested before any load was sent.
    #[error(transparent)]
    Load(#[from] nyann_load::RunError),
    /// The fleet could not run (or was interrupted while gathering).
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// An eval dataset with fewer questions than the fleet has workers.
    #[error(transparent)]
    Workload(#[from] nyann_load::workload::WorkloadError),
    #[error("cannot write the fleet's results to {}", dir.display())]
    Merge {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ExecuteError {
    /// The stop was requested before any load was sent.
    pub fn is_interrupted(&self) -> bool {
        matches!(
            self,
            ExecuteError::Load(nyann_load::RunError::Interrupted)
                | ExecuteError::Fleet(FleetError::Interrupted)
        )
    }
}

/// A run whose load has ended, before its ending is written.
pub struct Executed {
    pub(crate) scenario: Scenario,
    pub(crate) source: Option<String>,
    pub(crate) dir: Option<PathBuf>,
    pub(crate) stop: Stop,
    /// Processes that ran it.
    pub(crate) workers: usize,
    /// The stages with their verdicts (a fleet's merged).
    pub(crate) result: RunResult,
    pub(crate) fleet: Option<Box<FleetEnding>>,
}

/// What only a fleet's run has.
pub(crate) struct FleetEnding {
    /// `summary.json`'s content: each stage with the fleet beside its verdict.
    pub(crate) summary: nyann_load::RunResult<FleetAnnotation<nyann_check::Judged>>,
    pub(crate) departed: Vec<LostWorker>,
}

impl Prepared {
    /// Runs the stages with the congestion check (a fleet's leader: its
    /// share, with its workers, and merges everyone's results).
    pub async fn execute(self) -> Result<Executed, ExecuteError> {
        let Prepared {
            spec,
            stop,
            check,
            live,
            role,
        } = self;
        if let Role::Lead(lead) = role {
            let leading = crate::fleet::Leading {
                spec,
                stop,
                check,
                live,
                lead: *lead,
            };
            return leading.execute().await;
        }
        let dir = spec.output.as_ref().map(|output| output.dir.clone());
        save_metrics_texts(&spec.signals, dir.as_deref(), "start").await;
        let mut options = spec.load;
        options.output_dir = dir.clone();
        options.live = Some(live.clone());
        if let Some(addr) = spec.client_metrics {
            let bound = nyann_load::metrics::serve(addr, live)
                .await
                .map_err(|source| ExecuteError::ClientMetrics { addr, source })?;
            tracing::info!("client metrics: http://{bound}/metrics");
        }
        tracing::info!("seed {}", options.seed);
        if let Some(check) = &check {
            check.start();
        }
        let result = nyann_load::run(&spec.scenario, options, check).await?;
        save_metrics_texts(&spec.signals, dir.as_deref(), "end").await;
        Ok(Executed {
            scenario: spec.scenario,
            source: spec.source,
            dir,
            stop,
            workers: 1,
            result,
            fleet: None,
        })
    }
}

impl Executed {
    /// The stages with their verdicts (a fleet's merged).
    pub fn result(&self) -> &RunResult {
        &self.result
    }

    /// A fleet's workers lost or gone, in order.
    pub fn departed(&self) -> &[LostWorker] {
        self.fleet.as_ref().map_or(&[], |fleet| &fleet.departed)
    }

    /// A fleet's workers whose records are not in the results (they stay
    /// in that worker's own directory), with why.
    pub fn missing_records(&self) -> Vec<MissingRecords> {
        let nyann_load::RunOutcome::Degraded {
            missing_records,
            reasons,
            ..
        } = &self.result.outcome
        else {
            return Vec::new();
        };
        missing_records
            .iter()
            .map(|&worker| MissingRecords {
                worker,
                reason: reasons
                    .iter()
                    .find(|r| r.starts_with(&format!("the records of worker {worker} ")))
                    .cloned()
                    .unwrap_or_else(|| "see fleet.json".into()),
            })
            .collect()
    }
}
