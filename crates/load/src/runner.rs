//! The stage runner: turns the scenario's steps into load, records and
//! per-stage statistics.
//!
//! Rules (the README documents them in the same words):
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

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nyann_model::{CacheSalt, ClientStats, Mode, Scenario, Stage, Step, Workload};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::client::{Client, ClientConfig, ClientError, Message, Outcome, RequestSpec};
use crate::hook::{FinishedStage, HookDecision, StageHook};
use crate::http::{RequestTemplate, Target};
use crate::live::Live;
use crate::lock;
use crate::preflight;
use crate::record::{Phase, RecordSink, RequestRecord, Status, TokenSource};
use crate::result::{RunOutcome, RunResult, StageResult, StageStatus};
use crate::schedule::Schedule;
use crate::stats::{StageAccumulator, StageDetail};
use crate::workload::{PromptGen, WorkloadError};

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
        }
    }
}

/// Why a run could not start (no load has been sent when these occur).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(
        "{at}mode `conversation_pool` is not supported yet: use `concurrent` with `turns` in the workload"
    )]
    ConversationPoolUnsupported { at: String },
    #[error("{at}{message}")]
    InvalidStage { at: String, message: String },
    #[error("the scenario has no stage")]
    NoStage,
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
) -> Result<RunResult, RunError> {
    validate(scenario)?;
    if let Some(peak) = preflight::peak(scenario) {
        preflight::check(&peak, &preflight::Limits::of_this_process())
            .map_err(RunError::Resources)?;
    }
    let client = Client::new(options.client.clone())?;
    // Everything that needs no server is checked before waiting for it.
    if let Some(dir) = &options.output_dir {
        std::fs::create_dir_all(dir).map_err(|error| RunError::Output {
            path: dir.clone(),
            error,
        })?;
    }
    let (sink, writer) =
        RecordSink::create(options.output_dir.as_deref()).map_err(|error| RunError::Output {
            path: options.output_dir.clone().unwrap_or_default(),
            error,
        })?;
    // Waiting for the server can take a while: Ctrl-C must work here too.
    let settings = tokio::select! {
        settings = prepare(scenario, &options, &client) => settings?,
        _ = options.interrupt.cancelled() => return Err(RunError::Interrupted),
    };

    let steps = &scenario.steps;
    let clock = Clock::now();
    let halt = options.interrupt.child_token();
    let abandon = CancellationToken::new();
    let shared = Arc::new(Shared {
        client,
        sink,
        clock,
        slots: (0..steps.len()).map(|_| Slot::new(&abandon)).collect(),
        settings: settings.per_step.clone(),
        current: Mutex::new(Current {
            stage: 0,
            phase: Phase::Hold,
            stopped: true,
            sent: vec![0; steps.len()],
        }),
        inflight: Counter::default(),
        next_id: AtomicU64::new(options.first_id),
        next_conversation: AtomicU64::new(options.first_id),
        consecutive_errors: AtomicU64::new(0),
        max_consecutive_errors: options.max_consecutive_errors as u64,
        abort_reason: Mutex::new(None),
        halt: halt.clone(),
        abandon,
        abandoned_by_interrupt: AtomicBool::new(false),
        tracker: TaskTracker::new(),
        live: options.live.clone(),
        seed: options.seed,
        max_requests: steps
            .iter()
            .map(|s| match s {
                Step::Stage(stage) => stage.max_requests,
                Step::Barrier { .. } => 0,
            })
            .collect(),
    });

    // Hands buffered records to the writer regularly (the durability bound).
    let flusher_stop = CancellationToken::new();
    let flusher = {
        let sink = shared.sink.clone();
        let stop = flusher_stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::record::FLUSH_INTERVAL);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => sink.flush().await,
                }
            }
        })
    };
    let mut runner = Runner {
        shared: shared.clone(),
        level: Level::Idle,
        halt: halt.clone(),
    };
    let mut results: Vec<StageResult> = Vec::with_capacity(steps.len());
    let mut stop: Option<(usize, String)> = None;
    let last_stage = steps.iter().rposition(|s| matches!(s, Step::Stage(_)));
    let mut warmups: Vec<usize> = Vec::new();
    let mut measured_seconds = 0.0;
    let mut interrupted_stage: Option<usize> = None;

    for (index, step) in steps.iter().enumerate() {
        if halt.is_cancelled() {
            results.push(skipped(
                index,
                step,
                halted_reason(&options.interrupt, &shared),
            ));
            continue;
        }
        if let Some((_, reason)) = &stop {
            results.push(skipped(index, step, reason.clone()));
            continue;
        }
        let stage = match step {
            Step::Barrier { drain } => {
                if *drain {
                    runner.stop_load();
                    runner
                        .interruptible(drain_all(&shared, options.drain_timeout))
                        .await;
                }
                results.push(barrier(index, *drain));
                continue;
            }
            Step::Stage(stage) => stage,
        };
        let label = stage.label(index);
        let phase = if stage.warmup {
            Phase::Warmup
        } else {
            Phase::Measured
        };
        // Several workers start a stage when their coordinator says so.
        if runner
            .interruptible(hook.before_stage(index))
            .await
            .is_none()
        {
            results.push(skipped(
                index,
                step,
                halted_reason(&options.interrupt, &shared),
            ));
            continue;
        }
        let start = Instant::now();
        runner.start_stage(index, stage, phase, start);
        if let Some(live) = &shared.live {
            live.stage_started(index, &label, stage.duration_s, stage.warmup);
        }
        tracing::info!(
            "stage {label}: started for {}{}",
            humantime::format_duration(secs(stage.duration_s)),
            if stage.warmup {
                " (warm-up: not measured)"
            } else {
                ""
            },
        );
        // The stage's time: its duration, or until max_requests were sent.
        let deadline = tokio::time::Instant::from_std(start + secs(stage.duration_s));
        let limit = shared.slots[index].limit_reached.notified();
        let stage_done = async {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = limit, if stage.max_requests > 0 => {}
            }
        };
        let finished = runner.interruptible(stage_done).await.is_some();
        let end = Instant::now();
        if !finished {
            interrupted_stage = Some(index);
            results.push(stage_result(
                index,
                stage,
                StageStatus::Interrupted,
                Some((start, end)),
                &shared.clock,
            ));
            break;
        }
        if Some(index) == last_stage {
            runner.stop_load();
        } else {
            runner.hold();
        }
        if stage.warmup {
            warmups.push(index);
            results.push(stage_result(
                index,
                stage,
                StageStatus::Warmup,
                Some((start, end)),
                &shared.clock,
            ));
            continue;
        }
        // Every request sent in the stage has to end (or be cut, late)
        // before its statistics exist.
        if runner
            .interruptible(drain_stage(&shared, index, &label, options.drain_timeout))
            .await
            .is_none()
        {
            interrupted_stage = Some(index);
            results.push(stage_result(
                index,
                stage,
                StageStatus::Interrupted,
                Some((start, end)),
                &shared.clock,
            ));
            break;
        }
        let duration = end.duration_since(start).as_secs_f64();
        measured_seconds += duration;
        let (client_stats, detail) = shared.slots[index].finish(duration);
        let stats = shared.slots[index].snapshot();
        log_stage_end(&label, &client_stats, &detail);
        let mut result = stage_result(
            index,
            stage,
            StageStatus::Measured,
            Some((start, end)),
            &shared.clock,
        );
        result.client = Some(client_stats.clone());
        result.detail = Some(detail.clone());
        let outcome = {
            let done = FinishedStage {
                index,
                stage,
                label: &label,
                start_unix: shared.clock.unix(start),
                end_unix: shared.clock.unix(end),
                client: &client_stats,
                detail: &detail,
                stats: &stats,
                history: &results,
            };
            runner.interruptible(hook.after_stage(&done)).await
        };
        let Some(outcome) = outcome else {
            tracing::warn!("stage {label}: interrupted during its check");
            result.check_interrupted = true;
            results.push(result);
            break;
        };
        result.annotation = outcome.annotation;
        results.push(result);
        if let HookDecision::Stop { reason } = outcome.decision {
            tracing::info!("stage {label}: the sweep stops here: {reason}");
            runner.stop_load();
            stop = Some((index, format!("stopped after stage {label}: {reason}")));
        }
    }

    // Wind down: stop sending; on a normal end let in-flight requests finish
    // within the drain time (then they are late); after an interrupt or
    // abort give them the grace period (a second interrupt ends it at
    // once), then cancel them.
    runner.stop_load();
    if !halt.is_cancelled() {
        runner
            .interruptible(drain_all(&shared, options.drain_timeout))
            .await;
    }
    if halt.is_cancelled() {
        tokio::select! {
            _ = tokio::time::timeout(options.grace, shared.inflight.wait_zero()) => {}
            _ = options.interrupt_now.cancelled() => {}
        }
        let left = shared.inflight.get();
        if left > 0 {
            tracing::warn!("cancelling {left} request(s) still in flight");
        }
        shared.abandoned_by_interrupt.store(true, Ordering::SeqCst);
        shared.abandon.cancel();
    }
    shared.tracker.close();
    shared.tracker.wait().await;
    let first_missing = results.len();
    for (index, step) in steps.iter().enumerate().skip(first_missing) {
        results.push(skipped(
            index,
            step,
            halted_reason(&options.interrupt, &shared),
        ));
    }

    // Statistics of warm-up and interrupted stages, now that their requests ended.
    for result in results.iter_mut() {
        if result.status == StageStatus::Warmup || Some(result.index) == interrupted_stage {
            let duration = match (result.start_unix, result.end_unix) {
                (Some(s), Some(e)) => e - s,
                _ => 0.0,
            };
            if result.status == StageStatus::Interrupted {
                measured_seconds += duration;
            }
            let (c, d) = shared.slots[result.index].finish(duration);
            result.client = Some(c);
            result.detail = Some(d);
        }
    }
    let outcome = if options.interrupt.is_cancelled() {
        RunOutcome::Interrupted
    } else if let Some(reason) = lock(&shared.abort_reason).clone() {
        RunOutcome::Aborted { reason }
    } else if let Some((stage, reason)) = stop {
        RunOutcome::Stopped { stage, reason }
    } else {
        RunOutcome::Completed
    };
    // Totals: the measured (and interrupted) stages' accumulators merged.
    let mut totals_acc = StageAccumulator::new();
    for result in &results {
        if matches!(
            result.status,
            StageStatus::Measured | StageStatus::Interrupted
        ) {
            shared.slots[result.index].merge_into(&mut totals_acc);
        }
    }
    let (totals, totals_detail) = totals_acc.finish(measured_seconds);
    let end_unix = shared.clock.unix(Instant::now());
    let start_unix = shared.clock.unix_start;
    flusher_stop.cancel();
    let _ = flusher.await;
    shared.sink.flush().await;
    let requests_recorded = shared.sink.lines();
    drop(runner);
    // Every task has ended: this is the last handle on the record channel.
    drop(shared);
    writer.finish().await.map_err(|error| RunError::Output {
        path: options
            .output_dir
            .clone()
            .unwrap_or_default()
            .join("requests.jsonl"),
        error,
    })?;
    let result = RunResult {
        outcome,
        start_unix,
        end_unix,
        seed: options.seed,
        models: settings.models,
        targets: settings.targets,
        totals,
        totals_detail,
        requests_recorded,
        stages: results,
    };
    if let Some(dir) = &options.output_dir {
        result.write_files(dir).map_err(|error| RunError::Output {
            path: dir.clone(),
            error,
        })?;
    }
    Ok(result)
}

