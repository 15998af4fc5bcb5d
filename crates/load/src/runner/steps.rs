//! The scenario's steps in order: each stage at its level for its time,
//! its requests drained, its statistics taken and the hook asked; warm-up
//! stages, barriers, and the steps a stop or a halt skips.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nyann_model::{CapacitySearch, ClientStats, Scenario, Stage, Step};

use crate::hook::{FinishedStage, HookDecision, NextSearch, StageHook};
use crate::lock;
use crate::record::Phase;
use crate::result::SearchStage;
use crate::result::{StageResult, StageStatus};
use crate::runner::RunOptions;
use crate::runner::load::Load;
use crate::runner::results::{barrier, skipped, stage_result};
use crate::runner::search::{Bounds, Search, Vote, highest_below, level};
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
    /// The capacity searches' stages, in the order they ran.
    pub(super) searched: Vec<StageResult<A>>,
}

/// How a stage ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StageEnd {
    /// The hook let the run go on (or the stage was not judged).
    Clean,
    /// The hook stopped the stage's sweep: its level was too much.
    Congested,
    /// The hook stopped the stage's sweep without judging its level (a
    /// failed policy call): no capacity is searched from it.
    Failed,
    /// The run was halted during the stage (recorded interrupted).
    Halted,
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
            searched: Vec::new(),
        },
        next_slot: steps.len(),
        last_margin: None,
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
        let search = stage.stop.as_ref().and_then(|stop| stop.search);
        match (runner.stage(index, stage, more, None).await, search) {
            (StageEnd::Halted, _) => break,
            (StageEnd::Congested, Some(search)) if !runner.search(index, stage, search).await => {
                break;
            }
            _ => {}
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
    /// The next capacity-search stage's index (past the steps).
    next_slot: usize,
    /// The margin of the last verdict the hook gave (for `confirm=`).
    last_margin: Option<f64>,
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

    /// Records a stage's result: a step's, or a search stage's; and
    /// rewrites the run directory's `stages.json` with the stages so far,
    /// so that a running run can be watched (a run service's page, a
    /// `report` of a run that died). The run's end writes the whole file.
    fn record(&mut self, result: StageResult<H::Annotation>) {
        if result.search.is_some() {
            self.ran.searched.push(result);
        } else {
            self.ran.results.push(result);
        }
        if let Some(dir) = &self.options.output_dir {
            let so_far: Vec<_> = self.ran.results.iter().chain(&self.ran.searched).collect();
            if let Err(error) = nyann_results::RunDir::at(dir).write_stages(&so_far) {
                tracing::warn!(
                    "cannot write the stages so far into {}: {error}",
                    dir.display()
                );
            }
        }
    }

    /// One stage, from its start to the hook's answer (a halted stage is
    /// recorded interrupted). `more`: whether a later stage will run (the
    /// streams are then held, not stopped, at the end). `refines`: a
    /// capacity-search stage, and the sweep stage it refines.
    async fn stage(
        &mut self,
        index: usize,
        stage: &Stage,
        more: bool,
        refines: Option<usize>,
    ) -> StageEnd {
        let label = stage.label(index);
        let shared = self.shared;
        let start = Instant::now();
        let finished = self.load_for_its_time(index, stage, &label, start).await;
        let end = Instant::now();
        let result = |status| {
            let mut result = stage_result(index, stage, status, Some((start, end)), &shared.clock);
            result.search = refines.map(|refines| SearchStage { refines });
            result
        };
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
            self.record(result(StageStatus::Interrupted));
            return StageEnd::Halted;
        }
        if stage.warmup {
            self.record(result(StageStatus::Warmup));
            return StageEnd::Clean;
        }
        let duration = end.duration_since(start).as_secs_f64();
        self.ran.measured_seconds += duration;
        let (client, detail) = shared.slots[index].finish(duration);
        log_stage_end(&label, &client, &detail, stage.concurrency);
        let measured = Measured {
            result: result(StageStatus::Measured),
            client,
            detail,
        };
        self.judge(index, stage, &label, measured, refines).await
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
        let limited = lock(&shared.current).max_requests(index) > 0;
        let stage_done = async {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = limit, if limited => {}
            }
        };
        interruptible(shared, stage_done).await.is_some()
    }

    /// Asks the hook about a measured stage and records the stage with its
    /// answer: its annotation, and a stop of the stage's sweep (a search
    /// stage's sweep has stopped already).
    async fn judge(
        &mut self,
        index: usize,
        stage: &Stage,
        label: &str,
        measured: Measured<H::Annotation>,
        refines: Option<usize>,
    ) -> StageEnd {
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
            refines,
        };
        let outcome = interruptible(shared, self.hook.after_stage(&done)).await;
        result.client = Some(client);
        result.detail = Some(detail);
        let Some(outcome) = outcome else {
            tracing::warn!("stage {label}: interrupted during its check");
            result.check_interrupted = true;
            self.record(result);
            return StageEnd::Halted;
        };
        result.annotation = outcome.annotation;
        self.last_margin = outcome.margin;
        self.record(result);
        let HookDecision::Stop { reason } = outcome.decision else {
            return StageEnd::Clean;
        };
        let end = if outcome.congested {
            StageEnd::Congested
        } else {
            StageEnd::Failed
        };
        self.load.stop();
        if refines.is_some() {
            tracing::info!("search stage {label}: {reason}");
            return end;
        }
        let what = match stage.sweep() {
            Some(sweep) if sweep > 0 => format!("sweep {sweep}"),
            _ => "the sweep".to_string(),
        };
        tracing::info!("stage {label}: {what} stops here: {reason}");
        self.ran.stops.stop(
            index,
            stage.sweep(),
            format!("stopped after stage {label}: {reason}"),
        );
        end
    }

    /// The capacity search after stage `index` (`stage`) stopped its sweep:
    /// stages shaped like it between the highest level of the sweep judged
    /// not congested and the lowest judged congested. False when the run
    /// was halted meanwhile.
    async fn search(&mut self, index: usize, stage: &Stage, search: CapacitySearch) -> bool {
        let Some(congested) = level(stage) else {
            return true;
        };
        let streams = stage.concurrency.is_some();
        let measured = self
            .ran
            .results
            .iter()
            .filter(|r| r.sweep == stage.sweep() && r.status == StageStatus::Measured)
            .filter_map(|r| r.concurrency.map(f64::from).or(r.rate));
        let clean = highest_below(measured, congested);
        let bounds = Bounds::new(clean, congested, streams, search.resolution);
        let mut search = Search::new(bounds, search.stages, search.confirm);
        let mut judged = true;
        let first = self.ran.searched.len();
        loop {
            let slot = self.next_slot;
            if slot >= self.shared.slots.len() {
                break;
            }
            // The requests the previous stage left end first: this run's
            // queue on the server is then gone, and a lower level is not
            // judged on it.
            self.load.stop();
            let drain = drain_all(self.shared, self.options.drain_timeout);
            if interruptible(self.shared, drain).await.is_none() {
                return false;
            }
            let next = NextSearch {
                slot,
                refines: index,
                like: stage,
                level: search.next().filter(|_| judged),
            };
            let Some(at) = interruptible(self.shared, self.hook.before_search(&next)).await else {
                return false;
            };
            let Some(at) = at else { break };
            self.next_slot += 1;
            lock(&self.shared.current).prepare_search(slot, index, at.max_requests);
            match self.stage(slot, &at, false, Some(index)).await {
                StageEnd::Halted => return false,
                // A level that could not be judged bounds nothing: the
                // search ends with what it knows.
                StageEnd::Failed => judged = false,
                end => {
                    if let Some(level) = level(&at) {
                        let vote = Vote {
                            congested: end == StageEnd::Congested,
                            margin: self.last_margin,
                        };
                        search.judged(level, vote);
                    }
                }
            }
        }
        let bounds = search.bounds;
        // This process's levels (a fleet's leader runs its share of the
        // fleet's): the run's conclusion says the capacity.
        tracing::debug!(
            "capacity search after stage {}: {} stage(s); this process's highest level not congested {}, lowest congested {}",
            stage.label(index),
            self.ran.searched.len() - first,
            bounds.clean.map_or("none".to_string(), |l| l.to_string()),
            bounds.congested
        );
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
fn log_stage_end(
    label: &str,
    client: &ClientStats,
    detail: &StageDetail,
    concurrency: Option<u32>,
) {
    tracing::info!(
        "stage {label}: ended: {} ok, {} errors, {} rejected, {:.1} req/s, TTFT p50 {:.0} ms, p99 {:.0} ms",
        client.requests_ok,
        client.requests_failed,
        client.requests_rejected,
        client.requests_per_second,
        client.ttft_p50_seconds * 1000.0,
        client.ttft_p99_seconds * 1000.0,
    );
    if let Some(warning) = crate::stats::client_warning(client, detail, concurrency) {
        tracing::warn!("stage {label}: {warning}");
    }
}
