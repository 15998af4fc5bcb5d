//! The leader's side of the protocol (worker 0): admit the workers, keep a
//! link task per worker (heartbeats both ways, loss detection, record
//! uploads), and act as the runner's [`StageHook`] around the congestion
//! check: each stage starts when every live worker is ready, each measured
//! stage is judged on the whole fleet's statistics, and the decision is
//! sent to every worker before the next stage starts.
//!
//! Every wait ends: a worker that sends nothing for the heartbeat timeout
//! (or whose connection closes) is lost; the leader records the loss with
//! the step it happened in and goes on with the others, or aborts the run
//! with `OnWorkerLoss::Abort`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nyann_load::stats::StageAccumulator;
use nyann_load::{CancellationToken, FinishedStage, HookDecision, HookOutcome, StageHook};
use nyann_model::{Scenario, Step};
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::merge::{FleetRun, Judgement, LostWorker, WorkerRun};
use crate::protocol::{ToLeader, ToWorker, receive, scenario_digest, send};
use crate::share::{first_id, scenario_share, worker_seed};
use crate::{FleetError, lock};

/// What the leader does when a worker is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnWorkerLoss {
    /// Record the loss and go on with the other workers.
    Continue,
    /// Record the loss and abort the run everywhere (exit 1).
    Abort,
}

#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// Worker count, the leader included.
    pub workers: usize,
    pub heartbeat_timeout: Duration,
    /// How long to wait for every worker to join.
    pub join_timeout: Duration,
    pub on_loss: OnWorkerLoss,
    /// This binary's [`build_id`](crate::protocol::build_id): workers must match it.
    pub build: String,
    /// Where uploaded records go (`worker-I/requests.jsonl`).
    pub output_dir: PathBuf,
}

/// The bound coordination endpoint.
pub struct Leader {
    listener: TcpListener,
    config: LeaderConfig,
}

/// What a link task tells the gate.
enum Event {
    Ready {
        worker: usize,
        stage: usize,
    },
    Stats {
        worker: usize,
        stage: usize,
        stats: Box<StageAccumulator>,
    },
    Uploaded(Box<WorkerRun>),
    Gone {
        worker: usize,
    },
}

/// State shared by the gate and the link tasks.
struct Fleet {
    senders: Mutex<BTreeMap<usize, mpsc::Sender<ToWorker>>>,
    lost: Mutex<Vec<LostWorker>>,
    aborted: Mutex<Option<String>>,
    /// The step running (or last started).
    step: AtomicUsize,
    on_loss: OnWorkerLoss,
    interrupt: CancellationToken,
}

impl Fleet {
    /// Queues `message` for every connected worker. A worker whose queue is
    /// full is not reading: its heartbeat timeout will tell.
    fn broadcast(&self, message: &ToWorker) {
        for (worker, sender) in lock(&self.senders).iter() {
            if sender.try_send(message.clone()).is_err() {
                tracing::warn!("worker {worker}: its message queue is full");
            }
        }
    }

    fn lose(&self, worker: usize, reason: String) {
        lock(&self.senders).remove(&worker);
        let step = self.step.load(Ordering::SeqCst);
        tracing::error!("worker {worker} lost in step {step}: {reason}");
        lock(&self.lost).push(LostWorker {
            worker,
            step,
            reason: reason.clone(),
            at_unix: now_unix(),
        });
        if self.on_loss == OnWorkerLoss::Abort {
            let message = format!(
                "worker {worker} lost in step {step} ({reason}); a lost worker aborts the run"
            );
            let mut aborted = lock(&self.aborted);
            if aborted.is_none() {
                *aborted = Some(message.clone());
                drop(aborted);
                self.broadcast(&ToWorker::Abort { reason: message });
                self.interrupt.cancel();
            }
        }
    }
}

fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Leader {
    pub async fn bind(addr: SocketAddr, config: LeaderConfig) -> Result<Leader, FleetError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|error| FleetError::Listen { addr, error })?;
        Ok(Leader { listener, config })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Admits workers 1..N (each gets its share, seed and ids at once) and
    /// returns the gate once all joined. `inner` judges the fleet's stages;
    /// `interrupt`/`interrupt_now` are the leader's run tokens (Ctrl-C is
    /// passed on to every worker; an abort cancels `interrupt`).
    pub async fn gather<H: StageHook>(
        self,
        scenario: &Scenario,
        seed: u64,
        inner: H,
        interrupt: CancellationToken,
        interrupt_now: CancellationToken,
    ) -> Result<LeaderGate<H>, FleetError> {
        let n = self.config.workers;
        let shares = (0..n)
            .map(|i| scenario_share(scenario, n, i))
            .collect::<Result<Vec<_>, _>>()?;
        let digest = scenario_digest(scenario);
        let (events_tx, events) = mpsc::channel(4 * n + 16);
        let fleet = Arc::new(Fleet {
            senders: Mutex::new(BTreeMap::new()),
            lost: Mutex::new(Vec::new()),
            aborted: Mutex::new(None),
            step: AtomicUsize::new(0),
            on_loss: self.config.on_loss,
            interrupt: interrupt.clone(),
        });
        let deadline = tokio::time::Instant::now() + self.config.join_timeout;
        let mut joined = BTreeSet::new();
        while joined.len() + 1 < n {
            let stream = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        tracing::warn!("coordinator: accept failed: {err}");
                        continue;
                    }
                },
                _ = interrupt.cancelled() => return Err(FleetError::Interrupted),
                _ = tokio::time::sleep_until(deadline) => {
                    let list = (1..n).filter(|i| !joined.contains(i)).map(|i| i.to_string()).collect::<Vec<_>>();
                    return Err(FleetError::JoinTimeout {
                        missing: list.len(),
                        expected: n - 1,
                        timeout: self.config.join_timeout,
                        list: list.join(", "),
                    });
                }
            };
            let _ = stream.set_nodelay(true);
            let Some((worker, read, mut write)) =
                admit(stream, &self.config, &digest, &joined).await
            else {
                continue;
            };
            let welcome = ToWorker::Welcome {
                scenario: Box::new(shares[worker].clone()),
                seed: worker_seed(seed, worker),
                first_id: first_id(worker),
            };
            if let Err(err) = send(&mut write, &welcome).await {
                tracing::warn!("worker {worker}: welcome failed: {err}");
                continue;
            }
            tracing::info!(
                "worker {worker} joined ({} of {} workers)",
                joined.len() + 2,
                n
            );
            joined.insert(worker);
            let (to_worker, outgoing) = mpsc::channel(64);
            lock(&fleet.senders).insert(worker, to_worker.clone());
            let every = self.config.heartbeat_timeout / 4;
            tokio::spawn(write_task(write, outgoing, every));
            tokio::spawn(read_task(Link {
                worker,
                read,
                reply: to_worker,
                events: events_tx.clone(),
                fleet: fleet.clone(),
                timeout: self.config.heartbeat_timeout,
                dir: self.config.output_dir.join(format!("worker-{worker}")),
            }));
        }
        drop(events_tx);
        let watch = CancellationToken::new();
        tokio::spawn(pass_on_interrupts(
            fleet.clone(),
            interrupt,
            interrupt_now,
            watch.clone(),
        ));
        Ok(LeaderGate {
            inner,
            fleet,
            events,
            live: joined,
            runs: Vec::new(),
            judgements: BTreeMap::new(),
            scenario: scenario.clone(),
            seed,
            workers: n,
            watch,
        })
    }
}

/// Reads a worker's `Join` and refuses it (with the reason) unless it fits.
async fn admit(
    stream: TcpStream,
    config: &LeaderConfig,
    digest: &str,
    joined: &BTreeSet<usize>,
) -> Option<(usize, BufReader<OwnedReadHalf>, OwnedWriteHalf)> {
    let (workers, timeout) = (config.workers, config.heartbeat_timeout);
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".into(), |a| a.to_string());
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let join = match tokio::time::timeout(timeout, receive::<_, ToLeader>(&mut read)).await {
        Ok(Ok(join)) => join,
        Ok(Err(err)) => {
            tracing::warn!("coordinator: {peer} sent no valid join: {err}");
            return None;
        }
        Err(_) => {
            tracing::warn!("coordinator: {peer} sent no join within {timeout:?}");
            return None;
        }
    };
    let ToLeader::Join {
        build,
        index,
        workers: their_workers,
        scenario_digest,
    } = join
    else {
        tracing::warn!("coordinator: {peer} did not start with a join");
        return None;
    };
    let ours = &config.build;
    let refusal = if build != *ours {
        Some(format!(
            "its build is {build}, the leader's is {ours}: run the same image on every worker"
        ))
    } else if their_workers != workers {
        Some(format!(
            "it was started for {their_workers} workers, the leader for {workers}"
        ))
    } else if index == 0 || index >= workers {
        Some(format!(
            "its index {index} is not a worker of 1..{} (0 is the leader)",
            workers - 1
        ))
    } else if joined.contains(&index) {
        Some(format!("worker {index} has already joined"))
    } else if scenario_digest.as_deref().is_some_and(|d| d != digest) {
        Some(format!(
            "its scenario (digest {}) differs from the leader's ({digest}): workers need no \
             --config; drop it or give them the leader's",
            scenario_digest.unwrap_or_default()
        ))
    } else {
        None
    };
    if let Some(reason) = refusal {
        tracing::warn!("coordinator: refused {peer}: {reason}");
        let _ = send(&mut write, &ToWorker::Refused { reason }).await;
        return None;
    }
    Some((index, read, write))
}