fn halted_reason(interrupt: &CancellationToken, shared: &Shared) -> String {
    if interrupt.is_cancelled() {
        "interrupted".into()
    } else {
        match lock(&shared.abort_reason).as_ref() {
            Some(reason) => format!("aborted: {reason}"),
            None => "aborted".into(),
        }
    }
}

/// Waits for the requests of stage `index` still in flight at its end, for
/// at most `drain` or twice the stage's E2E p99 if that is longer; then
/// abandons the rest as late.
async fn drain_stage(shared: &Shared, index: usize, label: &str, drain: Duration) {
    let slot = &shared.slots[index];
    let drain = drain.max(secs(2.0 * slot.e2e_p99()));
    if tokio::time::timeout(drain, slot.inflight.wait_zero())
        .await
        .is_err()
    {
        tracing::warn!(
            "stage {label}: {} request(s) still in flight {} after the stage ended: recorded as \
             late; the next stage starts (--drain-timeout)",
            slot.inflight.get(),
            humantime::format_duration(drain),
        );
        slot.cut.cancel();
        // Abandoned requests record themselves at once.
        slot.inflight.wait_zero().await;
    }
}

/// Waits for every request in flight (the load stopped) for at most
/// `drain`, then abandons the rest as late.
async fn drain_all(shared: &Shared, drain: Duration) {
    if tokio::time::timeout(drain, shared.inflight.wait_zero())
        .await
        .is_err()
    {
        tracing::warn!(
            "{} request(s) still in flight {} after the load stopped: recorded as late \
             (--drain-timeout)",
            shared.inflight.get(),
            humantime::format_duration(drain),
        );
        // Only stages that ran have requests; later stages keep their tokens.
        let current = lock(&shared.current).stage;
        for slot in &shared.slots[..=current] {
            slot.cut.cancel();
            slot.hold_cut.cancel();
        }
        shared.inflight.wait_zero().await;
    }
}

