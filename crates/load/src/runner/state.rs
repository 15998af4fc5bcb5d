//! What the runner's tasks share while load runs: which stage a request
//! sent now belongs to, per-stage bookkeeping (statistics, requests in
//! flight, the tokens that abandon them), the error streak that aborts a
//! run, and where finished requests go.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nyann_model::{ClientStats, Scenario, Slo, Step};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::Client;
use crate::live::Live;
use crate::lock;
use crate::record::{Phase, RecordSink, RequestRecord, Status};
use crate::runner::pool::Pool;
use crate::runner::prepare::StageSettings;
use crate::stats::{StageAccumulator, StageDetail};

use std::sync::Arc;

/// Unix time of `Instant`s, from one reading of both clocks at the run start.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    instant: Instant,
    pub(super) unix_start: f64,
}

impl Clock {
    pub(super) fn now() -> Self {
        let unix_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Clock {
            instant: Instant::now(),
            unix_start,
        }
    }

    pub(super) fn unix(&self, t: Instant) -> f64 {
        match t.checked_duration_since(self.instant) {
            Some(d) => self.unix_start + d.as_secs_f64(),
            None => self.unix_start - self.instant.duration_since(t).as_secs_f64(),
        }
    }
}

/// An in-flight counter that can be awaited down to zero.
#[derive(Debug, Default)]
pub(super) struct Counter {
    value: AtomicU64,
    zero: Notify,
}

impl Counter {
    pub(super) fn up(&self) {
        self.value.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn down(&self) {
        if self.value.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.zero.notify_waiters();
        }
    }

    pub(super) fn get(&self) -> u64 {
        self.value.load(Ordering::SeqCst)
    }

    pub(super) async fn wait_zero(&self) {
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
pub(super) struct Slot {
    acc: Mutex<Option<StageAccumulator>>,
    /// Requests sent in this stage and not yet recorded.
    pub(super) inflight: Counter,
    pub(super) limit_reached: Notify,
    /// Cancelled when the stage's drain time ran out: abandons its requests.
    pub(super) cut: CancellationToken,
    /// The same for the requests sent at the stage's level after its end.
    pub(super) hold_cut: CancellationToken,
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

    pub(super) fn e2e_p99(&self) -> f64 {
        lock(&self.acc)
            .as_ref()
            .map_or(0.0, StageAccumulator::e2e_p99)
    }

    /// The accumulator is created on first use: skipped stages cost no
    /// histogram memory. `slo`: the goals the record was judged by.
    fn add(&self, record: &RequestRecord, slo: Option<Slo>) {
        let mut acc = lock(&self.acc);
        let acc = acc.get_or_insert_with(StageAccumulator::new);
        if let Some(goals) = slo {
            acc.judged_by(goals);
        }
        acc.add(record);
    }

    pub(super) fn merge_into(&self, total: &mut StageAccumulator) {
        if let Some(acc) = lock(&self.acc).as_ref() {
            total.merge(acc);
        }
    }

    /// A copy of the stage's histograms (for merging with other workers').
    pub(super) fn snapshot(&self) -> StageAccumulator {
        lock(&self.acc).clone().unwrap_or_default()
    }

    pub(super) fn finish(&self, duration: f64) -> (ClientStats, StageDetail) {
        match lock(&self.acc).as_ref() {
            Some(acc) => acc.finish(duration),
            None => StageAccumulator::new().finish(duration),
        }
    }
}

/// Which stage a request sent now belongs to, and how many each stage sent.
#[derive(Debug)]
pub(super) struct Current {
    pub(super) stage: usize,
    pub(super) phase: Phase,
    /// No new request may be sent (between stages with the load stopped, or halted).
    pub(super) stopped: bool,
    /// The conversation pool of the running `conversation_pool` stage.
    pub(super) pool: Option<Arc<Pool>>,
    /// Requests sent per stage (for max_requests): the steps', then the
    /// capacity-search stages'.
    sent: Vec<u64>,
    /// `max_requests` per stage (0 = no limit).
    max_requests: Vec<u64>,
    /// What the requests of each stage are (workload, target, model); a
    /// search stage's are set when it starts.
    settings: Vec<Option<Arc<StageSettings>>>,
}

/// What [`Current::count_send`] decided for one request.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Counted {
    /// `hold` when the stage already sent its `max_requests`.
    pub(super) phase: Phase,
    /// This request is the stage's last one by `max_requests`: the stage ends.
    pub(super) reached_limit: bool,
}

impl Current {
    /// The steps of `scenario` with their `settings`, then `search_slots`
    /// stages for capacity searches.
    pub(super) fn new(
        scenario: &Scenario,
        mut settings: Vec<Option<Arc<StageSettings>>>,
        search_slots: usize,
    ) -> Self {
        // An eval stage asks each question once unless told otherwise.
        let mut max_requests: Vec<u64> = scenario
            .steps
            .iter()
            .enumerate()
            .map(|(index, step)| match step {
                Step::Stage(stage) if stage.max_requests > 0 => stage.max_requests,
                Step::Stage(_) => settings
                    .get(index)
                    .and_then(Option::as_ref)
                    .and_then(|s| s.prompts.eval_questions())
                    .map_or(0, |questions| questions as u64),
                Step::Barrier { .. } => 0,
            })
            .collect();
        let stages = max_requests.len() + search_slots;
        max_requests.resize(stages, 0);
        settings.resize(stages, None);
        Current {
            stage: 0,
            phase: Phase::Hold,
            stopped: true,
            pool: None,
            sent: vec![0; stages],
            max_requests,
            settings,
        }
    }