async fn write_task(
    mut write: OwnedWriteHalf,
    mut outgoing: mpsc::Receiver<ToWorker>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        let sent = tokio::select! {
            message = outgoing.recv() => match message {
                None => break,
                Some(m) => send(&mut write, &m).await,
            },
            _ = tick.tick() => send(&mut write, &ToWorker::Heartbeat).await,
        };
        if sent.is_err() {
            break;
        }
    }
}

/// One worker's connection, read by its link task.
struct Link {
    worker: usize,
    read: BufReader<OwnedReadHalf>,
    /// Its write queue (for the upload receipt).
    reply: mpsc::Sender<ToWorker>,
    events: mpsc::Sender<Event>,
    fleet: Arc<Fleet>,
    timeout: Duration,
    dir: PathBuf,
}

/// Time allowed for a records upload (beyond the heartbeat timeout).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(120);

async fn read_task(mut link: Link) {
    let worker = link.worker;
    let lost = loop {
        let message = match tokio::time::timeout(
            link.timeout,
            receive::<_, ToLeader>(&mut link.read),
        )
        .await
        {
            Err(_) => break format!("no message for {:?} (heartbeat timeout)", link.timeout),
            Ok(Err(err)) => break err.to_string(),
            Ok(Ok(message)) => message,
        };
        let event = match message {
            ToLeader::Heartbeat | ToLeader::Join { .. } => continue,
            ToLeader::Ready { stage } => Event::Ready { worker, stage },
            ToLeader::Stats { stage, stats } => Event::Stats {
                worker,
                stage,
                stats,
            },
            ToLeader::Upload {
                result,
                decision_waits,
                records_bytes,
            } => {
                let stored = tokio::time::timeout(
                    UPLOAD_TIMEOUT,
                    store_records(&mut link.read, &link.dir, records_bytes),
                )
                .await;
                let records = match stored {
                    Ok(Ok(path)) => path,
                    Ok(Err(err)) => break format!("its records upload failed: {err}"),
                    Err(_) => break format!("its records upload took over {UPLOAD_TIMEOUT:?}"),
                };
                lock(&link.fleet.senders).remove(&worker);
                let _ = link.reply.send(ToWorker::Received).await;
                let _ = link
                    .events
                    .send(Event::Uploaded(Box::new(WorkerRun {
                        worker,
                        result: *result,
                        records,
                        decision_waits,
                    })))
                    .await;
                return;
            }
        };
        if link.events.send(event).await.is_err() {
            return;
        }
    };
    link.fleet.lose(worker, lost);
    let _ = link.events.send(Event::Gone { worker }).await;
}

async fn store_records(
    read: &mut BufReader<OwnedReadHalf>,
    dir: &std::path::Path,
    bytes: u64,
) -> std::io::Result<Option<PathBuf>> {
    tokio::fs::create_dir_all(dir).await?;
    let path = dir.join("requests.jsonl");
    let mut file = tokio::fs::File::create(&path).await?;
    let copied = tokio::io::copy(&mut read.take(bytes), &mut file).await?;
    if copied < bytes {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{copied} of {bytes} bytes arrived"),
        ));
    }
    use tokio::io::AsyncWriteExt;
    file.flush().await?;
    Ok(Some(path))
}

/// Ctrl-C/SIGTERM on the leader interrupts every worker too.
async fn pass_on_interrupts(
    fleet: Arc<Fleet>,
    interrupt: CancellationToken,
    interrupt_now: CancellationToken,
    done: CancellationToken,
) {
    tokio::select! {
        _ = interrupt.cancelled() => fleet.broadcast(&ToWorker::Interrupt { now: false }),
        _ = done.cancelled() => return,
    }
    tokio::select! {
        _ = interrupt_now.cancelled() => fleet.broadcast(&ToWorker::Interrupt { now: true }),
        _ = done.cancelled() => {}
    }
}

