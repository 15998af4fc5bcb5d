//! A worker's side of the protocol: join the leader, then act as the
//! runner's [`StageHook`]: wait for each stage's start, send each measured
//! stage's statistics and apply the leader's decision; finally upload the
//! records.
//!
//! A background task reads the leader's messages: Ctrl-C or an abort on the
//! leader interrupts this worker's run; a leader silent for the heartbeat
//! timeout (or a closed connection) counts as lost: the run is interrupted
//! (the usual grace applies), the records stay on disk and the worker exits 1.
//! A worker interrupted by its own Ctrl-C/SIGTERM (a pod eviction) tells the
//! leader it leaves, so that the leader records the departure.
//!
//! Joining waits for the leader (its pod may start later) and says, at most
//! every few seconds, why the last try failed: a wrong name or port must not
//! look like a slow leader for the whole join timeout.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nyann_load::{CancellationToken, FinishedStage, HookOutcome, NextSearch, RunResult, StageHook};
use nyann_model::{Scenario, Stage};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::FleetError;
use crate::coordinator::Coordinator;
use crate::protocol::{
    Queued, ToLeader, ToWorker, WireError, marker_name, receive, send, write_task,
};
use crate::share::search_share;

/// How a worker finds and joins its leader.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The leader's coordination endpoint.
    pub coordinator: Coordinator,
    pub index: usize,
    pub workers: usize,
    pub heartbeat_timeout: Duration,
    /// How long to keep trying to reach the leader (its pod may start later).
    pub join_timeout: Duration,
    /// This binary's [`build_id`](crate::protocol::build_id): the leader refuses a different one.
    pub build: String,
    /// Digest of the scenario this worker was given, if any (checked by the leader).
    pub scenario_digest: Option<String>,
}

/// What the leader handed this worker.
#[derive(Debug)]
pub struct Assignment {
    pub scenario: Scenario,
    pub seed: u64,
    pub first_id: u64,
    /// The worker's part of the scenario's eval datasets.
    pub dataset_share: nyann_load::DatasetShare,
    /// The run's token (names the leader's shared-directory marker).
    pub run: String,
}

/// A joined worker, before its run starts.
pub struct Joined {
    pub assignment: Assignment,
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
    config: WorkerConfig,
}

/// How often, at most, a waiting worker says why it is still waiting.
const WAITING_LOG_EVERY: Duration = Duration::from_secs(3);
/// Pause between two connection attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Connects (retrying until the join timeout, saying why each try failed)
/// and joins.
pub async fn join(config: &WorkerConfig) -> Result<Joined, FleetError> {
    let started = tokio::time::Instant::now();
    let deadline = started + config.join_timeout;
    let coordinator = &config.coordinator;
    let index = config.index;
    let mut last_said: Option<tokio::time::Instant> = None;
    let mut last_cause = String::from("no try finished");
    let stream = loop {
        let cause = match tokio::time::timeout_at(deadline, coordinator.connect()).await {
            Ok(Ok(stream)) => break stream,
            Ok(Err(cause)) => cause,
            Err(_) => format!("{last_cause} (the try after it was cut short)"),
        };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(FleetError::Unreachable {
                coordinator: coordinator.to_string(),
                timeout: config.join_timeout,
                reason: cause,
            });
        }
        if last_said.is_none_or(|t| now - t >= WAITING_LOG_EVERY) {
            tracing::info!(
                "worker {index}: waiting for the leader at {coordinator}: {cause}; trying again \
                 for {}s more (join timeout)",
                (deadline - now).as_secs()
            );
            last_said = Some(now);
        } else {
            tracing::debug!("worker {index}: coordinator {coordinator}: {cause}");
        }
        last_cause = cause;
        tokio::time::sleep_until((now + RETRY_PAUSE).min(deadline)).await;
        if tokio::time::Instant::now() >= deadline {
            return Err(FleetError::Unreachable {
                coordinator: coordinator.to_string(),
                timeout: config.join_timeout,
                reason: last_cause,
            });
        }
    };
    let _ = stream.set_nodelay(true);
    tracing::info!(
        "worker {index}: connected to the leader at {coordinator}; waiting until every worker joined"
    );
    let join = ToLeader::Join {
        build: config.build.clone(),
        index,
        workers: config.workers,
        scenario_digest: config.scenario_digest.clone(),
    };
    let (read, mut write) = stream.into_split();
    send(&mut write, &join).await.map_err(FleetError::link)?;
    // The leader answers once every worker joined: bounded by its own join timeout.
    let mut read = BufReader::new(read);
    let answer = tokio::time::timeout_at(deadline, receive::<_, ToWorker>(&mut read))
        .await
        .map_err(|_| {
            FleetError::link(format!(
                "connected to {coordinator}, but the leader did not welcome this worker within \
                 the join timeout ({:?}): did every other worker join?",
                config.join_timeout
            ))
        })?
        .map_err(FleetError::link)?;
    match answer {
        ToWorker::Welcome {
            scenario,
            seed,
            first_id,
            dataset_share,
            run,
        } => Ok(Joined {
            assignment: Assignment {
                scenario: *scenario,
                seed,
                first_id,
                dataset_share,
                run,
            },
            read,
            write,
            config: config.clone(),
        }),
        ToWorker::Refused { reason } => Err(FleetError::Refused(reason)),
        other => Err(FleetError::link(format!("unexpected answer {other:?}"))),
    }
}