/// The stage's one-line summary, and what the user should know about the
/// client itself: its own failures, and whether it kept up.
fn log_stage_end(label: &str, client: &ClientStats, detail: &StageDetail) {
    tracing::info!(
        "stage {label}: ended: {} ok, {} errors, {} rejected, {:.1} req/s, TTFT p50 {:.0} ms, p99 {:.0} ms",
        client.requests_ok,
        client.requests_failed,
        client.requests_rejected,
        client.requests_per_second,
        client.ttft_p50_seconds * 1000.0,
        client.ttft_p99_seconds * 1000.0,
    );
    if let Some(warning) = crate::stats::client_warning(client, detail) {
        tracing::warn!("stage {label}: {warning}");
    }
}

fn where_(stage: &Stage, index: usize) -> String {
    match &stage.location {
        Some(loc) => format!("{loc}: stage {}: ", stage.label(index)),
        None => format!("stage {}: ", stage.label(index)),
    }
}

/// Checks what the runner supports before anything is sent.
fn validate(scenario: &Scenario) -> Result<(), RunError> {
    let mut any = false;
    for (index, step) in scenario.steps.iter().enumerate() {
        let Step::Stage(stage) = step else { continue };
        any = true;
        let at = where_(stage, index);
        let invalid = |message: &str| {
            Err(RunError::InvalidStage {
                at: at.clone(),
                message: message.into(),
            })
        };
        if !stage.duration_s.is_finite() || stage.duration_s <= 0.0 {
            return invalid("duration must be a positive number of seconds");
        }
        if let Some(r) = stage.rampup_s
            && (!r.is_finite() || r < 0.0)
        {
            return invalid("rampup must be zero or positive");
        }
        match stage.mode {
            Mode::ConversationPool => return Err(RunError::ConversationPoolUnsupported { at }),
            Mode::Concurrent => {
                if stage.concurrency.unwrap_or(0) == 0 {
                    return invalid("mode `concurrent` needs concurrency >= 1");
                }
            }
            Mode::Constant | Mode::Poisson => match stage.rate {
                Some(rate) if rate.is_finite() && rate > 0.0 => {}
                _ => return invalid("open-loop modes (`constant`, `poisson`) need a rate > 0"),
            },
        }
        let w = stage.workload.as_ref().unwrap_or(&scenario.workload);
        if w.turns == 0 {
            return invalid("workload turns must be >= 1");
        }
    }
    if any { Ok(()) } else { Err(RunError::NoStage) }
}

/// Per-stage request settings, resolved once before the run.
#[derive(Debug)]
struct StageSettings {
    target: Arc<Target>,
    /// The head of every streaming request to `target`, rendered once.
    endpoint: RequestTemplate,
    model: String,
    prompts: Arc<PromptGen>,
    first_chars: usize,
    later_chars: usize,
    osl: u32,
    turns: u32,
    cache_salt: Option<CacheSalt>,
}

struct Prepared {
    per_step: Vec<Option<Arc<StageSettings>>>,
    models: Vec<String>,
    targets: Vec<String>,
}