    /// Stage `stage`'s `max_requests` (0: no limit).
    pub(super) fn max_requests(&self, stage: usize) -> u64 {
        self.max_requests.get(stage).copied().unwrap_or(0)
    }

    /// Search stage `slot` sends what stage `like` sent, up to `max_requests`.
    pub(super) fn prepare_search(&mut self, slot: usize, like: usize, max_requests: u64) {
        let settings = self.settings.get(like).cloned().flatten();
        // As `like`'s own (an eval stage's default is its dataset's size).
        let max_requests = match max_requests {
            0 => self.max_requests(like),
            given => given,
        };
        if let (Some(to), Some(max)) =
            (self.settings.get_mut(slot), self.max_requests.get_mut(slot))
        {
            *to = settings;
            *max = max_requests;
        }
    }

    /// Counts one request sent now: the phase it is recorded with, and
    /// whether it is the stage's last by `max_requests` (those sent beyond
    /// that hold the level and count nowhere).
    pub(super) fn count_send(&mut self) -> Counted {
        let stage = self.stage;
        if self.phase == Phase::Hold {
            return Counted {
                phase: Phase::Hold,
                reached_limit: false,
            };
        }
        self.sent[stage] += 1;
        let max = self.max_requests[stage];
        let sent = self.sent[stage];
        Counted {
            phase: if max > 0 && sent > max {
                Phase::Hold
            } else {
                self.phase
            },
            reached_limit: max > 0 && sent == max,
        }
    }
}

/// A permission to send one request, tagged with its stage.
pub(super) struct Claim {
    pub(super) id: u64,
    pub(super) stage: usize,
    pub(super) phase: Phase,
    pub(super) scheduled_at: Option<f64>,
    pub(super) settings: Arc<StageSettings>,
    /// In a `conversation_pool` stage: the pool to take the conversation from.
    pub(super) pool: Option<Arc<Pool>>,
}

/// The state every task of a run shares.
pub(super) struct Shared {
    pub(super) client: Client,
    pub(super) sink: RecordSink,
    pub(super) clock: Clock,
    /// Per stage: the steps', then the capacity-search stages'.
    pub(super) slots: Vec<Slot>,
    pub(super) current: Mutex<Current>,
    pub(super) inflight: Counter,
    next_id: AtomicU64,
    pub(super) next_conversation: AtomicU64,
    /// Conversations that replayed a recorded one already sent (its
    /// dataset ran out and started over).
    pub(super) repeats: AtomicU64,
    consecutive_errors: AtomicU64,
    max_consecutive_errors: u64,
    pub(super) abort_reason: Mutex<Option<String>>,
    /// Cancelled on interrupt or abort: stop sending.
    pub(super) halt: CancellationToken,
    /// Abandons every request in flight (each slot's tokens are children) at
    /// the end of the grace period after an interrupt or abort
    /// (`abandoned_by_interrupt` is set first).
    abandon: CancellationToken,
    pub(super) abandoned_by_interrupt: AtomicBool,
    pub(super) tracker: TaskTracker,
    pub(super) live: Option<Arc<Live>>,
    pub(super) seed: u64,
}

/// What [`Shared::new`] takes besides the scenario.
pub(super) struct SharedParts {
    pub(super) client: Client,
    pub(super) sink: RecordSink,
    pub(super) settings: Vec<Option<Arc<StageSettings>>>,
    /// Stages capacity searches may add after the steps.
    pub(super) search_slots: usize,
    pub(super) max_consecutive_errors: u32,
    pub(super) halt: CancellationToken,
    pub(super) live: Option<Arc<Live>>,
    pub(super) seed: u64,
    /// See [`RunOptions::first_id`](crate::RunOptions::first_id).
    pub(super) first_id: u64,
}

impl Shared {
    pub(super) fn new(scenario: &Scenario, parts: SharedParts) -> Self {
        let abandon = CancellationToken::new();
        Shared {
            client: parts.client,
            sink: parts.sink,
            clock: Clock::now(),
            slots: (0..scenario.steps.len() + parts.search_slots)
                .map(|_| Slot::new(&abandon))
                .collect(),
            current: Mutex::new(Current::new(scenario, parts.settings, parts.search_slots)),
            inflight: Counter::default(),
            next_id: AtomicU64::new(parts.first_id),
            next_conversation: AtomicU64::new(parts.first_id),
            repeats: AtomicU64::new(0),
            consecutive_errors: AtomicU64::new(0),
            max_consecutive_errors: u64::from(parts.max_consecutive_errors),
            abort_reason: Mutex::new(None),
            halt: parts.halt,
            abandon,
            abandoned_by_interrupt: AtomicBool::new(false),
            tracker: TaskTracker::new(),
            live: parts.live,
            seed: parts.seed,
        }
    }

    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A permission to send one request now, unless the load is stopped.
    pub(super) fn claim(&self, scheduled_at: Option<f64>) -> Option<Claim> {
        let mut cur = lock(&self.current);
        if cur.stopped || self.halt.is_cancelled() {
            return None;
        }
        let stage = cur.stage;
        let settings = cur.settings.get(stage)?.clone()?;
        let counted = cur.count_send();
        if counted.reached_limit {
            self.slots[stage].limit_reached.notify_one();
        }
        if counted.phase != Phase::Hold {
            self.slots[stage].inflight.up();
        }
        self.inflight.up();
        let id = self.next_id();
        let pool = cur.pool.clone();
        drop(cur);
        if let Some(live) = &self.live {
            live.sent.fetch_add(1, Ordering::Relaxed);
        }
        Some(Claim {
            id,
            stage,
            phase: counted.phase,
            scheduled_at,
            settings,
            pool,
        })
    }

