//! The leader's side of the protocol (worker 0): admit the workers, keep a
//! link task per worker (heartbeats both ways, loss detection, record
//! uploads), and act as the runner's [`StageHook`] around the congestion
//! check: each stage starts when every live worker is ready, each measured
//! stage is judged on the whole fleet's statistics, and the decision is
//! sent to every worker before the next stage starts.
//!
//! Every wait ends: a connection that sends no join within the heartbeat
//! timeout is dropped (each connection is admitted on its own task, so an
//! idle one delays nobody); a worker that sends nothing for the heartbeat
//! timeout (or whose connection closes) is lost, and one interrupted by its
//! own signal says it leaves; the leader records either with the step it
//! happened in and goes on with the others, or aborts the run with
//! `OnWorkerLoss::Abort`. What the fleet ran is tracked per stage (who
//! started it, who finished it), so that a stage run by fewer workers is
//! judged, and recorded, at the level that actually ran.
//!
//! Records: a worker uploads its `requests.jsonl` at the end; the leader
//! stores it under a name no worker writes (`worker-I/requests.uploaded.jsonl`),
//! or, when the worker shares the leader's results directory (it finds the
//! marker file the leader keeps there), reads the worker's own file in place.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nyann_load::stats::StageAccumulator;
use nyann_load::{CancellationToken, RunResult, StageHook};
use nyann_model::Scenario;
use tokio::io::BufReader;
use tokio::net::TcpListener;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use crate::merge::{LostWorker, WorkerRun};
use crate::protocol::{ToLeader, ToWorker, marker_name, receive, scenario_digest, send};
use crate::share::{dataset_share, first_id, scenario_share, worker_seed};
use crate::{FleetError, lock};

mod gate;
mod links;

pub use gate::LeaderGate;
use links::Links;

/// What the leader does when a worker is lost (or leaves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnWorkerLoss {
    /// Record the loss and go on with the other workers: the later stages
    /// run at the level the others' shares add up to (recorded as degraded).
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
    /// The results directory: uploads go to `worker-I/` in it.
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
    /// An upload attempt failed; the worker may try again. Its result
    /// (which came with the attempt) is kept in case none succeeds.
    UploadFailed {
        worker: usize,
        result: Box<RunResult>,
        decision_waits: Vec<(usize, f64)>,
        reason: String,
    },
    /// The worker takes no more part in the stages: lost, or it left
    /// (`connected`: its link is open and its upload will come).
    Gone {
        worker: usize,
        connected: bool,
    },
    /// The link ended after an upload attempt: a retry may come on a new
    /// connection for a while.
    LinkEnded {
        worker: usize,
    },
    /// A worker reconnected to retry its upload.
    Rejoined {
        worker: usize,
    },
}

/// State shared by the gate and the link tasks.
struct Fleet {
    senders: Mutex<BTreeMap<usize, mpsc::Sender<ToWorker>>>,
    /// Lost workers and workers that left.
    departed: Mutex<Vec<LostWorker>>,
    aborted: Mutex<Option<String>>,
    /// Workers whose records arrived.
    uploaded: Mutex<BTreeSet<usize>>,
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