/// Waits for each target, resolves models, builds generators and calibrates
/// characters per token (once per workload, target and model).
async fn prepare(
    scenario: &Scenario,
    options: &RunOptions,
    client: &Client,
) -> Result<Prepared, RunError> {
    // Per base URL: the target (one connection pool each) and its model list.
    let mut ready: HashMap<String, (Arc<Target>, Vec<String>)> = HashMap::new();
    let mut generators: Vec<(Workload, Arc<PromptGen>)> = Vec::new();
    let mut cpt: HashMap<(String, String, String), f64> = HashMap::new();
    let mut per_step = Vec::with_capacity(scenario.steps.len());
    let mut models = Vec::new();
    let mut targets = Vec::new();
    for (index, step) in scenario.steps.iter().enumerate() {
        let Step::Stage(stage) = step else {
            per_step.push(None);
            continue;
        };
        let base = stage
            .target
            .clone()
            .or_else(|| options.target.clone())
            .or_else(|| scenario.target.clone())
            .unwrap_or_else(|| DEFAULT_TARGET.to_string());
        let base = base.trim_end_matches('/').to_string();
        let (target, listed) = match ready.entry(base.clone()) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(new) => {
                let target = client.target(&base)?;
                tracing::info!(
                    "waiting for {} (up to {:?})",
                    target.url("models"),
                    options.ready_timeout
                );
                let listed = client.wait_ready(&target, options.ready_timeout).await?;
                targets.push(base.clone());
                new.insert((target, listed))
            }
        };
        let model = match stage
            .model
            .clone()
            .or_else(|| options.model.clone())
            .or_else(|| scenario.model.clone())
        {
            Some(model) => model,
            None => {
                let first = listed
                    .first()
                    .ok_or_else(|| ClientError::NoModel {
                        url: target.url("models"),
                    })?
                    .clone();
                if models.is_empty() {
                    tracing::info!("model: {first} (auto-detected from {base}/models)");
                }
                first
            }
        };
        if !models.contains(&model) {
            models.push(model.clone());
        }
        let workload = stage
            .workload
            .clone()
            .unwrap_or_else(|| scenario.workload.clone());
        let prompts = match generators.iter().find(|(w, _)| same_text(w, &workload)) {
            Some((_, prompts)) => prompts.clone(),
            None => {
                let prompts = Arc::new(PromptGen::new(&workload, options.seed)?);
                generators.push((workload.clone(), prompts.clone()));
                prompts
            }
        };
        let key = (text_key(&workload), base.clone(), model.clone());
        let chars_per_token = match cpt.get(&key) {
            Some(v) => *v,
            None => {
                let v = calibrate(
                    client,
                    target,
                    &model,
                    &prompts,
                    &workload,
                    &stage.label(index),
                )
                .await;
                cpt.insert(key, v);
                v
            }
        };
        let chars = |tokens: u32| (tokens as f64 * chars_per_token).round() as usize;
        per_step.push(Some(Arc::new(StageSettings {
            endpoint: client.endpoint(target),
            target: target.clone(),
            model,
            prompts,
            first_chars: chars(workload.isl),
            later_chars: chars(workload.subsequent_isl.unwrap_or(workload.isl)),
            osl: workload.osl,
            turns: workload.turns.max(1),
            cache_salt: workload.cache_salt.clone(),
        })));
    }
    Ok(Prepared {
        per_step,
        models,
        targets,
    })
}

/// Workloads that produce the same text share a generator and a calibration.
fn same_text(a: &Workload, b: &Workload) -> bool {
    a.kind == b.kind && a.corpus_path == b.corpus_path
}

fn text_key(w: &Workload) -> String {
    format!(
        "{:?}:{}:{}",
        w.kind,
        w.corpus_path.as_deref().unwrap_or(""),
        w.chars_per_token
    )
}

/// Characters per token: measured with the server's `/tokenize` when it has
/// one, else the workload's `chars_per_token`, else 4.0.
async fn calibrate(
    client: &Client,
    target: &Target,
    model: &str,
    prompts: &PromptGen,
    workload: &Workload,
    label: &str,
) -> f64 {
    let sample = prompts.text(u64::MAX, 1, 8000);
    if let Some(count) = client.count_tokens(target, model, &sample).await
        && count > 0
    {
        {
            let v = sample.len() as f64 / count as f64;
            tracing::info!(
                "ISL calibration ({label}, {:?}): {v:.3} characters per token, measured with /tokenize",
                workload.kind
            );
            return v;
        }
    }
    if workload.chars_per_token > 0.0 {
        tracing::info!(
            "ISL calibration ({label}): the server has no /tokenize; using the workload's chars_per_token = {}",
            workload.chars_per_token
        );
        workload.chars_per_token
    } else {
        tracing::info!(
            "ISL calibration ({label}): the server has no /tokenize and the workload sets no chars_per_token; \
             assuming 4.0 characters per token (prompt lengths are approximate)"
        );
        4.0
    }
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX / 4)
}

/// Unix time of `Instant`s, from one reading of both clocks at the run start.
#[derive(Debug, Clone, Copy)]
struct Clock {
    instant: Instant,
    unix_start: f64,
}

impl Clock {
    fn now() -> Self {
        let unix_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Clock {
            instant: Instant::now(),
            unix_start,
        }
    }

    fn unix(&self, t: Instant) -> f64 {
        match t.checked_duration_since(self.instant) {
            Some(d) => self.unix_start + d.as_secs_f64(),
            None => self.unix_start - self.instant.duration_since(t).as_secs_f64(),
        }
    }
}

/// An in-flight counter that can be awaited down to zero.
#[derive(Debug, Default)]
struct Counter {
    value: AtomicU64,
    zero: Notify,
}

