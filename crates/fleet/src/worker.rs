//! A worker's side of the protocol: join the leader, then act as the
//! runner's [`StageHook`]: wait for each stage's start, send each measured
//! stage's statistics and apply the leader's decision; finally upload the
//! records.
//!
//! A background task reads the leader's messages: Ctrl-C or an abort on the
//! leader interrupts this worker's run; a leader silent for the heartbeat
//! timeout (or a closed connection) counts as lost: the run is interrupted
//! (the usual grace applies), the records stay on disk and the worker exits 1.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nyann_load::{CancellationToken, FinishedStage, HookOutcome, RunResult, StageHook};
use nyann_model::Scenario;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::FleetError;
use crate::protocol::{ToLeader, ToWorker, WireError, receive, send};

/// How a worker finds and joins its leader.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `HOST:PORT` of the leader's coordination endpoint.
    pub coordinator: String,
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
}

/// A joined worker, before its run starts.
pub struct Joined {
    pub assignment: Assignment,
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
    heartbeat_timeout: Duration,
}

/// Connects (retrying until the join timeout) and joins.
pub async fn join(config: &WorkerConfig) -> Result<Joined, FleetError> {
    let deadline = tokio::time::Instant::now() + config.join_timeout;
    let stream = loop {
        match tokio::time::timeout_at(deadline, TcpStream::connect(&config.coordinator)).await {
            Ok(Ok(stream)) => break stream,
            Ok(Err(err)) if tokio::time::Instant::now() < deadline => {
                tracing::debug!("coordinator {}: {err}; retrying", config.coordinator);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(Err(err)) => {
                return Err(FleetError::Unreachable {
                    coordinator: config.coordinator.clone(),
                    reason: err.to_string(),
                });
            }
            Err(_) => {
                return Err(FleetError::Unreachable {
                    coordinator: config.coordinator.clone(),
                    reason: format!(
                        "no answer within the join timeout ({:?})",
                        config.join_timeout
                    ),
                });
            }
        }
    };
    let _ = stream.set_nodelay(true);
    let join = ToLeader::Join {
        build: config.build.clone(),
        index: config.index,
        workers: config.workers,
        scenario_digest: config.scenario_digest.clone(),
    };
    let (read, mut write) = stream.into_split();
    send(&mut write, &join).await.map_err(FleetError::link)?;
    // The leader answers once every worker joined: bounded by its own join timeout.
    let mut read = BufReader::new(read);
    let answer = tokio::time::timeout_at(deadline, receive::<_, ToWorker>(&mut read))
        .await
        .map_err(|_| FleetError::link("the leader did not welcome this worker in time"))?
        .map_err(FleetError::link)?;
    match answer {
        ToWorker::Welcome {
            scenario,
            seed,
            first_id,
        } => Ok(Joined {
            assignment: Assignment {
                scenario: *scenario,
                seed,
                first_id,
            },
            read,
            write,
            heartbeat_timeout: config.heartbeat_timeout,
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
}

impl Joined {
    /// Starts the link tasks; `interrupt`/`interrupt_now` are the run's
    /// tokens (the leader's Ctrl-C and a lost leader cancel them).
    pub fn start(
        self,
        interrupt: CancellationToken,
        interrupt_now: CancellationToken,
    ) -> WorkerGate {
        let (to_leader, outgoing) = mpsc::channel(16);
        let (incoming, from_leader) = mpsc::channel(16);
        let state = Arc::new(Mutex::new(LinkState::default()));
        let timeout = self.heartbeat_timeout;
        tokio::spawn(write_task(self.write, outgoing, timeout / 4));
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
        }
    }
}

async fn write_task(
    mut write: OwnedWriteHalf,
    mut outgoing: mpsc::Receiver<Outgoing>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        let sent = tokio::select! {
            message = outgoing.recv() => match message {
                None => break,
                Some(Outgoing::Message(m)) => send(&mut write, &m).await,
                Some(Outgoing::Upload(header, file)) => upload(&mut write, &header, file.as_deref()).await,
            },
            _ = tick.tick() => send(&mut write, &ToLeader::Heartbeat).await,
        };
        if sent.is_err() {
            break; // The reader notices the lost leader.
        }
    }
}

async fn upload(
    write: &mut OwnedWriteHalf,
    header: &ToLeader,
    file: Option<&Path>,
) -> Result<(), WireError> {
    send(write, header).await?;
    let ToLeader::Upload { records_bytes, .. } = header else {
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
                tracing::warn!("the leader was interrupted: stopping");
                interrupt.cancel();
                if now {
                    interrupt_now.cancel();
                }
            }
            ToWorker::Abort { reason } => {
                tracing::error!("the leader aborts the run: {reason}");
                crate::lock(&state).aborted = Some(reason);
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
    tracing::error!("leader lost: {lost}");
    crate::lock(&state).lost = Some(lost);
    interrupt.cancel();
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

    /// Sends the result and the records file, and waits for the leader's
    /// receipt within `timeout`.
    pub async fn upload(
        mut self,
        result: &RunResult,
        records: Option<&Path>,
        timeout: Duration,
    ) -> Result<(), FleetError> {
        if let Some(lost) = self.leader_lost() {
            return Err(FleetError::LeaderLost(lost));
        }
        let records_bytes = match records {
            Some(path) => tokio::fs::metadata(path).await.map_or(0, |m| m.len()),
            None => 0,
        };
        let header = ToLeader::Upload {
            result: Box::new(result.clone()),
            decision_waits: std::mem::take(&mut self.decision_waits),
            records_bytes,
        };
        let _ = self
            .to_leader
            .send(Outgoing::Upload(header, records.map(Path::to_path_buf)))
            .await;
        let received = tokio::time::timeout(timeout, async {
            while let Some(message) = self.from_leader.recv().await {
                if matches!(message, ToWorker::Received) {
                    return true;
                }
            }
            false
        })
        .await;
        match received {
            Ok(true) => Ok(()),
            Ok(false) => Err(FleetError::LeaderLost(
                self.leader_lost()
                    .unwrap_or_else(|| "the connection closed during the upload".into()),
            )),
            Err(_) => Err(FleetError::LeaderLost(format!(
                "the upload was not received within {timeout:?}"
            ))),
        }
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