    /// Records that `worker` is lost (or `left`) in the running step.
    fn depart(&self, worker: usize, reason: String, left: bool) {
        lock(&self.senders).remove(&worker);
        let step = self.step.load(Ordering::SeqCst);
        let how = if left { "left" } else { "lost" };
        if left {
            tracing::warn!("worker {worker} left in step {step}: {reason}");
        } else {
            tracing::error!("worker {worker} lost in step {step}: {reason}");
        }
        lock(&self.departed).push(LostWorker {
            worker,
            step,
            reason: reason.clone(),
            at_unix: now_unix(),
            left,
        });
        if self.on_loss == OnWorkerLoss::Abort {
            let message = format!(
                "worker {worker} {how} in step {step} ({reason}); a lost worker aborts the run"
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

/// A run token: unique enough to tell this run's marker from another's.
fn run_token(seed: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mixed = worker_seed(
        seed ^ (nanos as u64) ^ ((nanos >> 64) as u64),
        std::process::id() as usize,
    );
    format!("{mixed:016x}")
}

/// A connection's first message, read on its own task.
struct Arrival {
    peer: String,
    first: ToLeader,
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

/// Accepts connections until `stop`, reading each one's first message on
/// a task of its own within `deadline`: a connection that says nothing
/// (a port scan, a health check) delays no other.
async fn accept_loop(
    listener: TcpListener,
    arrivals: mpsc::Sender<Arrival>,
    deadline: Duration,
    stop: CancellationToken,
) {
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!("coordinator: accept failed: {err}");
                    // Out of descriptors, say: do not spin.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return,
        };
        let arrivals = arrivals.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let (read, write) = stream.into_split();
            let mut read = BufReader::new(read);
            match tokio::time::timeout(deadline, receive::<_, ToLeader>(&mut read)).await {
                Ok(Ok(first)) => {
                    let _ = arrivals
                        .send(Arrival {
                            peer: peer.to_string(),
                            first,
                            read,
                            write,
                        })
                        .await;
                }
                Ok(Err(err)) => tracing::warn!("coordinator: {peer} sent no valid join: {err}"),
                Err(_) => tracing::warn!("coordinator: {peer} sent no join within {deadline:?}"),
            }
        });
    }
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
        let run = run_token(seed);
        let marker = self.config.output_dir.join(marker_name(&run));
        let marked = std::fs::create_dir_all(&self.config.output_dir)
            .and_then(|()| std::fs::write(&marker, b"nyann-bench fleet run in progress\n"));
        if let Err(err) = marked {
            // Workers then upload their bytes: slower, never wrong.
            tracing::warn!("cannot write {}: {err}", marker.display());
        }
        let (events_tx, events) = mpsc::channel(4 * n + 16);
        let fleet = Arc::new(Fleet {
            senders: Mutex::new(BTreeMap::new()),
            departed: Mutex::new(Vec::new()),
            aborted: Mutex::new(None),
            uploaded: Mutex::new(BTreeSet::new()),
            step: AtomicUsize::new(0),
            on_loss: self.config.on_loss,
            interrupt: interrupt.clone(),
        });
        let watch = CancellationToken::new();
        let (arrivals_tx, mut arrivals) = mpsc::channel(16);
        tokio::spawn(accept_loop(
            self.listener,
            arrivals_tx,
            self.config.heartbeat_timeout,
            watch.clone(),
        ));
        let links = Links {
            fleet: fleet.clone(),
            events: events_tx,
            timeout: self.config.heartbeat_timeout,
            output_dir: self.config.output_dir.clone(),
        };
        let started = tokio::time::Instant::now();
        let deadline = started + self.config.join_timeout;
        let mut joined = BTreeSet::new();
        let missing = |joined: &BTreeSet<usize>| {
            (1..n)
                .filter(|i| !joined.contains(i))
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
        };
        // Who is missing, and for how long, every few seconds: a worker
        // that never comes is seen long before the join timeout.
        let mut notice = tokio::time::interval_at(started + JOIN_NOTICE, JOIN_NOTICE);
        while joined.len() + 1 < n {
            let arrival = tokio::select! {
                arrival = arrivals.recv() => match arrival {
                    Some(arrival) => arrival,
                    None => continue,
                },
                _ = notice.tick() => {
                    let list = missing(&joined);
                    tracing::info!(
                        "waiting for worker{} {} to join ({} of the join timeout {}): each \
                         runs the same command with its worker index and this coordinator's \
                         address",
                        if list.len() == 1 { "" } else { "s" },
                        list.join(", "),
                        humantime::format_duration(Duration::from_secs(started.elapsed().as_secs())),
                        humantime::format_duration(self.config.join_timeout),
                    );
                    continue;
                }
                _ = interrupt.cancelled() => {
                    watch.cancel();
                    let _ = std::fs::remove_file(&marker);
                    return Err(FleetError::Interrupted);
                }
                _ = tokio::time::sleep_until(deadline) => {
                    watch.cancel();
                    let _ = std::fs::remove_file(&marker);
                    let list = missing(&joined);
                    return Err(FleetError::JoinTimeout {
                        missing: list.len(),
                        expected: n - 1,
                        timeout: self.config.join_timeout,
                        list: list.join(", "),
                    });
                }
            };
            let Arrival {
                peer,
                first,
                read,
                mut write,
            } = arrival;
            let worker = match admit(first, &self.config, &digest, &joined) {
                Ok(worker) => worker,
                Err(reason) => {
                    tracing::warn!("coordinator: refused {peer}: {reason}");
                    let _ = send(&mut write, &ToWorker::Refused { reason }).await;
                    continue;
                }
            };
            let welcome = ToWorker::Welcome {
                scenario: Box::new(shares[worker].clone()),
                seed: worker_seed(seed, worker),
                first_id: first_id(worker),
                dataset_share: dataset_share(seed, worker, n),
                run: run.clone(),
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
            links.open(worker, read, write, false);
        }
        tokio::spawn(late_arrivals(
            arrivals,
            links,
            self.config.build.clone(),
            run.clone(),
            n,
        ));
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
            live: joined.clone(),
            awaiting: joined,
            retrying: BTreeMap::new(),
            failed: BTreeMap::new(),
            runs: Vec::new(),
            judgements: BTreeMap::new(),
            started: BTreeMap::new(),
            finished: BTreeMap::new(),
            scenario: scenario.clone(),
            shares,
            clean: BTreeMap::new(),
            search: None,
            seed,
            workers: n,
            watch,
            marker,
        })
    }
}