    /// What abandons a request: its stage's drain running out (or the
    /// hold's, for held load), or the end of the run. (Borrowed, not cloned
    /// per request: a token's clone and drop each take its lock.)
    pub(super) fn abandon_token(&self, claim: &Claim) -> &CancellationToken {
        let slot = &self.slots[claim.stage];
        match claim.phase {
            Phase::Hold => &slot.hold_cut,
            Phase::Measured | Phase::Warmup => &slot.cut,
        }
    }

    /// After the grace period: every request still in flight is cancelled.
    pub(super) fn abandon_all(&self) {
        self.abandoned_by_interrupt.store(true, Ordering::SeqCst);
        self.abandon.cancel();
    }

    /// Records an open-loop arrival that found `max_inflight` requests in flight.
    pub(super) async fn record_drop(&self, scheduled_at: f64) {
        let (stage, phase, slo) = {
            let cur = lock(&self.current);
            if cur.stopped {
                return;
            }
            let slo = cur.settings.get(cur.stage).cloned().flatten();
            (cur.stage, cur.phase, slo.and_then(|s| s.slo))
        };
        let mut record = RequestRecord::dropped(
            self.next_id(),
            self.next_conversation.fetch_add(1, Ordering::Relaxed),
            stage,
            phase,
            scheduled_at,
        );
        crate::goodput::judge(&mut record, slo.as_ref());
        if phase != Phase::Hold {
            self.slots[stage].add(&record, slo);
        }
        if let Some(live) = &self.live {
            live.dropped.fetch_add(1, Ordering::Relaxed);
            live.judged(&record);
        }
        self.sink.send(record).await;
    }