impl Counter {
    fn up(&self) {
        self.value.fetch_add(1, Ordering::SeqCst);
    }

    fn down(&self) {
        if self.value.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.zero.notify_waiters();
        }
    }

    fn get(&self) -> u64 {
        self.value.load(Ordering::SeqCst)
    }

    async fn wait_zero(&self) {
        loop {
            let notified = self.zero.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.get() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Per-step bookkeeping.
#[derive(Debug)]
struct Slot {
    acc: Mutex<Option<StageAccumulator>>,
    /// Requests sent in this stage and not yet recorded.
    inflight: Counter,
    limit_reached: Notify,
    /// Cancelled when the stage's drain time ran out: abandons its requests.
    cut: CancellationToken,
    /// The same for the requests sent at the stage's level after its end.
    hold_cut: CancellationToken,
}

impl Slot {
    /// A slot whose requests `abandon` abandons too.
    fn new(abandon: &CancellationToken) -> Self {
        Slot {
            acc: Mutex::default(),
            inflight: Counter::default(),
            limit_reached: Notify::new(),
            cut: abandon.child_token(),
            hold_cut: abandon.child_token(),
        }
    }

    fn e2e_p99(&self) -> f64 {
        lock(&self.acc)
            .as_ref()
            .map_or(0.0, StageAccumulator::e2e_p99)
    }

    /// The accumulator is created on first use: skipped stages cost no histogram memory.
    fn add(&self, record: &RequestRecord) {
        lock(&self.acc)
            .get_or_insert_with(StageAccumulator::new)
            .add(record);
    }

    fn merge_into(&self, total: &mut StageAccumulator) {
        if let Some(acc) = lock(&self.acc).as_ref() {
            total.merge(acc);
        }
    }

    /// A copy of the stage's histograms (for merging with other workers').
    fn snapshot(&self) -> StageAccumulator {
        lock(&self.acc).clone().unwrap_or_default()
    }

    fn finish(&self, duration: f64) -> (ClientStats, StageDetail) {
        match lock(&self.acc).as_ref() {
            Some(acc) => acc.finish(duration),
            None => StageAccumulator::new().finish(duration),
        }
    }
}

/// Which stage a request sent now belongs to.
#[derive(Debug)]
struct Current {
    stage: usize,
    phase: Phase,
    /// No new request may be sent (between stages with the load stopped, or halted).
    stopped: bool,
    /// Requests sent per step (for max_requests).
    sent: Vec<u64>,
}

/// A permission to send one request, tagged with its stage.
struct Claim {
    id: u64,
    stage: usize,
    phase: Phase,
    scheduled_at: Option<f64>,
    settings: Arc<StageSettings>,
}

struct Shared {
    client: Client,
    sink: RecordSink,
    clock: Clock,
    slots: Vec<Slot>,
    settings: Vec<Option<Arc<StageSettings>>>,
    current: Mutex<Current>,
    inflight: Counter,
    next_id: AtomicU64,
    next_conversation: AtomicU64,
    consecutive_errors: AtomicU64,
    max_consecutive_errors: u64,
    abort_reason: Mutex<Option<String>>,
    /// Cancelled on interrupt or abort: stop sending.
    halt: CancellationToken,
    /// Abandons every request in flight (each slot's tokens are children) at
    /// the end of the grace period after an interrupt or abort
    /// (`abandoned_by_interrupt` is set first).
    abandon: CancellationToken,
    abandoned_by_interrupt: AtomicBool,
    tracker: TaskTracker,
    live: Option<Arc<Live>>,
    seed: u64,
    /// `max_requests` per step (0 = no limit).
    max_requests: Vec<u64>,
}

impl Shared {
    fn claim(&self, scheduled_at: Option<f64>) -> Option<Claim> {
        let mut cur = lock(&self.current);
        if cur.stopped || self.halt.is_cancelled() {
            return None;
        }
        let stage = cur.stage;
        let settings = self.settings.get(stage)?.clone()?;
        let mut phase = cur.phase;
        if phase != Phase::Hold {
            cur.sent[stage] += 1;
            let max = self.max_requests.get(stage).copied().unwrap_or(0);
            if max > 0 {
                if cur.sent[stage] == max {
                    self.slots[stage].limit_reached.notify_one();
                } else if cur.sent[stage] > max {
                    phase = Phase::Hold;
                }
            }
            if phase != Phase::Hold {
                self.slots[stage].inflight.up();
            }
        }
        self.inflight.up();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        drop(cur);
        if let Some(live) = &self.live {
            live.sent.fetch_add(1, Ordering::Relaxed);
        }
        Some(Claim {
            id,
            stage,
            phase,
            scheduled_at,
            settings,
        })
    }

    /// What abandons a request: its stage's drain running out (or the
    /// hold's, for held load), or the end of the run. (Borrowed, not cloned
    /// per request: a token's clone and drop each take its lock.)
    fn abandon_token(&self, claim: &Claim) -> &CancellationToken {
        let slot = &self.slots[claim.stage];
        match claim.phase {
            Phase::Hold => &slot.hold_cut,
            Phase::Measured | Phase::Warmup => &slot.cut,
        }
    }

    /// Records an open-loop arrival that found `max_inflight` requests in flight.
    async fn record_drop(&self, scheduled_at: f64) {
        let (stage, phase) = {
            let cur = lock(&self.current);
            if cur.stopped {
                return;
            }
            (cur.stage, cur.phase)
        };
        let record = RequestRecord {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            conversation: self.next_conversation.fetch_add(1, Ordering::Relaxed),
            turn: 1,
            stage,
            phase,
            status: Status::Dropped,
            scheduled_at: Some(scheduled_at),
            sent_at: None,
            first_token_at: None,
            end_at: None,
            ttft_s: None,
            e2e_s: None,
            itl_s: Vec::new(),
            chunk_tokens: Vec::new(),
            prompt_tokens: None,
            output_tokens: None,
            output_tokens_source: None,
            prompt_chars: 0,
            finish_reason: None,
            response_id: None,
            http_status: None,
            error: Some("max_inflight requests in flight: arrival dropped".into()),
            client_lag_s: None,
            resent: false,
            client_error: false,
        };
        if phase != Phase::Hold {
            self.slots[stage].add(&record);
        }
        if let Some(live) = &self.live {
            live.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.sink.send(record).await;
    }

    fn new_conversation(&self, settings: &StageSettings) -> Conversation {
        let id = self.next_conversation.fetch_add(1, Ordering::Relaxed);
        let salt = match &settings.cache_salt {
            None => None,
            Some(CacheSalt::Fixed(s)) => Some(s.clone()),
            Some(CacheSalt::Random) => Some(format!(
                "{:016x}",
                crate::workload::mix(self.seed ^ 0x5a17, id, 0)
            )),
        };
        Conversation {
            id,
            turn: 0,
            messages: Vec::new(),
            salt,
        }
    }

    /// Sends one turn of `conv` and records it; says how it ended.
    async fn run_turn(&self, claim: Claim, conv: &mut Conversation) -> Turn {
        let s = &claim.settings;
        conv.turn += 1;
        let chars = if conv.turn == 1 {
            s.first_chars
        } else {
            s.later_chars
        };
        let text = s.prompts.text(conv.id, conv.turn, chars);
        let prompt_chars = text.len();
        conv.messages.push(Message {
            role: "user",
            content: text,
        });
        let keep_reply = conv.turn < s.turns;
        let spec = RequestSpec {
            target: &s.target,
            endpoint: &s.endpoint,
            model: &s.model,
            messages: &conv.messages,
            max_tokens: s.osl,
            cache_salt: conv.salt.as_deref(),
            keep_reply,
        };
        let before = Instant::now();
        let (outcome, abandoned) = tokio::select! {
            biased;
            outcome = self.client.send(&spec) => (outcome, false),
            _ = self.abandon_token(&claim).cancelled() => (Outcome::default(), true),
        };
        let mut outcome = outcome;
        let record = self.make_record(&claim, conv, prompt_chars, &mut outcome, abandoned, before);
        let turn = match record.status {
            Status::Ok => Turn::Ok,
            Status::Failed | Status::Rejected => Turn::Failed {
                retry_after: outcome.retry_after,
            },
            Status::Cancelled | Status::Late | Status::Dropped => Turn::Abandoned,
        };
        if matches!(turn, Turn::Ok) && keep_reply {
            conv.messages.push(Message {
                role: "assistant",
                content: outcome.reply,
            });
        }
        self.finish(claim, record).await;
        turn
    }

    fn make_record(
        &self,
        claim: &Claim,
        conv: &Conversation,
        prompt_chars: usize,
        o: &mut Outcome,
        abandoned: bool,
        before: Instant,
    ) -> RequestRecord {
        let status = if abandoned {
            if self.abandoned_by_interrupt.load(Ordering::SeqCst) {
                Status::Cancelled
            } else {
                Status::Late
            }
        } else if o.ok {
            Status::Ok
        } else if o.rejected() {
            Status::Rejected
        } else {
            Status::Failed
        };
        let sent = o.sent.unwrap_or(before);
        let end = o.end.unwrap_or_else(Instant::now);
        let (output_tokens, source) = match o.usage.and_then(|u| u.completion_tokens) {
            Some(n) => (Some(n), Some(TokenSource::Usage)),
            None if o.chunks_with_text > 0 || o.ok => {
                (Some(o.chunks_with_text), Some(TokenSource::Chunks))
            }
            None => (None, None),
        };
        RequestRecord {
            id: claim.id,
            conversation: conv.id,
            turn: conv.turn,
            stage: claim.stage,
            phase: claim.phase,
            status,
            scheduled_at: claim.scheduled_at,
            sent_at: Some(self.clock.unix(sent)),
            first_token_at: o.first_token.map(|t| self.clock.unix(t)),
            end_at: Some(self.clock.unix(end)),
            ttft_s: o.first_token.map(|t| t.duration_since(sent).as_secs_f64()),
            e2e_s: Some(end.duration_since(sent).as_secs_f64()),
            itl_s: std::mem::take(&mut o.itl),
            chunk_tokens: std::mem::take(&mut o.chunk_tokens),
            prompt_tokens: o.usage.and_then(|u| u.prompt_tokens),
            output_tokens,
            output_tokens_source: source,
            prompt_chars,
            finish_reason: o.finish_reason.clone(),
            response_id: o.response_id.take(),
            http_status: o.http_status,
            error: match status {
                Status::Cancelled => {
                    Some("cancelled: still in flight when the run was interrupted".into())
                }
                Status::Late => Some(
                    "late: still in flight when the drain time ran out (--drain-timeout); \
                     abandoned so that the run could go on"
                        .into(),
                ),
                _ => o.error.take(),
            },
            client_lag_s: o.lag.map(|lag| lag.as_secs_f64()),
            resent: o.resent,
            client_error: o.client_side,
        }
    }

    /// Accounts a finished request: statistics, error streak, record, in-flight counters.
    async fn finish(&self, claim: Claim, record: RequestRecord) {
        let counted = claim.phase != Phase::Hold;
        if counted {
            self.slots[claim.stage].add(&record);
        }
        match record.status {
            Status::Ok => self.consecutive_errors.store(0, Ordering::Relaxed),
            Status::Failed => {
                let n = self.consecutive_errors.fetch_add(1, Ordering::Relaxed) + 1;
                if self.max_consecutive_errors > 0 && n >= self.max_consecutive_errors {
                    let mut reason = lock(&self.abort_reason);
                    if reason.is_none() && !self.halt.is_cancelled() {
                        let msg = format!(
                            "{n} consecutive failed requests (--max-consecutive-errors {}); last error: {}{}",
                            self.max_consecutive_errors,
                            record.error.as_deref().unwrap_or("unknown"),
                            if record.client_error {
                                " (the client's own failure, not the server's: give it more \
                                 open files with ulimit -n, or fewer streams)"
                            } else {
                                ""
                            }
                        );
                        tracing::error!("aborting the run: {msg}");
                        *reason = Some(msg);
                        self.halt.cancel();
                    }
                }
            }
            // A busy server, an abandoned or a dropped request: not a broken server.
            Status::Rejected | Status::Late | Status::Cancelled | Status::Dropped => {}
        }
        if let Some(live) = &self.live {
            live.finished(&record);
        }
        self.sink.send(record).await;
        if counted {
            self.slots[claim.stage].inflight.down();
        }
        self.inflight.down();
    }
}

/// How a turn ended, for the stream that sent it.
enum Turn {
    Ok,
    /// Failed or rejected: the stream backs off (as long as the server's
    /// `Retry-After`, if it gave one).
    Failed {
        retry_after: Option<Duration>,
    },
    /// Late or cancelled.
    Abandoned,
}

/// A conversation's state across turns.
struct Conversation {
    id: u64,
    turn: u32,
    messages: Vec<Message>,
    salt: Option<String>,
}

/// Closed-loop streams: how many should run and how many do. A stream
/// exists only once started (no per-stream bookkeeping before): memory
/// follows the streams running, not the number configured.
#[derive(Debug, Default)]
struct StreamCount {
    target: u32,
    running: u32,
}

struct Streams {
    count: Mutex<StreamCount>,
    /// Cancelled when closed-loop load stops: wakes streams that wait.
    stop: CancellationToken,
}

impl Streams {
    /// Counts in one more stream if fewer than the target run.
    fn admit(&self) -> bool {
        let mut count = lock(&self.count);
        let admitted = count.running < count.target && !self.stop.is_cancelled();
        count.running += u32::from(admitted);
        admitted
    }

    /// Whether a running stream goes on; when not, it is counted out (under
    /// the same lock as `admit`, so a shrink-then-grow never loses a stream).
    fn keep(&self) -> bool {
        let mut count = lock(&self.count);
        let keep = count.running <= count.target && !self.stop.is_cancelled();
        if !keep {
            count.running = count.running.saturating_sub(1);
        }
        keep
    }

    /// A stream that `keep` let go on ends anyway (no request may be sent).
    fn leave(&self) {
        let mut count = lock(&self.count);
        count.running = count.running.saturating_sub(1);
    }
}

enum Level {
    Idle,
    Closed(Arc<Streams>),
    Open(CancellationToken),
}

struct Runner {
    shared: Arc<Shared>,
    level: Level,
    halt: CancellationToken,
}

impl Runner {
    /// Runs `fut` unless the run is halted first (then `None`).
    async fn interruptible<T>(&self, fut: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            _ = self.halt.cancelled() => None,
            v = fut => Some(v),
        }
    }

    /// Points new requests at `index` and sets the load to the stage's level.
    fn start_stage(&mut self, index: usize, stage: &Stage, phase: Phase, start: Instant) {
        {
            let mut cur = lock(&self.shared.current);
            cur.stage = index;
            cur.phase = phase;
            cur.stopped = false;
        }
        let rampup = stage.rampup_s.unwrap_or(0.0);
        match stage.mode {
            Mode::Concurrent => {
                let n = stage.concurrency.unwrap_or(1);
                if let Level::Open(stop) = &self.level {
                    stop.cancel();
                    self.level = Level::Idle;
                }
                let streams = if let Level::Closed(streams) = &self.level {
                    streams.clone()
                } else {
                    let streams = Arc::new(Streams {
                        count: Mutex::default(),
                        stop: CancellationToken::new(),
                    });
                    self.level = Level::Closed(streams.clone());
                    streams
                };
                let missing = {
                    let mut count = lock(&streams.count);
                    count.target = n;
                    n.saturating_sub(count.running)
                };
                if missing > 0 {
                    self.shared.tracker.spawn(start_streams(
                        self.shared.clone(),
                        streams,
                        missing,
                        start,
                        rampup,
                    ));
                }
            }
            Mode::Constant | Mode::Poisson => {
                self.stop_senders();
                let rate = stage.rate.unwrap_or(0.0);
                let schedule = if stage.mode == Mode::Constant {
                    Schedule::constant(rate, rampup)
                } else {
                    Schedule::poisson(
                        rate,
                        rampup,
                        self.shared.seed ^ (index as u64).wrapping_mul(0x9E37_79B9),
                    )
                };
                let stop = CancellationToken::new();
                self.level = Level::Open(stop.clone());
                let shared = self.shared.clone();
                self.shared.tracker.spawn(scheduler_task(
                    shared,
                    schedule,
                    start,
                    stage.max_inflight as u64,
                    stop,
                ));
            }
            // Rejected by validate().
            Mode::ConversationPool => {}
        }
    }

    /// The stage's time is over: keep its level, but tag new requests `hold`.
    fn hold(&mut self) {
        lock(&self.shared.current).phase = Phase::Hold;
    }

    fn stop_senders(&mut self) {
        match std::mem::replace(&mut self.level, Level::Idle) {
            Level::Idle => {}
            Level::Closed(streams) => {
                lock(&streams.count).target = 0;
                streams.stop.cancel();
            }
            Level::Open(stop) => stop.cancel(),
        }
    }

    /// No new request: stop every sender (in-flight requests go on).
    fn stop_load(&mut self) {
        lock(&self.shared.current).stopped = true;
        self.stop_senders();
    }
}

/// Starts `count` more closed-loop streams, staggered over the ramp-up
/// (all at once without one), each only when its time comes.
async fn start_streams(
    shared: Arc<Shared>,
    streams: Arc<Streams>,
    count: u32,
    start: Instant,
    rampup: f64,
) {
    for k in 0..count {
        let offset = rampup * f64::from(k) / f64::from(count);
        if offset > 0.0 {
            let at = tokio::time::Instant::from_std(start + secs(offset));
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = streams.stop.cancelled() => return,
                _ = shared.halt.cancelled() => return,
            }
        } else if k % 256 == 255 {
            // Thousands at once: let the started ones run meanwhile.
            tokio::task::yield_now().await;
        }
        if shared.halt.is_cancelled() || !streams.admit() {
            return;
        }
        shared
            .tracker
            .spawn(stream_task(shared.clone(), streams.clone()));
    }
}

/// One closed-loop stream: a request, and the next as soon as it ended (or
/// after a backoff when it failed), while the stream is wanted.
async fn stream_task(shared: Arc<Shared>, streams: Arc<Streams>) {
    let mut conv: Option<Conversation> = None;
    let mut backoff = Backoff::default();
    while streams.keep() {
        let Some(claim) = shared.claim(None) else {
            streams.leave();
            return;
        };
        let turns = claim.settings.turns;
        let c = conv.get_or_insert_with(|| shared.new_conversation(&claim.settings));
        let turn = shared.run_turn(claim, c).await;
        if !matches!(turn, Turn::Ok) || c.turn >= turns {
            conv = None;
        }
        match turn {
            Turn::Ok => backoff.reset(),
            Turn::Failed { retry_after } => {
                let wait = backoff.next(retry_after, rand::random());
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = streams.stop.cancelled() => {}
                    _ = shared.halt.cancelled() => {}
                }
            }
            Turn::Abandoned => {}
        }
    }
}