/// The runner's hook on the leader, around the congestion check `inner`.
pub struct LeaderGate<H> {
    inner: H,
    fleet: Arc<Fleet>,
    events: mpsc::Receiver<Event>,
    /// Workers 1..N still taking part.
    live: BTreeSet<usize>,
    /// Uploads received so far.
    runs: Vec<WorkerRun>,
    /// What each judged stage's decision saw, by step.
    judgements: BTreeMap<usize, Judgement>,
    /// The whole fleet's scenario: the judge sees the fleet's stage (its
    /// concurrency or rate), not the leader's share of it.
    scenario: Scenario,
    seed: u64,
    workers: usize,
    watch: CancellationToken,
}

impl<H> LeaderGate<H> {
    /// Waits until every live worker sent an event `wanted` accepts (or is
    /// gone, or uploaded: it ended); returns those events.
    async fn collect(&mut self, wanted: impl Fn(&Event) -> bool) -> Vec<Event> {
        let mut pending = self.live.clone();
        let mut found = Vec::new();
        while !pending.is_empty() {
            let Some(event) = self.events.recv().await else {
                // Every link task ended.
                self.live.clear();
                break;
            };
            match event {
                Event::Gone { worker } => {
                    self.live.remove(&worker);
                    pending.remove(&worker);
                }
                Event::Uploaded(run) => {
                    self.live.remove(&run.worker);
                    pending.remove(&run.worker);
                    self.runs.push(*run);
                }
                event if wanted(&event) => {
                    if let Event::Ready { worker, .. } | Event::Stats { worker, .. } = &event {
                        pending.remove(worker);
                    }
                    found.push(event);
                }
                _ => {} // A stale answer (to a step already over).
            }
        }
        found
    }

    /// Why the run was aborted, if a lost worker aborted it.
    pub fn aborted(&self) -> Option<String> {
        lock(&self.fleet.aborted).clone()
    }

    /// After the leader's own run: waits (at most `timeout`) for the other
    /// workers' uploads and returns everything the merge needs.
    pub async fn finish<A>(
        mut self,
        own: nyann_load::RunResult<A>,
        own_records: Option<PathBuf>,
        timeout: Duration,
    ) -> FleetRun<A> {
        if tokio::time::timeout(timeout, self.collect(|_| false))
            .await
            .is_err()
        {
            for &worker in &self.live {
                tracing::error!("worker {worker}: no records upload within {timeout:?}");
            }
        }
        self.watch.cancel();
        let missing = self.live.iter().copied().collect();
        let mut runs = std::mem::take(&mut self.runs);
        runs.sort_by_key(|r| r.worker);
        FleetRun {
            workers: self.workers,
            seed: self.seed,
            leader: own,
            leader_records: own_records,
            runs,
            judgements: std::mem::take(&mut self.judgements),
            lost: lock(&self.fleet.lost).clone(),
            missing,
            aborted: self.aborted(),
        }
    }
}

impl<H: StageHook> StageHook for LeaderGate<H> {
    /// The check's own record: what the fleet adds (who was judged, lost
    /// workers, the per-worker figures) goes into the merged files.
    type Annotation = H::Annotation;

    async fn before_stage(&mut self, index: usize) {
        self.fleet.step.store(index, Ordering::SeqCst);
        self.collect(|e| matches!(e, Event::Ready { stage, .. } if *stage == index))
            .await;
        self.fleet.broadcast(&ToWorker::Start { stage: index });
    }

    async fn after_stage(
        &mut self,
        done: &FinishedStage<'_, H::Annotation>,
    ) -> HookOutcome<H::Annotation> {
        let index = done.index;
        let answers = self
            .collect(|e| matches!(e, Event::Stats { stage, .. } if *stage == index))
            .await;
        let mut merged = done.stats.clone();
        let mut judged = vec![0];
        for answer in answers {
            if let Event::Stats { worker, stats, .. } = answer {
                merged.merge(&stats);
                judged.push(worker);
            }
        }
        judged.sort_unstable();
        let (client, detail) = merged.finish(done.end_unix - done.start_unix);
        let stage = match self.scenario.steps.get(index) {
            Some(Step::Stage(fleet_stage)) => fleet_stage,
            _ => done.stage,
        };
        let fleet_stage = FinishedStage {
            index,
            stage,
            label: done.label,
            start_unix: done.start_unix,
            end_unix: done.end_unix,
            client: &client,
            detail: &detail,
            stats: &merged,
            history: done.history,
        };
        let outcome = self.inner.after_stage(&fleet_stage).await;
        let stop = match &outcome.decision {
            HookDecision::Stop { reason } => Some(reason.clone()),
            HookDecision::Continue => None,
        };
        self.fleet
            .broadcast(&ToWorker::Decision { stage: index, stop });
        self.judgements.insert(
            index,
            Judgement {
                judged_workers: judged,
                requests_judged: client.requests_ok + client.requests_failed,
            },
        );
        outcome
    }
}
