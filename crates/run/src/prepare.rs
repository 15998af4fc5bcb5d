//! Before load is sent, everything that can fail does: a run the output
//! directory holds already, a stage a fleet cannot divide, the policy, the
//! signal source and its preflight, the fleet's coordination endpoint. A
//! run that passes has what it needs to start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use nyann_check::{CheckError, CongestionCheck, PolicyMode};
use nyann_fleet::share::{ShareError, scenario_share};
use nyann_fleet::{FleetError, Leader, LeaderConfig};
use nyann_load::Live;
use nyann_model::Scenario;
use nyann_policy_host::PolicyError;
use nyann_signals::{PreflightWarning, SignalError, SignalOptions, SignalSource};

use crate::spec::{LeadSpec, Output, PolicySpec, RunSpec};
use crate::stop::Stop;

/// A run not started yet: its spec and its [`Stop`], which the caller can
/// hand to whatever stops it (a signal handler) before preparing it.
pub struct Run {
    spec: RunSpec,
    stop: Stop,
}

/// Something the caller may want to tell its user while a run is
/// prepared (a log line, a field of a response); none stops the run.
#[derive(Debug, Clone)]
pub enum Notice {
    /// No stage is judged (no `until_congested`), yet a signal source is
    /// configured: its signals are not read.
    SignalsUnread,
    /// A capacity search (`refine=`) whose verdicts are only monitored: no
    /// sweep stops, so no capacity is searched (every stage is run and
    /// judged instead).
    SearchWithoutStop,
    /// What the signal source's preflight found missing, the run starting
    /// anyway.
    Preflight(PreflightWarning),
}

/// Why a run cannot start. No load has been sent.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    PreviousRun(PreviousRun),
    #[error(
        "a fleet's leader needs a run directory: each worker keeps its records in a \
         directory of its own under it, and the leader writes the merged results there"
    )]
    LeadWithoutOutput,
    /// A stage the fleet cannot divide between its workers.
    #[error(transparent)]
    Share(#[from] ShareError),
    /// The stop was requested while the run was prepared.
    #[error("interrupted before any load was sent")]
    Interrupted,
    #[error(transparent)]
    Policy(PolicyError),
    #[error(transparent)]
    Signals(SignalError),
    #[error(transparent)]
    Check(CheckError),
    /// The coordination endpoint could not listen.
    #[error(transparent)]
    Fleet(FleetError),
}

/// The output directory holds a run already (its results would be
/// overwritten), and overwriting it was not asked for.
#[derive(Debug, thiserror::Error)]
#[error("{} already holds a run ({file})", dir.display())]
pub struct PreviousRun {
    pub dir: PathBuf,
    /// The first result file found there.
    pub file: &'static str,
    /// When that file was written, if known.
    pub written: Option<SystemTime>,
}

/// A run ready to send load.
pub struct Prepared {
    pub(crate) spec: RunSpec,
    pub(crate) stop: Stop,
    /// `None` when no stage has a stop condition.
    pub(crate) check: Option<CongestionCheck>,
    pub(crate) live: Arc<Live>,
    pub(crate) role: Role,
}

/// Whether the run has workers to lead.
pub(crate) enum Role {
    Alone,
    Lead(Box<Lead>),
}

/// A leader's endpoint, bound.
pub(crate) struct Lead {
    pub(crate) leader: Leader,
    pub(crate) spec: LeadSpec,
    pub(crate) dir: PathBuf,
}

impl Run {
    pub fn new(spec: RunSpec) -> Run {
        let stop = Stop::of(&spec.load);
        Run { spec, stop }
    }

    /// Stops this run, from its preparation on.
    pub fn stop(&self) -> Stop {
        self.stop.clone()
    }

    pub fn spec(&self) -> &RunSpec {
        &self.spec
    }

    /// Checks everything that can fail before load is sent and raises the
    /// open-files limit for the streams; `notice` hears what the caller may
    /// want to say meanwhile. A stop requested during the preparation ends
    /// it ([`PrepareError::Interrupted`]).
    pub async fn prepare(self, notice: &(dyn Fn(Notice) + Sync)) -> Result<Prepared, PrepareError> {
        let Run { spec, stop } = self;
        if let Some(lead) = &spec.lead {
            if spec.output.is_none() {
                return Err(PrepareError::LeadWithoutOutput);
            }
            // A stage that cannot be divided is refused before anyone waits.
            for index in 0..lead.workers {
                scenario_share(&spec.scenario, lead.workers, index)?;
            }
        }
        if let Some(output) = &spec.output {
            refuse_a_previous_run(output).map_err(PrepareError::PreviousRun)?;
        }
        let check = tokio::select! {
            check = congestion_check(&spec.scenario, &spec.signals, &spec.policy, notice) => check?,
            () = stop.cancelled() => return Err(PrepareError::Interrupted),
        };
        if let Some(limit) = nyann_load::raise_fd_limit() {
            tracing::debug!("open-files limit: {limit}");
        }
        let role = match (&spec.lead, &spec.output) {
            (Some(lead), Some(output)) => Role::Lead(Box::new(Lead {
                leader: bind(lead, &output.dir).await?,
                spec: lead.clone(),
                dir: output.dir.clone(),
            })),
            _ => Role::Alone,
        };
        Ok(Prepared {
            spec,
            stop,
            check,
            live: Arc::new(Live::new()),
            role,
        })
    }
}