/// Checks a worker's `Join`; the refusal's reason otherwise.
fn admit(
    first: ToLeader,
    config: &LeaderConfig,
    digest: &str,
    joined: &BTreeSet<usize>,
) -> Result<usize, String> {
    let workers = config.workers;
    let ToLeader::Join {
        build,
        index,
        workers: their_workers,
        scenario_digest,
    } = first
    else {
        return Err("a worker's first message must be its join".into());
    };
    let ours = &config.build;
    if build != *ours {
        Err(format!(
            "its build is {build}, the leader's is {ours}: run the same image on every worker"
        ))
    } else if their_workers != workers {
        Err(format!(
            "it was started for {their_workers} workers, the leader for {workers}"
        ))
    } else if index == 0 || index >= workers {
        Err(format!(
            "its index {index} is not a worker of 1..{} (0 is the leader)",
            workers - 1
        ))
    } else if joined.contains(&index) {
        Err(format!("worker {index} has already joined"))
    } else if scenario_digest.as_deref().is_some_and(|d| d != digest) {
        Err(format!(
            "its scenario (digest {}) differs from the leader's ({digest}): workers need no \
             scenario; drop it or give them the leader's",
            scenario_digest.unwrap_or_default()
        ))
    } else {
        Ok(index)
    }
}

/// After every worker joined: a late join is refused (a sweep cannot be
/// joined half-way), and a worker whose upload's connection broke may
/// reconnect to try again.
async fn late_arrivals(
    mut arrivals: mpsc::Receiver<Arrival>,
    links: Links,
    build: String,
    run: String,
    workers: usize,
) {
    while let Some(Arrival {
        peer,
        first,
        read,
        mut write,
    }) = arrivals.recv().await
    {
        let refusal: Option<String> = match first {
            ToLeader::Rejoin {
                build: theirs,
                index,
                run: their_run,
            } => {
                if theirs != build || their_run != run || index == 0 || index >= workers {
                    Some(format!(
                        "it is not a worker of this run (run {their_run}, build {theirs})"
                    ))
                } else if lock(&links.fleet.uploaded).contains(&index) {
                    Some(format!("worker {index}'s records have already arrived"))
                } else {
                    tracing::info!("worker {index} reconnected to upload its records");
                    let _ = links.events.send(Event::Rejoined { worker: index }).await;
                    links.open(index, read, write, true);
                    continue;
                }
            }
            _ => Some(format!(
                "the run has started: all {workers} workers joined, and a sweep cannot be \
                 joined half-way"
            )),
        };
        if let Some(reason) = refusal {
            tracing::warn!("coordinator: refused {peer}: {reason}");
            let _ = send(&mut write, &ToWorker::Refused { reason }).await;
        }
    }
}

/// How often the leader says which workers it still waits for.
const JOIN_NOTICE: Duration = Duration::from_secs(5);

/// Ctrl-C/SIGTERM on the leader interrupts every worker too (after an
/// abort the workers have been told why already).
async fn pass_on_interrupts(
    fleet: Arc<Fleet>,
    interrupt: CancellationToken,
    interrupt_now: CancellationToken,
    done: CancellationToken,
) {
    tokio::select! {
        _ = interrupt.cancelled() => {
            if lock(&fleet.aborted).is_none() {
                fleet.broadcast(&ToWorker::Interrupt { now: false });
            }
        }
        _ = done.cancelled() => return,
    }
    tokio::select! {
        _ = interrupt_now.cancelled() => fleet.broadcast(&ToWorker::Interrupt { now: true }),
        _ = done.cancelled() => {}
    }
}
