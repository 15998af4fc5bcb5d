//! The stage runner: turns the scenario's steps into load, records and
//! per-stage statistics.
//!
//! The modules follow a run: [`rules`] (the scenario's rules),
//! [`prepare`] (targets, models, prompts), [`state`] (what the tasks
//! share), [`load`] (the senders at a stage's level), [`pool`] (the
//! conversations of `conversation_pool` stages), [`turn`] (one request
//! and its record), [`steps`] (the stage loop), [`sweeps`] (what a stop
//! skips), [`results`] (statistics, totals, outcome).
//!
//! Rules (docs/scenarios.md and docs/client.md document them in the same
//! words):
//! - A request belongs to the stage in which it was SENT. A stage's
//!   statistics wait for its requests still in flight when its time ran out,
//!   for at most the drain time (`drain_timeout`, or twice the stage's E2E
//!   p99 when that is longer); those still in flight then are abandoned,
//!   recorded `late` (counted, in no latency), and the next stage starts.
//! - Between the end of a measured stage and the start of the next, the load
//!   HOLDS the finished stage's level (same concurrency or arrival rate) while
//!   the stage's last requests complete and the [`StageHook`] decides.
//!   Requests sent then are recorded with phase `hold` and count in no stage.
//!   After the last stage, and after a hook says stop, the load stops instead.
//! - A stage change grows or shrinks the set of closed-loop streams; no
//!   in-flight request is ever aborted by it (a surplus stream ends after its
//!   current request). Switching between closed and open loop stops the old
//!   sender the same way.
//! - Warm-up stages send load, are tagged `warmup`, are never judged and do
//!   not count in the totals; the next stage starts right after them.
//! - A barrier is a no-op, except `drain=True`: the load stops and the barrier
//!   waits until nothing is in flight.
//! - `max_requests` ends a stage once that many requests were sent in it.
//! - After a failed or rejected request a closed-loop stream backs off
//!   before its next one ([`crate::backoff`]). Rejections (429, 503 with
//!   `Retry-After`: a busy server) never count toward
//!   `max_consecutive_errors`.
//! - After `max_consecutive_errors` failures in a row, or on interrupt, the
//!   runner stops sending, waits up to the grace period for in-flight
//!   requests (a second interrupt ends the wait), records the rest as
//!   cancelled and writes every output.
//! - Before anything, the scenario's peak of requests in flight is checked
//!   against the open-file limit and the memory ([`crate::preflight`]).

mod load;
mod open_loop;
mod pool;
mod prepare;
mod results;
mod rules;
pub mod search;
mod state;
mod steps;
mod sweeps;
mod turn;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nyann_model::Scenario;
use tokio_util::sync::CancellationToken;

use crate::client::{Client, ClientConfig, ClientError};
use crate::hook::StageHook;
use crate::live::Live;
use crate::preflight;
use crate::record::{RecordSink, RecordWriter};
use crate::result::RunResult;
use crate::workload::{DatasetShare, WorkloadError};

use self::load::Load;
use self::state::{Shared, SharedParts};
use self::steps::{drain_all, interruptible, run_steps};

/// The OpenAI base URL used when neither the flag, the stage nor the scenario names one.
pub const DEFAULT_TARGET: &str = "http://localhost:8000/v1";

