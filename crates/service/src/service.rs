//! The domain core behind every interface (the JSON API, MCP, the web
//! page): plan, submit, list, get, cancel, the artifacts and the report of
//! runs, who may do which, and the scheduler that starts queued runs one at
//! a time per target, within a bound on the runs overall.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::auth::{Caller, Denied, Scope};
use crate::kubernetes::{Cluster, ClusterSettings, JobEnd, RunObjects};
use crate::launcher::{Job, Launcher};
use crate::local;
use crate::plan::{Plan, PlanError, PlanRequest};
use crate::store::{NewRun, RunRow, Status, Store, StoreError};
use crate::targets::{Bounds, Target, Targets};

/// How long a cancel waits for the run's drain before answering.
pub const CANCEL_WAIT: Duration = Duration::from_secs(120);
/// How long a run left behind by a previous service gets to drain.
const ORPHAN_WAIT: Duration = Duration::from_secs(120);
/// How often the scheduler looks at the queue without being woken.
const SCHEDULE_TICK: Duration = Duration::from_secs(1);
/// The most runs a list returns.
pub const LIST_LIMIT: usize = 1000;

/// The service's settings (the host resolves its flags into these).
#[derive(Debug, Clone)]
pub struct Config {
    /// The database, the runs' directories and logs.
    pub data_dir: PathBuf,
    /// Runs at once over all targets.
    pub max_running: usize,
    /// Runs as Jobs in this cluster; none: as child processes here.
    pub cluster: Option<ClusterSettings>,
}

/// A run as clients see it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunView {
    #[serde(flatten)]
    pub row: RunRow,
    /// 1 for the next to start on its target, when queued.
    pub queue_position: Option<usize>,
}

/// A run's details: the plan, and the run directory's summary once written.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunView,
    pub plan: serde_json::Value,
    /// `summary.json`'s outcome, stages and conclusion, once the run wrote it.
    pub summary: Option<serde_json::Value>,
    /// Until then, the stages so far (`stages.json`'s, rewritten as each
    /// stage ends): a running run's live view.
    pub stages: Option<serde_json::Value>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The caller's token does not allow it.
    #[error(transparent)]
    Denied(#[from] Denied),
    #[error("no run {0:?}: list the runs to see their ids")]
    NotFound(String),
    #[error("run {id} is {status}: only a queued or running run can be canceled", status = .status.as_str())]
    Finished { id: String, status: Status },
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Cluster(String),
}

pub struct Service {
    config: Config,
    targets: Targets,
    launcher: Arc<dyn Launcher>,
    store: Store,
    /// The Kubernetes backend's API server; none: the local backend.
    cluster: Option<Cluster>,
    wake: Notify,
    /// Set by [`Service::shutdown`]: no run starts any more.
    stopping: AtomicBool,
}

impl Service {
    /// Opens the data directory, marks the runs a previous service left
    /// running, and starts the scheduler (queued runs still run).
    pub async fn open(
        config: Config,
        targets: Targets,
        launcher: Arc<dyn Launcher>,
    ) -> Result<Arc<Service>, ServiceError> {
        for dir in [
            config.data_dir.clone(),
            config.data_dir.join("runs"),
            config.data_dir.join("plans"),
        ] {
            std::fs::create_dir_all(&dir)
                .map_err(|e| ServiceError::Io(format!("cannot create {}: {e}", dir.display())))?;
        }
        let cluster = match &config.cluster {
            Some(settings) => Some(
                Cluster::connect(settings.clone())
                    .await
                    .map_err(ServiceError::Cluster)?,
            ),
            None => {
                let fleets: Vec<String> = targets
                    .iter()
                    .filter(|t| t.workers > 1)
                    .map(|t| format!("target {:?} takes {} workers", t.name, t.workers))
                    .collect();
                if !fleets.is_empty() {
                    return Err(ServiceError::Cluster(format!(
                        "{}: runs of several workers need the Kubernetes backend (the local one runs one process per run)",
                        fleets.join(", ")
                    )));
                }
                None
            }
        };
        let store = Store::open(&config.data_dir.join("runs.db"))?;
        let service = Arc::new(Service {
            config,
            targets,
            launcher,
            store,
            cluster,
            wake: Notify::new(),
            stopping: AtomicBool::new(false),
        });
        service.recover()?;
        let scheduler = Arc::clone(&service);
        tokio::spawn(async move { scheduler.schedule_forever().await });
        Ok(service)
    }

    pub fn targets(&self) -> &Targets {
        &self.targets
    }