async fn scheduler_task(
    shared: Arc<Shared>,
    schedule: Schedule,
    start: Instant,
    max_inflight: u64,
    stop: CancellationToken,
) {
    let start = tokio::time::Instant::from_std(start);
    for offset in schedule {
        let Ok(offset) = Duration::try_from_secs_f64(offset) else {
            break;
        };
        let due = start + offset;
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = shared.halt.cancelled() => return,
            _ = tokio::time::sleep_until(due) => {}
        }
        let scheduled_at = shared.clock.unix(due.into_std());
        if max_inflight > 0 && shared.inflight.get() >= max_inflight {
            shared.record_drop(scheduled_at).await;
            continue;
        }
        let Some(claim) = shared.claim(Some(scheduled_at)) else {
            return;
        };
        let task_shared = shared.clone();
        shared.tracker.spawn(conversation_task(task_shared, claim));
    }
}

/// An open-loop arrival: one conversation, its later turns sent as soon as the previous reply is in.
async fn conversation_task(shared: Arc<Shared>, first: Claim) {
    let mut conv = shared.new_conversation(&first.settings);
    let mut claim = first;
    loop {
        let turns = claim.settings.turns;
        let turn = shared.run_turn(claim, &mut conv).await;
        if !matches!(turn, Turn::Ok) || conv.turn >= turns {
            break;
        }
        claim = match shared.claim(None) {
            Some(c) => c,
            None => break,
        };
    }
}