/// Everything the runner needs besides the scenario and the hook.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub client: ClientConfig,
    /// `--target`: wins over the scenario's target; a stage's own target wins over it.
    pub target: Option<String>,
    /// `--model`: same precedence as the target; absent everywhere = first model of `/models`.
    pub model: Option<String>,
    pub seed: u64,
    /// 0 = never abort.
    pub max_consecutive_errors: u32,
    /// How long to wait for `GET /models` to answer before any load.
    pub ready_timeout: Duration,
    /// How long in-flight requests may finish after an interrupt or abort.
    pub grace: Duration,
    /// How long a stage's requests still in flight at its end may take
    /// (at least: twice the stage's E2E p99 when that is longer) before
    /// they are abandoned as `late` and the next stage starts.
    pub drain_timeout: Duration,
    /// Where `requests.jsonl`, `stages.json` and `summary.json` go (created if missing).
    pub output_dir: Option<PathBuf>,
    /// Cancel it (Ctrl-C, SIGTERM) to interrupt the run.
    pub interrupt: CancellationToken,
    /// Cancel it after `interrupt` (a second signal) to skip the rest of the
    /// grace period: requests in flight are cancelled at once.
    pub interrupt_now: CancellationToken,
    /// Live counters for a progress display.
    pub live: Option<Arc<Live>>,
    /// First request and conversation id: one of several workers starts
    /// its ids apart from the others' so records merge without clashes.
    pub first_id: u64,
    /// This process's part of an eval dataset, when it is one of a
    /// fleet's workers; `None`: the whole dataset, shuffled with `seed`.
    pub dataset_share: Option<DatasetShare>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            client: ClientConfig::default(),
            target: None,
            model: None,
            seed: 0,
            max_consecutive_errors: 5,
            ready_timeout: Duration::from_secs(30),
            grace: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(30),
            output_dir: None,
            interrupt: CancellationToken::new(),
            interrupt_now: CancellationToken::new(),
            live: None,
            first_id: 0,
            dataset_share: None,
        }
    }
}

/// Why a run could not start (no load has been sent when these occur).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The scenario breaks the scenario language's rules
    /// ([`nyann_model::rules`]): every problem, one a line.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
    /// The scenario does not fit this host (open files, memory).
    #[error("{0}")]
    Resources(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// (The OS error is part of the message, not a `source`: a printed
    /// error chain says it once.)
    #[error("cannot write to output directory {path}: {error}")]
    Output {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("interrupted before any load was sent")]
    Interrupted,
}

/// Runs the scenario to its end (or stop, abort, interrupt) and writes the outputs.
pub async fn run<H: StageHook>(
    scenario: &Scenario,
    options: RunOptions,
    mut hook: H,
) -> Result<RunResult<H::Annotation>, RunError> {
    rules::scenario(scenario)?;
    if let Some(peak) = preflight::peak(scenario) {
        preflight::check(&peak, &preflight::Limits::of_this_process())
            .map_err(RunError::Resources)?;
    }
    let client = Client::new(options.client.clone())?;
    // Everything that needs no server is checked before waiting for it.
    let (sink, writer) = open_outputs(&options)?;
    // Waiting for the server can take a while: Ctrl-C must work here too.
    let prepared = tokio::select! {
        prepared = prepare::prepare(scenario, &options, &client) => prepared?,
        _ = options.interrupt.cancelled() => return Err(RunError::Interrupted),
    };
    if let Some(dir) = &options.output_dir {
        nyann_results::RunDir::at(dir)
            .write_server(&prepared.facts)
            .map_err(|error| RunError::Output {
                path: dir.join(nyann_results::SERVER),
                error,
            })?;
    }
    let shared = Arc::new(Shared::new(
        scenario,
        SharedParts {
            client,
            sink,
            settings: prepared.per_step,
            search_slots: search::slots(scenario),
            max_consecutive_errors: options.max_consecutive_errors,
            halt: options.interrupt.child_token(),
            live: options.live.clone(),
            seed: options.seed,
            first_id: options.first_id,
        },
    ));
    let flusher = Flusher::start(&shared.sink);
    // Records that cannot be kept are not worth sending: the first failed
    // write stops the load.
    let write_watch = {
        let (shared, failure) = (shared.clone(), writer.failure());
        tokio::spawn(async move {
            let why = failure.wait().await;
            shared.abort(format!("{why}; the load stopped there"));
        })
    };
    let mut load = Load::new(shared.clone());
    let ran = run_steps(scenario, &shared, &mut load, &options, &mut hook).await;
    wind_down(&shared, &mut load, &options).await;

    let mut stages = ran.results;
    for (index, step) in scenario.steps.iter().enumerate().skip(stages.len()) {
        stages.push(results::skipped(
            index,
            step,
            shared.halted_reason(&options.interrupt),
        ));
    }
    // The capacity searches' stages follow the steps, numbered on.
    stages.extend(ran.searched);
    let measured_seconds =
        ran.measured_seconds + results::late_statistics(&mut stages, ran.interrupted, &shared);
    let (totals, totals_detail) = results::totals(&stages, &shared, measured_seconds);
    let repeats = shared.repeats.load(std::sync::atomic::Ordering::Relaxed);
    if repeats > 0 {
        tracing::warn!(
            "{repeats} conversation(s) replayed a recorded one already sent: the dataset's \
             conversations ran out and started over (each repeat with a fresh cache salt, so \
             that a prefix cache does not serve it; give the workload a cache_salt to choose); \
             a larger file or shorter stages send each once"
        );
    }
    let end_unix = shared.clock.unix(Instant::now());
    let start_unix = shared.clock.unix_start;
    flusher.stop().await;
    shared.sink.flush().await;
    write_watch.abort();
    let requests_recorded = shared.sink.lines();
    drop(load);
    let mut outcome = results::outcome(&options.interrupt, &shared, ran.stops);
    // Every task has ended: this is the last handle on the record channel.
    drop(shared);
    if let Err(why) = writer.finish().await {
        // A failure at the last write: the run is not whole on disk.
        outcome.abort_unless_halted(why);
    }
    let mut result = RunResult {
        outcome,
        start_unix,
        end_unix,
        seed: options.seed,
        models: prepared.models,
        targets: prepared.targets,
        totals,
        totals_detail,
        requests_recorded,
        stages,
    };
    if let Some(dir) = &options.output_dir
        && let Err(error) = result.write_files(dir)
    {
        // Nothing is lost that the caller can still show: the result is
        // returned, said to be aborted on the files it lacks.
        let why = format!("cannot write the results into {}: {error}", dir.display());
        tracing::error!("{why}");
        result.outcome.abort_unless_halted(why);
    }
    Ok(result)
}