    /// The targets as clients see them: never their URLs.
    pub fn target_views(&self) -> Vec<TargetView> {
        self.targets
            .iter()
            .map(|t| TargetView {
                name: t.name.clone(),
                model: t.model.clone(),
                bounds: t.bounds,
                policies: t.policies.clone(),
                signals: t.signals.is_configured(),
                workers: t.workers,
            })
            .collect()
    }

    /// [`Service::submit`] for `caller`: it needs scope submit, and the
    /// target among those its token allows.
    pub async fn submit_as(
        &self,
        caller: &Caller,
        request: &PlanRequest,
    ) -> Result<(RunView, bool), ServiceError> {
        caller.require(Scope::Submit, "submitting a run")?;
        caller.require_target(&request.target)?;
        self.submit(request, &caller.name).await
    }

    /// [`Service::cancel`] for `caller`: it needs scope submit, and scope
    /// admin for another's run.
    pub async fn cancel_as(&self, caller: &Caller, id: &str) -> Result<RunView, ServiceError> {
        caller.require(Scope::Submit, "canceling a run")?;
        let row = self.row(id)?;
        if caller.scope < Scope::Admin && row.submitted_by != caller.name {
            return Err(Denied(format!(
                "run {id} was submitted by {:?}: canceling another's run needs scope admin",
                row.submitted_by
            ))
            .into());
        }
        self.cancel(id, &caller.name).await
    }

    /// Plans `request`; under the Kubernetes backend the run's objects are
    /// also checked by the API server (a server-side dry run).
    pub async fn plan(&self, request: &PlanRequest) -> Result<Plan, PlanError> {
        let scratch = self.config.data_dir.join("plans");
        let plan = crate::plan::plan(&self.targets, &*self.launcher, &scratch, request).await?;
        if let (Some(cluster), Some(target)) = (&self.cluster, self.targets.get(&plan.target)) {
            match self.objects(cluster, &run_id(request), target, &plan) {
                Ok(objects) => cluster.dry_run(&objects).await,
                Err(e) => Err(e),
            }
            .map_err(PlanError::Cluster)?;
        }
        Ok(plan)
    }

    /// A run's objects under the Kubernetes backend.
    fn objects(
        &self,
        cluster: &Cluster,
        run_id: &str,
        target: &Target,
        plan: &Plan,
    ) -> Result<nyann_kube::Manifests, String> {
        cluster.render(&RunObjects {
            run_id,
            target,
            scenario: &plan.scenario,
            policy: &plan.policy,
            target_flags: self.launcher.target_flags(target),
        })
    }

    /// Plans `request` again and queues it; the same request gives the same
    /// run (`false`: it existed already).
    pub async fn submit(
        &self,
        request: &PlanRequest,
        by: &str,
    ) -> Result<(RunView, bool), ServiceError> {
        let id = run_id(request);
        if let Some(run) = self.store.get(&id)? {
            return Ok((self.view(run)?, false));
        }
        let plan = self.plan(request).await?;
        let dir = self.run_dir(&id);
        self.store.insert(&NewRun {
            id: &id,
            target: &request.target,
            label: request.label.as_deref(),
            policy: request.policy(),
            submitted_by: by,
            dir: &dir.display().to_string(),
            request: &to_json(request),
            plan: &to_json(&plan),
        })?;
        self.wake.notify_one();
        let run = self
            .store
            .get(&id)?
            .ok_or_else(|| ServiceError::NotFound(id.clone()))?;
        Ok((self.view(run)?, true))
    }

    /// The newest runs first.
    pub fn list(&self) -> Result<Vec<RunView>, ServiceError> {
        let queued = self.store.with_status(Status::Queued)?;
        let runs = self.store.list(LIST_LIMIT)?;
        Ok(runs
            .into_iter()
            .map(|row| RunView {
                queue_position: position(&queued, &row),
                row,
            })
            .collect())
    }

    pub fn get(&self, id: &str) -> Result<RunDetail, ServiceError> {
        let row = self.row(id)?;
        let plan = serde_json::from_str(&row.plan).unwrap_or(serde_json::Value::Null);
        let read = |name: &str| {
            std::fs::read_to_string(Path::new(&row.dir).join(name))
                .ok()
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        };
        let summary = read(nyann_results::SUMMARY);
        let stages = match summary {
            Some(_) => None,
            None => read(nyann_results::STAGES).map(|mut file| file["stages"].take()),
        };
        Ok(RunDetail {
            run: self.view(row)?,
            plan,
            summary,
            stages,
        })
    }

