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
    let mut runner = Runner {
        shared,
        load,
        options,
        hook,
        ran: Ran {
            results: Vec::with_capacity(steps.len()),
            stops: Stops::default(),
            interrupted: None,
            measured_seconds: 0.0,
        },
    };
    for (index, step) in steps.iter().enumerate() {
        if shared.halt.is_cancelled() {
            runner.skip(index, step);
            continue;
        }
        if let Some(reason) = runner.ran.stops.skips(step) {
            runner
                .ran
                .results
                .push(skipped(index, step, reason.to_string()));
            continue;
        }
        let stage = match step {
            Step::Barrier { drain } => {
                runner.barrier(index, *drain).await;
                continue;
            }
            Step::Stage(stage) => stage,
        };
        // Several workers start a stage when their coordinator says so.
        if interruptible(shared, runner.hook.before_stage(index))
            .await
            .is_none()
        {
            runner.skip(index, step);
            continue;
        }
        let more = steps[index + 1..].iter().any(|later| {
            matches!(later, Step::Stage(_)) && runner.ran.stops.skips(later).is_none()
        });
        if !runner.stage(index, stage, more).await {
            break;
        }
    }
    runner.ran
}

/// A measured stage's result, before the hook's answer, and its statistics.
struct Measured<A> {
    result: StageResult<A>,
    client: ClientStats,
    detail: StageDetail,
}

/// What the steps run with, and what they left so far.
struct Runner<'a, H: StageHook> {
    shared: &'a Arc<Shared>,
    load: &'a mut Load,
    options: &'a RunOptions,
    hook: &'a mut H,
    ran: Ran<H::Annotation>,
}

impl<H: StageHook> Runner<'_, H> {
    /// Step `index` is not run: the run was halted.
    fn skip(&mut self, index: usize, step: &Step) {
        let reason = self.shared.halted_reason(&self.options.interrupt);
        self.ran.results.push(skipped(index, step, reason));
    }

    /// A barrier; with `drain`, until no request is in flight.
    async fn barrier(&mut self, index: usize, drain: bool) {
        if drain {
            self.load.stop();
            interruptible(
                self.shared,
                drain_all(self.shared, self.options.drain_timeout),
            )
            .await;
        }
        self.ran.results.push(barrier(index, drain));
    }

    /// One stage, from its start to the hook's answer; false when the run
    /// was halted meanwhile (the stage is recorded interrupted). `more`:
    /// whether a later stage will run (the streams are then held, not
    /// stopped, at the end).
    async fn stage(&mut self, index: usize, stage: &Stage, more: bool) -> bool {
        let label = stage.label(index);
        let shared = self.shared;
        let start = Instant::now();
        let finished = self.load_for_its_time(index, stage, &label, start).await;
        let end = Instant::now();
        let result = |status| stage_result(index, stage, status, Some((start, end)), &shared.clock);
        // Every request sent in a measured stage has to end (or be cut,
        // late) before its statistics exist.
        let drained = finished && {
            if more {
                self.load.hold();
            } else {
                self.load.stop();
            }
            stage.warmup
                || interruptible(
                    shared,
                    drain_stage(shared, index, &label, self.options.drain_timeout),
                )
                .await
                .is_some()
        };
        if !drained {
            self.ran.interrupted = Some(index);
            self.ran.results.push(result(StageStatus::Interrupted));
            return false;
        }
        if stage.warmup {
            self.ran.results.push(result(StageStatus::Warmup));
            return true;
        }
        let duration = end.duration_since(start).as_secs_f64();
        self.ran.measured_seconds += duration;
        let (client, detail) = shared.slots[index].finish(duration);
        log_stage_end(&label, &client, &detail);
        let measured = Measured {
            result: result(StageStatus::Measured),
            client,
            detail,
        };
        self.judge(index, stage, &label, measured).await
    }

    /// Sends stage `index`'s load from `start` for its duration, or until
    /// its `max_requests` were sent; false when the run was halted first.
    async fn load_for_its_time(
        &mut self,
        index: usize,
        stage: &Stage,
        label: &str,
        start: Instant,
    ) -> bool {
        let shared = self.shared;
        let phase = if stage.warmup {
            Phase::Warmup
        } else {
            Phase::Measured
        };
        self.load.start_stage(index, stage, phase, start);
        if let Some(live) = &shared.live {
            live.stage_started(index, label, stage.duration_s, stage.warmup);
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
        let deadline = tokio::time::Instant::from_std(start + secs(stage.duration_s));
        let limit = shared.slots[index].limit_reached.notified();
        let stage_done = async {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = limit, if stage.max_requests > 0 => {}
            }
        };
        interruptible(shared, stage_done).await.is_some()
    }

    /// Asks the hook about a measured stage and records the stage with its
    /// answer: its annotation, and a stop of the stage's sweep. False when
    /// the run was halted during the check.
    async fn judge(
        &mut self,
        index: usize,
        stage: &Stage,
        label: &str,
        measured: Measured<H::Annotation>,
    ) -> bool {
        let shared = self.shared;
        let Measured {
            mut result,
            client,
            detail,
        } = measured;
        let stats = shared.slots[index].snapshot();
        let done = FinishedStage {
            index,
            stage,
            label,
            start_unix: result.start_unix.unwrap_or_default(),
            end_unix: result.end_unix.unwrap_or_default(),
            client: &client,
            detail: &detail,
            stats: &stats,
            history: &self.ran.results,
        };
        let outcome = interruptible(shared, self.hook.after_stage(&done)).await;
        result.client = Some(client);
        result.detail = Some(detail);
        let Some(outcome) = outcome else {
            tracing::warn!("stage {label}: interrupted during its check");
            result.check_interrupted = true;
            self.ran.results.push(result);
            return false;
        };
        result.annotation = outcome.annotation;
        self.ran.results.push(result);
        if let HookDecision::Stop { reason } = outcome.decision {
            let what = match stage.sweep() {
                Some(sweep) if sweep > 0 => format!("sweep {sweep}"),
                _ => "the sweep".to_string(),
            };
            tracing::info!("stage {label}: {what} stops here: {reason}");
            self.load.stop();
            self.ran.stops.stop(
                index,
                stage.sweep(),
                format!("stopped after stage {label}: {reason}"),
            );
        }
        true
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