/// Creates the output directory and opens `requests.jsonl` in it.
fn open_outputs(options: &RunOptions) -> Result<(RecordSink, RecordWriter), RunError> {
    let output_error = |error| RunError::Output {
        path: options.output_dir.clone().unwrap_or_default(),
        error,
    };
    if let Some(dir) = &options.output_dir {
        std::fs::create_dir_all(dir).map_err(output_error)?;
    }
    RecordSink::create(options.output_dir.as_deref()).map_err(output_error)
}

/// Stops sending. On a normal end, lets in-flight requests finish within
/// the drain time (then they are late); after an interrupt or abort, gives
/// them the grace period (a second interrupt ends it at once), then cancels
/// them. Returns once every task has ended.
async fn wind_down(shared: &Shared, load: &mut Load, options: &RunOptions) {
    load.stop();
    if !shared.halt.is_cancelled() {
        interruptible(shared, drain_all(shared, options.drain_timeout)).await;
    }
    if shared.halt.is_cancelled() {
        tokio::select! {
            _ = tokio::time::timeout(options.grace, shared.inflight.wait_zero()) => {}
            _ = options.interrupt_now.cancelled() => {}
        }
        let left = shared.inflight.get();
        if left > 0 {
            tracing::warn!("cancelling {left} request(s) still in flight");
        }
        shared.abandon_all();
    }
    shared.tracker.close();
    shared.tracker.wait().await;
}

/// Hands buffered records to the writer regularly (the durability bound).
struct Flusher {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Flusher {
    fn start(sink: &RecordSink) -> Self {
        let sink = sink.clone();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::record::FLUSH_INTERVAL);
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => break,
                    _ = tick.tick() => sink.flush().await,
                }
            }
        });
        Flusher { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Seconds as a `Duration` (an absurd number of seconds: practically never).
fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX / 4)
}