    /// Cancels a queued run at once, or interrupts a running one and waits
    /// (up to [`CANCEL_WAIT`]) for its drain: its completed records are kept.
    pub async fn cancel(&self, id: &str, by: &str) -> Result<RunView, ServiceError> {
        let row = self.row(id)?;
        if !self.store.cancel_requested(id, by)? {
            return Err(ServiceError::Finished {
                id: id.to_string(),
                status: row.status,
            });
        }
        if !self.store.cancel_queued(id)? {
            // Running (it may have started just now): interrupt its process.
            if let Some(row) = self.store.get(id)?
                && row.status == Status::Running
            {
                match (row.pid, &self.cluster) {
                    (Some(pid), _) => {
                        local::interrupt(pid);
                    }
                    (None, Some(cluster)) => {
                        cluster.interrupt(id).await.map_err(ServiceError::Cluster)?;
                    }
                    (None, None) => {}
                }
            }
            let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
            while !self.row(id)?.status.is_final() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.wake.notify_one();
        self.view(self.row(id)?)
    }

    /// The run's report in brief (see [`crate::report`]).
    pub fn report(&self, id: &str) -> Result<crate::report::RunReport, ServiceError> {
        Ok(crate::report::report(&self.row(id)?))
    }

    /// The run directory's files a client may fetch: its regular files
    /// and the run's log.
    pub fn artifacts(&self, id: &str) -> Result<Vec<Artifact>, ServiceError> {
        let row = self.row(id)?;
        let mut artifacts = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&row.dir) {
            for entry in entries.flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_file() {
                    artifacts.push(Artifact {
                        name: entry.file_name().to_string_lossy().into_owned(),
                        bytes: meta.len(),
                    });
                }
            }
        }
        if let Ok(meta) = std::fs::metadata(self.log_path(id)) {
            artifacts.push(Artifact {
                name: LOG.to_string(),
                bytes: meta.len(),
            });
        }
        artifacts.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(artifacts)
    }

    /// The path of artifact `name` of run `id`, if it is one.
    pub fn artifact_path(&self, id: &str, name: &str) -> Result<Option<PathBuf>, ServiceError> {
        let listed = self.artifacts(id)?.into_iter().any(|a| a.name == name);
        if !listed {
            return Ok(None);
        }
        Ok(Some(if name == LOG {
            self.log_path(id)
        } else {
            Path::new(&self.row(id)?.dir).join(name)
        }))
    }

    fn row(&self, id: &str) -> Result<RunRow, ServiceError> {
        self.store
            .get(id)?
            .ok_or_else(|| ServiceError::NotFound(id.to_string()))
    }

    fn view(&self, row: RunRow) -> Result<RunView, ServiceError> {
        let queue_position = match row.status {
            Status::Queued => position(&self.store.with_status(Status::Queued)?, &row),
            _ => None,
        };
        Ok(RunView {
            row,
            queue_position,
        })
    }

    fn run_dir(&self, id: &str) -> PathBuf {
        self.config.data_dir.join("runs").join(id)
    }

    fn log_path(&self, id: &str) -> PathBuf {
        self.config.data_dir.join("runs").join(format!("{id}.log"))
    }

    /// Runs marked running by a service that is gone: a process that died
    /// reads `interrupted` now; one still alive (an orphan of a killed
    /// service) is interrupted, given its drain, then reads `interrupted`.
    /// Its target counts as busy until then. A Job in the cluster is
    /// watched again.
    fn recover(self: &Arc<Self>) -> Result<(), ServiceError> {
        for run in self.store.with_status(Status::Running)? {
            let dir = PathBuf::from(&run.dir);
            match run.pid {
                Some(pid) if local::is_run_alive(pid, &dir) => {
                    local::interrupt(pid);
                    let service = Arc::clone(self);
                    tokio::spawn(async move {
                        let deadline = tokio::time::Instant::now() + ORPHAN_WAIT;
                        while local::is_run_alive(pid, &dir) {
                            if tokio::time::Instant::now() > deadline {
                                local::kill_now(pid);
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        let message = "the service stopped while this run ran: it was interrupted when the service came back, its completed records are kept";
                        service.mark(&run.id, Status::Interrupted, None, Some(message));
                    });
                }
                None if self.cluster.is_some() => {
                    // A Job runs on without the service: watch it again.
                    self.watch(run.id.clone(), dir, None);
                }
                _ => {
                    let message = "the run's process ended while the service was down: its completed records are kept";
                    self.mark(&run.id, Status::Interrupted, None, Some(message));
                }
            }
        }
        Ok(())
    }

    fn mark(&self, id: &str, status: Status, exit: Option<i32>, message: Option<&str>) {
        let brief = self
            .store
            .get(id)
            .ok()
            .flatten()
            .map(|row| crate::report::report(&row).brief());
        if let Err(e) = self
            .store
            .finished(id, status, exit, message, brief.as_ref())
        {
            tracing::error!(
                "run {id}: cannot record that it is {}: {e}",
                status.as_str()
            );
        }
        self.wake.notify_one();
    }

    async fn schedule_forever(self: Arc<Self>) {
        loop {
            if let Err(e) = self.schedule() {
                tracing::error!("the scheduler: {e}");
            }
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(SCHEDULE_TICK) => {}
            }
        }
    }

    /// Starts nothing more, interrupts the running processes and waits (up
    /// to [`CANCEL_WAIT`]) for their drains; they read `interrupted`, queued
    /// runs stay queued for the next start. Jobs in the cluster run on.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let running = self.store.with_status(Status::Running).unwrap_or_default();
        for pid in running.iter().filter_map(|run| run.pid) {
            local::interrupt(pid);
        }
        let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
        while tokio::time::Instant::now() < deadline
            && self
                .store
                .with_status(Status::Running)
                .is_ok_and(|running| running.iter().any(|run| run.pid.is_some()))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts the oldest queued run of each idle target, within the bound.
    fn schedule(self: &Arc<Self>) -> Result<(), ServiceError> {
        if self.stopping.load(Ordering::SeqCst) {
            return Ok(());
        }
        let running = self.store.with_status(Status::Running)?;
        let mut busy: HashSet<String> = running.iter().map(|r| r.target.clone()).collect();
        let mut slots = self.config.max_running.saturating_sub(running.len());
        for run in self.store.with_status(Status::Queued)? {
            if slots == 0 {
                break;
            }
            if busy.contains(&run.target) {
                continue;
            }
            busy.insert(run.target.clone());
            slots -= 1;
            self.start(run)?;
        }
        Ok(())
    }

    fn start(self: &Arc<Self>, run: RunRow) -> Result<(), ServiceError> {
        let failed = |message: String| {
            tracing::warn!("run {}: {message}", run.id);
            self.mark(&run.id, Status::Failed, None, Some(&message));
            Ok(())
        };
        let Some(target) = self.targets.get(&run.target) else {
            return failed(format!(
                "target {:?} is no longer in the targets file",
                run.target
            ));
        };
        let dir = PathBuf::from(&run.dir);
        let plan: Plan = match serde_json::from_str(&run.plan) {
            Ok(plan) => plan,
            Err(e) => return failed(format!("its stored plan does not read: {e}")),
        };
        let scenario = self
            .config
            .data_dir
            .join("runs")
            .join(format!("{}.json", run.id));
        let written = std::fs::create_dir_all(&dir).and_then(|()| {
            std::fs::write(
                &scenario,
                serde_json::to_vec(&plan.scenario).unwrap_or_default(),
            )
        });
        if let Err(e) = written {
            return failed(format!(
                "cannot write its run directory {}: {e}",
                dir.display()
            ));
        }
        if let Some(cluster) = &self.cluster {
            let objects = match self.objects(cluster, &run.id, target, &plan) {
                Ok(objects) => objects,
                Err(e) => return failed(format!("its objects cannot be rendered: {e}")),
            };
            self.store.started(&run.id, None)?;
            tracing::info!(
                "run {} started on target {} (Job {} in namespace {})",
                run.id,
                run.target,
                Cluster::object_name(&run.id),
                cluster.namespace()
            );
            self.watch(run.id.clone(), dir, Some(objects));
            return Ok(());
        }
        let job = Job {
            target,
            scenario: &scenario,
            output_dir: &dir,
            policy: &run.policy,
        };
        let started = match local::start(&*self.launcher, job, &self.log_path(&run.id)) {
            Ok(started) => started,
            Err(e) => return failed(format!("cannot start its process: {e}")),
        };
        self.store.started(&run.id, Some(started.pid))?;
        tracing::info!(
            "run {} started on target {} (pid {})",
            run.id,
            run.target,
            started.pid
        );
        let service = Arc::clone(self);
        let mut child = started.child;
        tokio::spawn(async move {
            let status = child.wait().await;
            service.ended(&run.id, &dir, status);
        });
        Ok(())
    }

    /// Creates the run's objects (when given: a new run) and watches its
    /// Job until it ends; then its logs are kept, its objects deleted, and
    /// its status read from the Job's end and the run's summary.
    fn watch(self: &Arc<Self>, id: String, dir: PathBuf, create: Option<nyann_kube::Manifests>) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let service = Arc::clone(self);
        tokio::spawn(async move {
            if let Some(objects) = create
                && let Err(e) = cluster.create(&objects).await
            {
                let message = format!("the cluster refused its objects: {e}");
                tracing::warn!("run {id}: {message}");
                cluster.clean_up(&id, &service.log_path(&id)).await;
                service.mark(&id, Status::Failed, None, Some(&message));
                return;
            }
            let end = cluster.wait(&id).await;
            cluster.clean_up(&id, &service.log_path(&id)).await;
            let canceled = service.is_canceled(&id);
            let (status, message) = match end {
                JobEnd::Complete => (outcome_of(&dir), None),
                JobEnd::Gone | JobEnd::Failed(_) if canceled => (Status::Canceled, None),
                JobEnd::Failed(why) => (
                    Status::Failed,
                    Some(format!("its Job failed ({why}): see the artifact {LOG}")),
                ),
                JobEnd::Gone => (
                    Status::Failed,
                    Some("its Job was deleted outside the service".to_string()),
                ),
            };
            tracing::info!("run {id} {}", status.as_str());
            service.mark(&id, status, None, message.as_deref());
        });
    }

    fn is_canceled(&self, id: &str) -> bool {
        self.store
            .get(id)
            .ok()
            .flatten()
            .is_some_and(|r| r.canceled_by.is_some())
    }

    /// The child exited: its status from its exit code and summary.
    fn ended(&self, id: &str, dir: &Path, status: std::io::Result<std::process::ExitStatus>) {
        let canceled = self.is_canceled(id);
        let code = status.as_ref().ok().and_then(|s| s.code());
        let (status, message) = match code {
            Some(0) => (outcome_of(dir), None),
            Some(3) => (
                Status::Completed,
                Some("degraded: see the summary's conclusion".to_string()),
            ),
            Some(130) if canceled => (Status::Canceled, None),
            Some(130) => (
                Status::Interrupted,
                Some(
                    "the service shut down while it ran: its completed records are kept"
                        .to_string(),
                ),
            ),
            None if canceled => (Status::Canceled, None),
            code => (
                Status::Failed,
                Some(format!(
                    "the run's process exited with {}: see the artifact {LOG}",
                    code.map_or("a signal".to_string(), |c| format!("status {c}"))
                )),
            ),
        };
        tracing::info!("run {id} {}", status.as_str());
        self.mark(id, status, code, message.as_deref());
    }
}

