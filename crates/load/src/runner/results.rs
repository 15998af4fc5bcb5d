//! The results of the steps: one [`StageResult`] per step, the statistics
//! of the stages whose requests ended only at the wind-down (warm-up and
//! interrupted stages), the totals and why the run ended.

use std::time::Instant;

use nyann_model::{ClientStats, Stage, Step};
use tokio_util::sync::CancellationToken;

use crate::lock;
use crate::result::{RunOutcome, StageResult, StageStatus};
use crate::runner::state::{Clock, Shared};
use crate::runner::sweeps::Stops;
use crate::stats::{StageAccumulator, StageDetail};

/// A step that did not run, and why.
pub(super) fn skipped<A>(index: usize, step: &Step, reason: String) -> StageResult<A> {
    let mut r = match step {
        Step::Stage(stage) => stage_result(index, stage, StageStatus::Skipped, None, &Clock::now()),
        Step::Barrier { drain } => barrier(index, *drain),
    };
    r.status = StageStatus::Skipped;
    r.skip_reason = Some(reason);
    r
}

pub(super) fn barrier<A>(index: usize, drain: bool) -> StageResult<A> {
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
        sweep: None,
        start_unix: None,
        end_unix: None,
        client: None,
        detail: None,
        annotation: None,
        skip_reason: None,
        check_interrupted: false,
        degraded: None,
        search: None,
    }
}

pub(super) fn stage_result<A>(
    index: usize,
    stage: &Stage,
    status: StageStatus,
    times: Option<(Instant, Instant)>,
    clock: &Clock,
) -> StageResult<A> {
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
        sweep: stage.sweep(),
        start_unix: times.map(|(s, _)| clock.unix(s)),
        end_unix: times.map(|(_, e)| clock.unix(e)),
        client: None,
        detail: None,
        annotation: None,
        skip_reason: None,
        check_interrupted: false,
        degraded: None,
        search: None,
    }
}

/// The statistics of warm-up stages and of the interrupted one, now that
/// their requests ended; returns the interrupted stage's seconds (it counts
/// in the totals).
pub(super) fn late_statistics<A>(
    results: &mut [StageResult<A>],
    interrupted: Option<usize>,
    shared: &Shared,
) -> f64 {
    let mut interrupted_seconds = 0.0;
    for result in results.iter_mut() {
        if result.status == StageStatus::Warmup || Some(result.index) == interrupted {
            let duration = match (result.start_unix, result.end_unix) {
                (Some(s), Some(e)) => e - s,
                _ => 0.0,
            };
            if result.status == StageStatus::Interrupted {
                interrupted_seconds += duration;
            }
            let (c, d) = shared.slots[result.index].finish(duration);
            result.client = Some(c);
            result.detail = Some(d);
        }
    }
    interrupted_seconds
}

/// The measured (and interrupted) stages' statistics merged.
pub(super) fn totals<A>(
    results: &[StageResult<A>],
    shared: &Shared,
    seconds: f64,
) -> (ClientStats, StageDetail) {
    let mut acc = StageAccumulator::new();
    for result in results {
        if matches!(
            result.status,
            StageStatus::Measured | StageStatus::Interrupted
        ) {
            shared.slots[result.index].merge_into(&mut acc);
        }
    }
    acc.finish(seconds)
}

/// Why the run ended: an interrupt, else an abort, else the stops (every
/// sweep's, in order), else it completed.
pub(super) fn outcome(interrupt: &CancellationToken, shared: &Shared, stops: Stops) -> RunOutcome {
    if interrupt.is_cancelled() {
        return RunOutcome::Interrupted;
    }
    if let Some(reason) = lock(&shared.abort_reason).clone() {
        return RunOutcome::Aborted { reason };
    }
    stopped(stops).unwrap_or(RunOutcome::Completed)
}

/// The stops as one outcome: the last stopping stage, and every reason.
fn stopped(stops: Stops) -> Option<RunOutcome> {
    let (stage, _) = stops.all.last()?;
    let stage = *stage;
    let reason = stops
        .all
        .into_iter()
        .map(|(_, reason)| reason)
        .collect::<Vec<_>>()
        .join("; ");
    Some(RunOutcome::Stopped { stage, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_stops_are_one_outcome_naming_each() {
        assert_eq!(stopped(Stops::default()), None);
        let mut stops = Stops::default();
        stops.stop(2, Some(0), "stopped after stage a: congested".into());
        stops.stop(6, Some(1), "stopped after stage b: congested".into());
        assert_eq!(
            stopped(stops),
            Some(RunOutcome::Stopped {
                stage: 6,
                reason: "stopped after stage a: congested; stopped after stage b: congested".into()
            })
        );
    }

    #[test]
    fn a_skipped_stage_keeps_its_settings_and_sweep() {
        let stage = nyann_model::Stage {
            concurrency: Some(4),
            stop: Some(nyann_model::StopCondition {
                params: Vec::new(),
                location: None,
                param_locations: Vec::new(),
                search: None,
            }),
            sweep: 1,
            ..nyann_model::Stage::new(2.0, nyann_model::Mode::Concurrent)
        };
        let r: StageResult = skipped(3, &Step::Stage(stage), "why".into());
        assert_eq!(
            (r.status, r.concurrency, r.sweep, r.skip_reason.as_deref()),
            (StageStatus::Skipped, Some(4), Some(1), Some("why"))
        );
        let b: StageResult = skipped(4, &Step::Barrier { drain: true }, "why".into());
        assert_eq!(
            (b.status, b.drain, b.sweep),
            (StageStatus::Skipped, Some(true), None)
        );
    }
}