/// What went wrong with the leader, as seen from a worker.
#[derive(Debug, Default)]
struct LinkState {
    lost: Option<String>,
    aborted: Option<String>,
    /// The leader interrupted or aborted this worker (not its own signal).
    by_leader: bool,
    /// The run is over and the records are being uploaded: a closed link
    /// is the upload's failure, which the uploader handles.
    uploading: bool,
}

/// What the writer task sends.
enum Outgoing {
    Message(ToLeader),
    /// The `Upload` header, then the file's bytes.
    Upload(ToLeader, Option<std::path::PathBuf>),
}

/// The runner's hook on a worker.
pub struct WorkerGate {
    to_leader: mpsc::Sender<Outgoing>,
    from_leader: mpsc::Receiver<ToWorker>,
    state: Arc<Mutex<LinkState>>,
    decision_waits: Vec<(usize, f64)>,
    config: WorkerConfig,
    run: String,
    /// Ends the task that tells the leader about this worker's own interrupt.
    done: CancellationToken,
}

impl Joined {
    /// Starts the link tasks; `interrupt`/`interrupt_now` are the run's
    /// tokens (the leader's Ctrl-C and a lost leader cancel them; this
    /// worker's own Ctrl-C is passed on to the leader as its departure).
    pub fn start(
        self,
        interrupt: CancellationToken,
        interrupt_now: CancellationToken,
    ) -> WorkerGate {
        let (to_leader, outgoing) = mpsc::channel(16);
        let (incoming, from_leader) = mpsc::channel(16);
        let state = Arc::new(Mutex::new(LinkState::default()));
        let timeout = self.config.heartbeat_timeout;
        tokio::spawn(write_task(self.write, outgoing, timeout / 4));
        let done = CancellationToken::new();
        tokio::spawn(tell_departure(
            to_leader.clone(),
            state.clone(),
            interrupt.clone(),
            done.clone(),
        ));
        tokio::spawn(read_task(
            self.read,
            incoming,
            state.clone(),
            timeout,
            interrupt,
            interrupt_now,
        ));
        WorkerGate {
            to_leader,
            from_leader,
            state,
            decision_waits: Vec::new(),
            config: self.config,
            run: self.assignment.run,
            done,
        }
    }
}