fn skipped(index: usize, step: &Step, reason: String) -> StageResult {
    let mut r = match step {
        Step::Stage(stage) => stage_result(index, stage, StageStatus::Skipped, None, &Clock::now()),
        Step::Barrier { drain } => barrier(index, *drain),
    };
    r.status = StageStatus::Skipped;
    r.skip_reason = Some(reason);
    r
}

fn barrier(index: usize, drain: bool) -> StageResult {
    StageResult {
        index,
        label: format!("#{index} barrier{}", if drain { " (drain)" } else { "" }),
        name: None,
        status: StageStatus::Barrier,
        mode: None,
        concurrency: None,
        rate: None,
        duration_s: 0.0,
        drain: Some(drain),
        start_unix: None,
        end_unix: None,
        client: None,
        detail: None,
        annotation: None,
        skip_reason: None,
        check_interrupted: false,
    }
}

fn stage_result(
    index: usize,
    stage: &Stage,
    status: StageStatus,
    times: Option<(Instant, Instant)>,
    clock: &Clock,
) -> StageResult {
    StageResult {
        index,
        label: stage.label(index),
        name: stage.name.clone(),
        status,
        mode: Some(stage.mode),
        concurrency: stage.concurrency,
        rate: stage.rate,
        duration_s: stage.duration_s,
        drain: None,
        start_unix: times.map(|(s, _)| clock.unix(s)),
        end_unix: times.map(|(_, e)| clock.unix(e)),
        client: None,
        detail: None,
        annotation: None,
        skip_reason: None,
        check_interrupted: false,
    }
}
