//! The coordination protocol: JSON messages, one per line, over one TCP
//! connection per worker (worker 0, the leader, listens).
//!
//! A worker sends [`ToLeader::Join`] and gets [`ToWorker::Welcome`] (its
//! share of the scenario and its seed) or [`ToWorker::Refused`] with the
//! reason. Then, per stage: `Ready` → `Start` (the stage starts when the
//! announcement arrives), and after a measured stage `Stats` → `Decision`.
//! A worker stopped by its own Ctrl-C/SIGTERM says `Leaving` first. At the
//! end the worker sends `Upload` followed by its `requests.jsonl` bytes
//! (none when it shares the leader's results directory: the leader reads
//! the file) and waits for `Received` or `UploadFailed` (then it tries
//! again, on a new connection opened with `Rejoin` if the first one
//! broke). Both sides send `Heartbeat` while idle; a side that hears
//! nothing for the heartbeat timeout counts the other as gone.

use nyann_load::RunResult;
use nyann_load::stats::StageAccumulator;
use nyann_model::Scenario;
use serde::{Deserialize, Serialize};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;

/// Bumped on any incompatible change of the messages.
pub const PROTOCOL_VERSION: u32 = 2;

/// What a worker's build must match: the release and commit it was built
/// from (given by the binary) and the protocol version.
pub fn build_id(release: &str) -> String {
    format!("{release}, protocol {PROTOCOL_VERSION}")
}

/// Longest message line accepted (a scenario of 10,000 steps fits).
const MAX_LINE: u64 = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
// Externally tagged: an internally tagged enum buffers its fields, and
// buffered floats do not deserialize with serde_json's `arbitrary_precision`
// (which the Starlark crate turns on).
#[serde(rename_all = "snake_case")]
pub enum ToLeader {
    Join {
        build: String,
        index: usize,
        workers: usize,
        /// Digest of the scenario the worker was given, if it was given one.
        scenario_digest: Option<String>,
    },
    Heartbeat,
    /// Ready to start step `stage` (holding the previous stage's level).
    Ready {
        stage: usize,
    },
    /// The worker's statistics of measured stage `stage`.
    Stats {
        stage: usize,
        stats: Box<StageAccumulator>,
    },
    /// The worker was interrupted by its own Ctrl-C/SIGTERM (a pod
    /// eviction): it stops sending load, then uploads what it has.
    Leaving {
        reason: String,
    },
    /// The run ended: its result, then `records_bytes` raw bytes of
    /// `requests.jsonl`, or none when `shared`: the worker found the
    /// leader's marker in its own results directory, so the leader reads
    /// the first `records_bytes` bytes of the worker's file itself.
    Upload {
        result: Box<RunResult>,
        /// Per measured stage: seconds from sending `Stats` to the decision.
        decision_waits: Vec<(usize, f64)>,
        records_bytes: u64,
        #[serde(default)]
        shared: bool,
    },
    /// The first message of a new connection that retries a worker's
    /// upload after its link broke; `Upload` follows.
    Rejoin {
        build: String,
        index: usize,
        /// The run's token (from `Welcome`): the same leader, the same run.
        run: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
// Externally tagged: an internally tagged enum buffers its fields, and
// buffered floats do not deserialize with serde_json's `arbitrary_precision`
// (which the Starlark crate turns on).
#[serde(rename_all = "snake_case")]
pub enum ToWorker {
    Welcome {
        scenario: Box<Scenario>,
        seed: u64,
        first_id: u64,
        /// The worker's part of the scenario's eval datasets.
        dataset_share: nyann_load::DatasetShare,
        /// This run's token. The leader keeps a file named
        /// [`marker_name`]`(run)` in its results directory while the run
        /// lasts: a worker that finds it in its own sees a shared directory.
        run: String,
    },
    Refused {
        reason: String,
    },
    Heartbeat,
    Start {
        stage: usize,
    },
    /// A capacity-search stage (`refine=`) starts: `level` is the fleet's
    /// (concurrency or rate), divided between `workers` by their position
    /// ([`crate::share::search_share`]), `label` the fleet's label of the
    /// stage; `level: None` ends the search.
    Search {
        stage: usize,
        level: Option<f64>,
        workers: Vec<usize>,
        label: String,
    },
    /// `stop`: the sweep stops after `stage`, with this reason.
    Decision {
        stage: usize,
        stop: Option<String>,
    },
    /// Ctrl-C/SIGTERM on the leader (`now`: the second one).
    Interrupt {
        now: bool,
    },
    /// The leader aborts the run (a worker was lost with `--on-worker-loss abort`).
    Abort {
        reason: String,
    },
    /// The upload arrived.
    Received,
    /// The upload did not arrive (the reason): the worker may try again.
    UploadFailed {
        reason: String,
    },
}

/// The marker file a leader keeps in its results directory during run `run`.
pub fn marker_name(run: &str) -> String {
    format!(".nyann-fleet-{run}")
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the connection closed")]
    Closed,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The cause is in the message (not a `source`, or it is said twice).
    #[error("unreadable message: {0}")]
    Json(serde_json::Error),
}

/// Writes one message line.
pub async fn send<W: AsyncWrite + Unpin>(
    w: &mut W,
    message: &impl Serialize,
) -> Result<(), WireError> {
    let mut line = serde_json::to_vec(message).map_err(WireError::Json)?;
    line.push(b'\n');
    w.write_all(&line).await?;
    w.flush().await?;
    Ok(())
}

/// A message queued for a connection's writer task.
pub(crate) trait Queued: Send + 'static {
    /// What is sent when nothing else was for a while.
    fn heartbeat() -> Self;

    /// Writes it on the connection.
    fn write_to(
        self,
        write: &mut OwnedWriteHalf,
    ) -> impl Future<Output = Result<(), WireError>> + Send;
}

/// A connection's writer: sends what is queued, and a heartbeat every
/// `every`, until the queue closes or a write fails (the connection's
/// reader notices a lost peer).
pub(crate) async fn write_task<M: Queued>(
    mut write: OwnedWriteHalf,
    mut outgoing: mpsc::Receiver<M>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        let message = tokio::select! {
            message = outgoing.recv() => match message {
                None => break,
                Some(message) => message,
            },
            _ = tick.tick() => M::heartbeat(),
        };
        if message.write_to(&mut write).await.is_err() {
            break;
        }
    }
}

impl Queued for ToWorker {
    fn heartbeat() -> Self {
        ToWorker::Heartbeat
    }

    async fn write_to(self, write: &mut OwnedWriteHalf) -> Result<(), WireError> {
        send(write, &self).await
    }
}

/// Reads one message line.
pub async fn receive<R: AsyncBufRead + Unpin, M: for<'de> Deserialize<'de>>(
    r: &mut R,
) -> Result<M, WireError> {
    let mut line = Vec::new();
    let n = r.take(MAX_LINE).read_until(b'\n', &mut line).await?;
    if n == 0 || line.last() != Some(&b'\n') {
        return Err(WireError::Closed);
    }
    serde_json::from_slice(&line).map_err(WireError::Json)
}

/// FNV-1a of the scenario's JSON: "same scenario" across workers.
pub fn scenario_digest(scenario: &Scenario) -> String {
    let json = serde_json::to_vec(scenario).unwrap_or_default();
    let hash = json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}