/// A run that ended well: `stopped` when its summary says it stopped on
/// congestion, else `completed`.
fn outcome_of(dir: &Path) -> Status {
    let kind = std::fs::read_to_string(dir.join(nyann_results::SUMMARY))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|s| s["outcome"]["kind"].as_str().map(str::to_owned));
    match kind.as_deref() {
        Some("stopped") => Status::Stopped,
        _ => Status::Completed,
    }
}

/// The run's log (the child's stdout and stderr), as an artifact.
pub const LOG: &str = "run.log";

/// A target as clients see it (its URL and signal source stay the
/// operator's).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TargetView {
    pub name: String,
    pub model: Option<String>,
    /// What a scenario on it may ask for.
    pub bounds: Bounds,
    /// The congestion policies a run on it may name.
    pub policies: Vec<String>,
    /// Whether it has a signal source: `until_congested` needs one.
    pub signals: bool,
    /// Pods a run on it takes (under the Kubernetes backend).
    pub workers: usize,
}

/// A file of a run a client may fetch.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Artifact {
    pub name: String,
    pub bytes: u64,
}

/// The 1-based place of `row` among the queued runs of its target.
fn position(queued: &[RunRow], row: &RunRow) -> Option<usize> {
    if row.status != Status::Queued {
        return None;
    }
    queued
        .iter()
        .filter(|q| q.target == row.target)
        .position(|q| q.id == row.id)
        .map(|p| p + 1)
}

/// The same request gives the same id (submit is idempotent).
fn run_id(request: &PlanRequest) -> String {
    let canonical = serde_json::to_string(request).unwrap_or_default();
    let digest = Sha256::digest(canonical.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("r-{hex}")
}

/// JSON text of plain data (which always serialises).
fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
