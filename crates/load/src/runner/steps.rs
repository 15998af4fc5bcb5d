//! The scenario's steps in order: each stage at its level for its time,
//! its requests drained, its statistics taken and the hook asked; warm-up
//! stages, barriers, and the steps a stop or a halt skips.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nyann_model::{ClientStats, Scenario, Stage, Step};

use crate::hook::{FinishedStage, HookDecision, StageHook};
use crate::lock;
use crate::record::Phase;
use crate::result::{StageResult, StageStatus};
use crate::runner::RunOptions;
use crate::runner::load::Load;
use crate::runner::results::{barrier, skipped, stage_result};
use crate::runner::secs;
use crate::runner::state::Shared;
use crate::runner::sweeps::Stops;
use crate::stats::StageDetail;

/// What running the steps left for the wind-down.
pub(super) struct Ran<A> {
    /// One per step run or skipped so far (a halt leaves the rest out).
    pub(super) results: Vec<StageResult<A>>,
    pub(super) stops: Stops,
    /// The stage that was running when the run was halted.
    pub(super) interrupted: Option<usize>,
    /// Seconds of measured stages whose statistics are complete.
    pub(super) measured_seconds: f64,
}

/// Runs `fut` unless the run is halted first (then `None`).
pub(super) async fn interruptible<T>(shared: &Shared, fut: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        biased;
        _ = shared.halt.cancelled() => None,
        v = fut => Some(v),
    }
}

/// Runs every step until the end or a halt (interrupt, abort).
pub(super) async fn run_steps<H: StageHook>(
    scenario: &Scenario,
    shared: &Arc<Shared>,
    load: &mut Load,
    options: &RunOptions,
    hook: &mut H,
) -> Ran<H::Annotation> {
    let steps = &scenario.steps;
    let mut ran = Ran {
        results: Vec::with_capacity(steps.len()),
        stops: Stops::default(),
        interrupted: None,
        measured_seconds: 0.0,
    };
    for (index, step) in steps.iter().enumerate() {
        if shared.halt.is_cancelled() {
            ran.results.push(skipped(
                index,
                step,
                shared.halted_reason(&options.interrupt),
            ));
            continue;
        }
        if let Some(reason) = ran.stops.skips(step) {
            ran.results.push(skipped(index, step, reason.to_string()));
            continue;
        }
        let stage = match step {
            Step::Barrier { drain } => {
                if *drain {
                    load.stop();
                    interruptible(shared, drain_all(shared, options.drain_timeout)).await;
                }
                ran.results.push(barrier(index, *drain));
                continue;
            }
            Step::Stage(stage) => stage,
        };
        // Several workers start a stage when their coordinator says so.
        if interruptible(shared, hook.before_stage(index))
            .await
            .is_none()
        {
            ran.results.push(skipped(
                index,
                step,
                shared.halted_reason(&options.interrupt),
            ));
            continue;
        }
        let more = steps[index + 1..]
            .iter()
            .any(|later| matches!(later, Step::Stage(_)) && ran.stops.skips(later).is_none());
        if !run_stage(index, stage, more, shared, load, options, hook, &mut ran).await {
            break;
        }
    }
    ran
}

/// One stage, from its start to the hook's answer; false when the run was
/// halted meanwhile (the stage is recorded interrupted).
#[allow(clippy::too_many_arguments)]
async fn run_stage<H: StageHook>(
    index: usize,
    stage: &Stage,
    more: bool,
    shared: &Arc<Shared>,
    load: &mut Load,
    options: &RunOptions,
    hook: &mut H,
    ran: &mut Ran<H::Annotation>,
) -> bool {
    let label = stage.label(index);
    let phase = if stage.warmup {
        Phase::Warmup
    } else {
        Phase::Measured
    };
    let start = Instant::now();
    load.start_stage(index, stage, phase, start);
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
    let finished = interruptible(shared, stage_done).await.is_some();
    let end = Instant::now();
    let result = |status| stage_result(index, stage, status, Some((start, end)), &shared.clock);
    // Every request sent in a measured stage has to end (or be cut, late)
    // before its statistics exist.
    let drained = finished && {
        if more {
            load.hold();
        } else {
            load.stop();
        }
        stage.warmup
            || interruptible(
                shared,
                drain_stage(shared, index, &label, options.drain_timeout),
            )
            .await
            .is_some()
    };
    if !drained {
        ran.interrupted = Some(index);
        ran.results.push(result(StageStatus::Interrupted));
        return false;
    }
    if stage.warmup {
        ran.results.push(result(StageStatus::Warmup));
        return true;
    }
    let duration = end.duration_since(start).as_secs_f64();
    ran.measured_seconds += duration;
    let (client_stats, detail) = shared.slots[index].finish(duration);
    let stats = shared.slots[index].snapshot();
    log_stage_end(&label, &client_stats, &detail);
    let mut result = result(StageStatus::Measured);
    result.client = Some(client_stats.clone());
    result.detail = Some(detail.clone());
    let done = FinishedStage {
        index,
        stage,
        label: &label,
        start_unix: shared.clock.unix(start),
        end_unix: shared.clock.unix(end),
        client: &client_stats,
        detail: &detail,
        stats: &stats,
        history: &ran.results,
    };
    let Some(outcome) = interruptible(shared, hook.after_stage(&done)).await else {
        tracing::warn!("stage {label}: interrupted during its check");
        result.check_interrupted = true;
        ran.results.push(result);
        return false;
    };
    result.annotation = outcome.annotation;
    ran.results.push(result);
    if let HookDecision::Stop { reason } = outcome.decision {
        let what = match stage.sweep() {
            Some(sweep) if sweep > 0 => format!("sweep {sweep}"),
            _ => "the sweep".to_string(),
        };
        tracing::info!("stage {label}: {what} stops here: {reason}");
        load.stop();
        ran.stops.stop(
            index,
            stage.sweep(),
            format!("stopped after stage {label}: {reason}"),
        );
    }
    true
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
            "stage {label}: {} request(s) still in flight when the drain time ({}) after the \
             stage ran out: recorded as late; the next stage starts",
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
pub(super) async fn drain_all(shared: &Shared, drain: Duration) {
    if tokio::time::timeout(drain, shared.inflight.wait_zero())
        .await
        .is_err()
    {
        tracing::warn!(
            "{} request(s) still in flight when the drain time ({}) after the load stopped \
             ran out: recorded as late",
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