/// When the run is interrupted by this worker's own signal (not by the
/// leader), tells the leader that this worker leaves.
async fn tell_departure(
    to_leader: mpsc::Sender<Outgoing>,
    state: Arc<Mutex<LinkState>>,
    interrupt: CancellationToken,
    done: CancellationToken,
) {
    tokio::select! {
        _ = interrupt.cancelled() => {}
        _ = done.cancelled() => return,
    }
    let by_leader = {
        let state = crate::lock(&state);
        state.by_leader || state.lost.is_some()
    };
    if !by_leader {
        tracing::warn!("this worker was interrupted: telling the leader that it leaves the run");
        let leaving = ToLeader::Leaving {
            reason: "interrupted by its own Ctrl-C or SIGTERM (a pod eviction, for example)".into(),
        };
        let _ = to_leader.send(Outgoing::Message(leaving)).await;
    }
}

impl Queued for Outgoing {
    fn heartbeat() -> Self {
        Outgoing::Message(ToLeader::Heartbeat)
    }

    async fn write_to(self, write: &mut OwnedWriteHalf) -> Result<(), WireError> {
        match self {
            Outgoing::Message(m) => send(write, &m).await,
            Outgoing::Upload(header, file) => upload(write, &header, file.as_deref()).await,
        }
    }
}

/// Sends an `Upload` header and, unless it says `shared`, the file's bytes.
async fn upload<W: tokio::io::AsyncWrite + Unpin>(
    write: &mut W,
    header: &ToLeader,
    file: Option<&Path>,
) -> Result<(), WireError> {
    send(write, header).await?;
    let ToLeader::Upload {
        records_bytes,
        shared: false,
        ..
    } = header
    else {
        return Ok(());
    };
    if let Some(path) = file {
        use tokio::io::AsyncReadExt;
        let file = tokio::fs::File::open(path).await?;
        let copied = tokio::io::copy(&mut file.take(*records_bytes), write).await?;
        if copied < *records_bytes {
            return Err(WireError::Closed);
        }
        write.flush().await?;
    }
    Ok(())
}

async fn read_task(
    mut read: BufReader<OwnedReadHalf>,
    incoming: mpsc::Sender<ToWorker>,
    state: Arc<Mutex<LinkState>>,
    timeout: Duration,
    interrupt: CancellationToken,
    interrupt_now: CancellationToken,
) {
    let lost = loop {
        let message = match tokio::time::timeout(timeout, receive::<_, ToWorker>(&mut read)).await {
            Err(_) => break format!("no message from the leader for {timeout:?}"),
            Ok(Err(err)) => break format!("the link to the leader failed: {err}"),
            Ok(Ok(message)) => message,
        };
        match message {
            ToWorker::Heartbeat => {}
            ToWorker::Interrupt { now } => {
                let aborted = {
                    let mut state = crate::lock(&state);
                    state.by_leader = true;
                    state.aborted.is_some()
                };
                // After an abort the leader's own interrupt follows: the
                // abort has said what happened.
                if !aborted {
                    tracing::warn!(
                        "the leader was interrupted (Ctrl-C or SIGTERM): stopping{}",
                        if now { " now" } else { "" }
                    );
                }
                interrupt.cancel();
                if now {
                    interrupt_now.cancel();
                }
            }
            ToWorker::Abort { reason } => {
                tracing::error!("the leader aborted the run: {reason}: stopping");
                {
                    let mut state = crate::lock(&state);
                    state.by_leader = true;
                    state.aborted = Some(reason);
                }
                interrupt.cancel();
            }
            ToWorker::Received => {
                let _ = incoming.send(ToWorker::Received).await;
                return;
            }
            other => {
                if incoming.send(other).await.is_err() {
                    return;
                }
            }
        }
    };
    if crate::lock(&state).uploading {
        tracing::debug!("the link to the leader ended during the upload: {lost}");
        return;
    }
    tracing::error!("leader lost: {lost}");
    crate::lock(&state).lost = Some(lost);
    interrupt.cancel();
}