impl Prepared {
    /// The run's live figures (the stage running, its requests so far, in
    /// flight, failed, TTFT): what a progress display reads while
    /// [`Prepared::execute`] runs.
    pub fn live(&self) -> Arc<Live> {
        self.live.clone()
    }

    pub fn stop(&self) -> Stop {
        self.stop.clone()
    }

    pub fn scenario(&self) -> &Scenario {
        &self.spec.scenario
    }

    /// Where a fleet's leader listens for its workers (the port bound, when
    /// it was asked for port 0).
    pub fn coordinator(&self) -> Option<SocketAddr> {
        match &self.role {
            Role::Lead(lead) => lead.leader.local_addr(),
            Role::Alone => None,
        }
    }
}

/// Refuses an output directory that holds a run already, unless asked to
/// overwrite it.
pub(crate) fn refuse_a_previous_run(output: &Output) -> Result<(), PreviousRun> {
    refuse_a_run_in(&output.dir, output.overwrite)
}

pub(crate) fn refuse_a_run_in(dir: &Path, overwrite: bool) -> Result<(), PreviousRun> {
    match nyann_results::RunDir::at(dir).held_result() {
        Some((file, path)) if !overwrite => Err(PreviousRun {
            dir: dir.to_path_buf(),
            file,
            written: std::fs::metadata(path).and_then(|m| m.modified()).ok(),
        }),
        _ => Ok(()),
    }
}

/// The congestion check of `scenario`: `None` when no stage carries a stop
/// condition; otherwise the policy must load, a signal source must be
/// configured unless the policy reads no server signals, every
/// `until_congested(...)` call's parameters must pass the policy's checks,
/// and the source's preflight must find every role's server.
async fn congestion_check(
    scenario: &Scenario,
    signals: &SignalOptions,
    policy: &PolicySpec,
    notice: &(dyn Fn(Notice) + Sync),
) -> Result<Option<CongestionCheck>, PrepareError> {
    if !nyann_check::judges_any_stage(scenario) {
        if signals.prometheus_url.is_some() || !signals.scrape.is_empty() {
            notice(Notice::SignalsUnread);
        }
        return Ok(None);
    }
    if policy.settings.mode == PolicyMode::Monitor && scenario.searches_capacity() {
        notice(Notice::SearchWithoutStop);
    }
    // Its errors name the policy already ("cannot load policy X: ...").
    let loaded = policy
        .source
        .load(policy.host.clone())
        .await
        .map_err(PrepareError::Policy)?;
    let source = SignalSource::from_options(signals)
        .await
        .map_err(PrepareError::Signals)?;
    let check = CongestionCheck::new(scenario, loaded, source, policy.settings)
        .map_err(PrepareError::Check)?;
    if let Some(source) = check.source() {
        let warnings = source.preflight().await.map_err(PrepareError::Signals)?;
        for warning in warnings {
            notice(Notice::Preflight(warning));
        }
    }
    let loaded = check.policy();
    let info = loaded.info();
    tracing::info!(
        "congestion policy {} {} ({}, mode {}); server signals: {}",
        info.name,
        info.version,
        loaded.origin(),
        format!("{:?}", policy.settings.mode).to_lowercase(),
        match check.source() {
            Some(source) => source.to_string(),
            None => "none (the policy judges client figures only)".to_string(),
        }
    );
    Ok(Some(check))
}

/// The leader's coordination endpoint, listening.
async fn bind(lead: &LeadSpec, dir: &Path) -> Result<Leader, PrepareError> {
    let config = LeaderConfig {
        workers: lead.workers,
        heartbeat_timeout: lead.heartbeat_timeout,
        join_timeout: lead.join_timeout,
        on_loss: lead.on_loss,
        build: lead.build.clone(),
        output_dir: dir.to_path_buf(),
    };
    Leader::bind(lead.listen, config)
        .await
        .map_err(PrepareError::Fleet)
}