    /// Accounts a finished request: statistics, error streak, record, in-flight counters.
    ///
    /// All but handing a full record buffer to the writer is done when this
    /// is called: the future keeps neither the claim nor the record.
    pub(super) fn finish(
        &self,
        claim: Claim,
        record: RequestRecord,
    ) -> impl Future<Output = ()> + Send + '_ {
        let counted = claim.phase != Phase::Hold;
        if counted {
            self.slots[claim.stage].add(&record, claim.settings.slo);
        }
        self.count_error_streak(&record);
        if let Some(live) = &self.live {
            live.finished(&record);
        }
        let recorded = self.sink.send(record);
        let stage = claim.stage;
        async move {
            recorded.await;
            if counted {
                self.slots[stage].inflight.down();
            }
            self.inflight.down();
        }
    }

    /// Aborts the run after `max_consecutive_errors` failures in a row.
    fn count_error_streak(&self, record: &RequestRecord) {
        match record.status {
            Status::Ok => self.consecutive_errors.store(0, Ordering::Relaxed),
            Status::Failed => {
                let n = self.consecutive_errors.fetch_add(1, Ordering::Relaxed) + 1;
                if self.max_consecutive_errors > 0 && n >= self.max_consecutive_errors {
                    self.abort(format!(
                        "{n} consecutive failed requests (at most {} allowed in a row); last error: {}{}",
                        self.max_consecutive_errors,
                        record.error.as_deref().unwrap_or("unknown"),
                        if record.client_error {
                            " (the client's own failure, not the server's: give it more \
                             open files with ulimit -n, or fewer streams)"
                        } else {
                            ""
                        }
                    ));
                }
            }
            // A busy server, an abandoned or a dropped request: not a broken server.
            Status::Rejected | Status::Late | Status::Cancelled | Status::Dropped => {}
        }
    }

    /// Aborts the run for `reason`, unless it is halted already.
    pub(super) fn abort(&self, reason: String) {
        let mut held = lock(&self.abort_reason);
        if held.is_none() && !self.halt.is_cancelled() {
            tracing::error!("aborting the run: {reason}");
            *held = Some(reason);
            self.halt.cancel();
        }
    }

    /// Why steps were not run after a halt.
    pub(super) fn halted_reason(&self, interrupt: &CancellationToken) -> String {
        if interrupt.is_cancelled() {
            "interrupted".into()
        } else {
            match lock(&self.abort_reason).as_ref() {
                Some(reason) => format!("aborted: {reason}"),
                None => "aborted".into(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_model::{Mode, Stage, Workload};

    fn scenario(max_requests: u64) -> Scenario {
        Scenario {
            target: None,
            model: None,
            workload: Workload::default(),
            steps: vec![
                Step::Stage(Stage {
                    max_requests,
                    ..Stage::new(1.0, Mode::Concurrent)
                }),
                Step::Barrier { drain: false },
            ],
        }
    }

    #[test]
    fn max_requests_ends_the_stage_at_its_last_request_and_holds_beyond() {
        let mut cur = Current::new(&scenario(2), Vec::new(), 0);
        cur.phase = Phase::Measured;
        let first = cur.count_send();
        assert_eq!((first.phase, first.reached_limit), (Phase::Measured, false));
        let second = cur.count_send();
        assert_eq!(
            (second.phase, second.reached_limit),
            (Phase::Measured, true)
        );
        let third = cur.count_send();
        assert_eq!((third.phase, third.reached_limit), (Phase::Hold, false));
    }

    #[test]
    fn held_requests_count_toward_no_stage() {
        let mut cur = Current::new(&scenario(1), Vec::new(), 0);
        assert_eq!(cur.count_send().phase, Phase::Hold);
        cur.phase = Phase::Warmup;
        let first = cur.count_send();
        assert_eq!((first.phase, first.reached_limit), (Phase::Warmup, true));
    }

    #[test]
    fn without_max_requests_a_stage_never_reaches_a_limit() {
        let mut cur = Current::new(&scenario(0), Vec::new(), 0);
        cur.phase = Phase::Measured;
        for _ in 0..1000 {
            assert_eq!(
                cur.count_send(),
                Counted {
                    phase: Phase::Measured,
                    reached_limit: false
                }
            );
        }
    }

    #[test]
    fn the_clock_dates_instants_before_and_after_its_start() {
        let clock = Clock::now();
        let later = clock.instant + std::time::Duration::from_millis(1500);
        assert!((clock.unix(later) - clock.unix_start - 1.5).abs() < 1e-9);
        if let Some(earlier) = clock
            .instant
            .checked_sub(std::time::Duration::from_millis(500))
        {
            assert!((clock.unix_start - clock.unix(earlier) - 0.5).abs() < 1e-9);
        }
    }
}