/// Uploads tried before the records are given up as missing.
pub const UPLOAD_ATTEMPTS: u32 = 3;

/// Why one upload attempt failed.
enum AttemptError {
    /// The leader answered that the records did not arrive; the link is fine.
    Failed(String),
    /// The connection broke (or never opened): the next try opens a new one.
    Link(String),
}

impl WorkerGate {
    async fn send(&self, message: ToLeader) {
        // A failed send means a lost leader, which the reader reports.
        let _ = self.to_leader.send(Outgoing::Message(message)).await;
    }

    /// The next message from the leader that `wanted` accepts. Without a
    /// leader the run has been interrupted: the runner's own interrupt
    /// wins the race against this never-ending wait.
    async fn next<T>(&mut self, wanted: impl Fn(ToWorker) -> Option<T>) -> T {
        while let Some(message) = self.from_leader.recv().await {
            if let Some(found) = wanted(message) {
                return found;
            }
        }
        std::future::pending().await
    }

    /// Why the leader was lost, if it was.
    pub fn leader_lost(&self) -> Option<String> {
        crate::lock(&self.state).lost.clone()
    }

    /// The leader's abort reason, if it aborted.
    pub fn aborted(&self) -> Option<String> {
        crate::lock(&self.state).aborted.clone()
    }

    /// Sends the result and the records file `records` (in the worker's
    /// directory under `output_dir`), and waits for the leader's receipt,
    /// each attempt within `timeout`. When `output_dir` holds the leader's
    /// marker, the directory is shared: the leader reads the file itself and
    /// no byte is sent. A failed attempt is tried again (on a new connection
    /// if the link broke, with the bytes if reading the shared file failed),
    /// [`UPLOAD_ATTEMPTS`] times in all. Returns whether the directory was
    /// shared.
    pub async fn upload(
        mut self,
        result: &RunResult,
        records: Option<&Path>,
        output_dir: Option<&Path>,
        timeout: Duration,
    ) -> Result<bool, FleetError> {
        self.done.cancel();
        crate::lock(&self.state).uploading = true;
        if let Some(lost) = self.leader_lost() {
            return Err(FleetError::LeaderLost(lost));
        }
        let records_bytes = match records {
            Some(path) => tokio::fs::metadata(path).await.map_or(0, |m| m.len()),
            None => 0,
        };
        let mut shared = records.is_some()
            && output_dir.is_some_and(|dir| dir.join(marker_name(&self.run)).exists());
        if shared {
            tracing::info!(
                "worker {}: the results directory is the leader's too: it reads the records there",
                self.config.index
            );
        }
        let decision_waits = std::mem::take(&mut self.decision_waits);
        let mut link_open = true;
        let mut last = String::new();
        for attempt in 1..=UPLOAD_ATTEMPTS {
            let header = ToLeader::Upload {
                result: Box::new(result.clone()),
                decision_waits: decision_waits.clone(),
                records_bytes,
                shared,
            };
            let tried = if link_open {
                self.upload_on_link(header, records, timeout).await
            } else {
                self.upload_on_new_connection(&header, records, timeout)
                    .await
            };
            match tried {
                Ok(()) => return Ok(shared),
                Err(AttemptError::Failed(reason)) => last = reason,
                Err(AttemptError::Link(reason)) => {
                    link_open = false;
                    last = reason;
                }
            }
            // The leader could not read the shared file: send the bytes.
            shared = false;
            if attempt < UPLOAD_ATTEMPTS {
                let pause = Duration::from_secs(u64::from(attempt));
                tracing::warn!(
                    "worker {}: records upload {attempt} of {UPLOAD_ATTEMPTS} failed: {last}; \
                     trying again in {pause:?}",
                    self.config.index
                );
                tokio::time::sleep(pause).await;
            }
        }
        Err(FleetError::Upload {
            attempts: UPLOAD_ATTEMPTS,
            reason: last,
        })
    }

    async fn upload_on_link(
        &mut self,
        header: ToLeader,
        records: Option<&Path>,
        timeout: Duration,
    ) -> Result<(), AttemptError> {
        let closed =
            || AttemptError::Link("the connection to the leader closed during the upload".into());
        self.to_leader
            .send(Outgoing::Upload(header, records.map(Path::to_path_buf)))
            .await
            .map_err(|_| closed())?;
        let answer = tokio::time::timeout(timeout, async {
            while let Some(message) = self.from_leader.recv().await {
                match message {
                    ToWorker::Received => return Ok(()),
                    ToWorker::UploadFailed { reason } => return Err(AttemptError::Failed(reason)),
                    _ => {}
                }
            }
            Err(closed())
        })
        .await;
        answer.unwrap_or_else(|_| {
            Err(AttemptError::Link(format!(
                "the leader did not confirm the upload within {timeout:?}"
            )))
        })
    }

    async fn upload_on_new_connection(
        &mut self,
        header: &ToLeader,
        records: Option<&Path>,
        timeout: Duration,
    ) -> Result<(), AttemptError> {
        let stream = self
            .config
            .coordinator
            .connect()
            .await
            .map_err(AttemptError::Link)?;
        let _ = stream.set_nodelay(true);
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        let link = |err: WireError| AttemptError::Link(format!("the new connection failed: {err}"));
        let rejoin = ToLeader::Rejoin {
            build: self.config.build.clone(),
            index: self.config.index,
            run: self.run.clone(),
        };
        let attempt = async {
            send(&mut write, &rejoin).await.map_err(link)?;
            upload(&mut write, header, records).await.map_err(link)?;
            loop {
                match receive::<_, ToWorker>(&mut read).await.map_err(link)? {
                    ToWorker::Received => return Ok(()),
                    ToWorker::UploadFailed { reason } | ToWorker::Refused { reason } => {
                        return Err(AttemptError::Failed(reason));
                    }
                    _ => {}
                }
            }
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(AttemptError::Link(format!(
                    "the leader did not confirm the upload within {timeout:?}"
                )))
            })
    }
}

impl StageHook for WorkerGate {
    /// A worker judges nothing: its stages carry no annotation.
    type Annotation = serde_json::Value;

    async fn before_stage(&mut self, index: usize) {
        self.send(ToLeader::Ready { stage: index }).await;
        self.next(|m| matches!(m, ToWorker::Start { stage } if stage == index).then_some(()))
            .await;
    }

    /// A search stage runs at the share of the level the leader decided
    /// (its own bisection of the fleet's levels), when it says so.
    async fn before_search(&mut self, next: &NextSearch<'_>) -> Option<Stage> {
        let slot = next.slot;
        self.send(ToLeader::Ready { stage: slot }).await;
        let (level, workers, label) = self
            .next(|m| match m {
                ToWorker::Search {
                    stage,
                    level,
                    workers,
                    label,
                } if stage == slot => Some((level, workers, label)),
                _ => None,
            })
            .await;
        let mut stage = search_share(next.like, level?, &workers, self.config.index)?;
        stage.name = Some(label);
        stage.warmup = false;
        Some(stage)
    }

    async fn after_stage(&mut self, done: &FinishedStage<'_>) -> HookOutcome {
        let index = done.index;
        self.send(ToLeader::Stats {
            stage: index,
            stats: Box::new(done.stats.clone()),
        })
        .await;
        let sent = Instant::now();
        let stop = self
            .next(|m| match m {
                ToWorker::Decision { stage, stop } if stage == index => Some(stop),
                _ => None,
            })
            .await;
        self.decision_waits
            .push((index, sent.elapsed().as_secs_f64()));
        match stop {
            Some(reason) => HookOutcome::stop(reason),
            None => HookOutcome::proceed(),
        }
    }
}
