//! Live counters of a running load, read by the progress display (and the
//! client metrics): cheap atomics updated by request tasks.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::record::{RequestRecord, Status};

/// Shared between the runner (writes) and displays (read [`Live::snapshot`]).
#[derive(Debug)]
pub struct Live {
    pub sent: AtomicU64,
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    pub dropped: AtomicU64,
    pub cancelled: AtomicU64,
    pub rejected: AtomicU64,
    pub late: AtomicU64,
    /// Eval replies scored since the start, and how many were right or
    /// gave no answer.
    pub eval: EvalCounters,
    /// Requests judged against their stage's SLO since the start.
    pub slo: SloCounters,
    /// Client-side latency histograms (Prometheus buckets) since the start.
    pub ttft: Buckets,
    pub itl: Buckets,
    pub e2e: Buckets,
    /// The histograms cost a few atomic operations per chunk: only kept when served.
    histograms: AtomicBool,
    stage: Mutex<StageView>,
}

/// Eval replies scored: every one, the right ones, the unanswerable ones
/// (wrong, with no answer found).
#[derive(Debug, Default)]
pub struct EvalCounters {
    pub scored: AtomicU64,
    pub correct: AtomicU64,
    pub unanswerable: AtomicU64,
}

impl EvalCounters {
    fn count(&self, record: &RequestRecord, correct: bool) {
        self.scored.fetch_add(1, Ordering::Relaxed);
        if correct {
            self.correct.fetch_add(1, Ordering::Relaxed);
        } else if record.eval_extracted.is_none() {
            self.unanswerable.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Requests judged against an SLO: every one, those that met every goal,
/// and those that missed each goal (in the order of `Objective::ALL`).
#[derive(Debug, Default)]
pub struct SloCounters {
    pub judged: AtomicU64,
    pub met: AtomicU64,
    pub missed: [AtomicU64; 3],
}

/// A Prometheus-style cumulative histogram with fixed bounds and atomic counts.
#[derive(Debug)]
pub struct Buckets {
    pub bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Buckets {
    fn new(bounds: &'static [f64]) -> Self {
        Buckets {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        // Non-cumulative per bucket; `snapshot` accumulates.
        if let Some(i) = self.bounds.iter().position(|&b| seconds <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Cumulative counts per bound, then the sum (seconds) and the total count.
    pub fn snapshot(&self) -> (Vec<u64>, f64, u64) {
        let mut running = 0;
        let cumulative = self
            .counts
            .iter()
            .map(|c| {
                running += c.load(Ordering::Relaxed);
                running
            })
            .collect();
        (
            cumulative,
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            self.count.load(Ordering::Relaxed),
        )
    }
}

/// vLLM's bucket bounds for the same quantities (with finer low ends), so
/// client and server histograms can be compared side by side.
const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
];
const E2E_BOUNDS: &[f64] = &[
    0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
];

#[derive(Debug)]
struct StageView {
    index: Option<usize>,
    label: String,
    warmup: bool,
    duration_s: f64,
    started: Instant,
    ok_before: u64,
    failed_before: u64,
    /// Eval replies of this stage's requests scored so far, and the right
    /// ones (not those of the stage before, still finishing).
    eval_scored: u64,
    eval_correct: u64,
    /// This stage's requests judged against its SLO so far, and those that met it.
    slo_judged: u64,
    slo_met: u64,
    /// TTFT of the current stage's successful requests, in microseconds.
    ttft: Option<Histogram<u64>>,
}

/// One reading of the live counters.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveSnapshot {
    /// The stage currently running (or the last one), if any started.
    pub stage_index: Option<usize>,
    pub label: String,
    pub warmup: bool,
    pub duration_s: f64,
    pub elapsed_s: f64,
    /// Since the stage started (hold requests included).
    pub stage_ok: u64,
    pub stage_failed: u64,
    pub in_flight: u64,
    pub dropped: u64,
    pub ttft_p50_s: f64,
    /// Eval replies scored in this stage, and how many were right.
    pub stage_eval_scored: u64,
    pub stage_eval_correct: u64,
    /// Requests of this stage judged against its SLO, and those that met it.
    pub stage_slo_judged: u64,
    pub stage_slo_met: u64,
}

impl Default for Live {
    fn default() -> Self {
        Self::new()
    }
}

impl Live {
    pub fn new() -> Self {
        Live {
            sent: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            late: AtomicU64::new(0),
            eval: EvalCounters::default(),
            slo: SloCounters::default(),
            ttft: Buckets::new(TTFT_BOUNDS),
            itl: Buckets::new(ITL_BOUNDS),
            e2e: Buckets::new(E2E_BOUNDS),
            histograms: AtomicBool::new(false),
            stage: Mutex::new(StageView {
                index: None,
                label: String::new(),
                warmup: false,
                duration_s: 0.0,
                started: Instant::now(),
                ok_before: 0,
                failed_before: 0,
                eval_scored: 0,
                eval_correct: 0,
                slo_judged: 0,
                slo_met: 0,
                ttft: None,
            }),
        }
    }

    fn view(&self) -> std::sync::MutexGuard<'_, StageView> {
        crate::lock(&self.stage)
    }

    pub(crate) fn stage_started(&self, index: usize, label: &str, duration_s: f64, warmup: bool) {
        let mut v = self.view();
        v.index = Some(index);
        v.label = label.to_owned();
        v.warmup = warmup;
        v.duration_s = duration_s;
        v.started = Instant::now();
        v.ok_before = self.ok.load(Ordering::Relaxed);
        v.failed_before = self.failed.load(Ordering::Relaxed);
        v.eval_scored = 0;
        v.eval_correct = 0;
        v.slo_judged = 0;
        v.slo_met = 0;
        v.ttft = Histogram::new_with_bounds(1, 3_600_000_000, 2).ok();
    }

    /// Counts `record`'s SLO verdict, if it has one (every status, drops included).
    pub(crate) fn judged(&self, record: &RequestRecord) {
        let Some(met) = record.slo_met else { return };
        // `met` before `judged`, as the eval counters: a reader never sees
        // more requests met than judged.
        if met {
            self.slo.met.fetch_add(1, Ordering::Relaxed);
        }
        self.slo.judged.fetch_add(1, Ordering::Relaxed);
        for objective in &record.slo_missed {
            self.slo.missed[objective.index()].fetch_add(1, Ordering::Relaxed);
        }
        let mut v = self.view();
        if v.index == Some(record.stage) {
            v.slo_judged += 1;
            v.slo_met += u64::from(met);
        }
    }

    pub(crate) fn finished(&self, record: &RequestRecord) {
        self.judged(record);
        match record.status {
            Status::Ok => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                if let Some(correct) = record.eval_correct {
                    self.eval.count(record, correct);
                    let mut v = self.view();
                    if v.index == Some(record.stage) {
                        v.eval_scored += 1;
                        v.eval_correct += u64::from(correct);
                    }
                }
                if self.histograms.load(Ordering::Relaxed) {
                    if let Some(ttft) = record.ttft_s {
                        self.ttft.observe(ttft);
                    }
                    if let Some(e2e) = record.e2e_s {
                        self.e2e.observe(e2e);
                    }
                    for &gap in &record.itl_s {
                        self.itl.observe(gap);
                    }
                }
                if let Some(ttft) = record.ttft_s
                    && let Some(h) = self.view().ttft.as_mut()
                {
                    h.saturating_record(((ttft * 1e6) as u64).max(1));
                }
            }
            Status::Failed => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
            Status::Cancelled => {
                self.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            Status::Rejected => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
            }
            Status::Late => {
                self.late.fetch_add(1, Ordering::Relaxed);
            }
            Status::Dropped => {}
        }
    }

    /// Starts filling the latency histograms (the metrics endpoint does).
    pub fn enable_histograms(&self) {
        self.histograms.store(true, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> LiveSnapshot {
        let v = self.view();
        let ok = self.ok.load(Ordering::Relaxed);
        let failed = self.failed.load(Ordering::Relaxed);
        let ended = self.cancelled.load(Ordering::Relaxed)
            + self.rejected.load(Ordering::Relaxed)
            + self.late.load(Ordering::Relaxed);
        let sent = self.sent.load(Ordering::Relaxed);
        LiveSnapshot {
            stage_index: v.index,
            label: v.label.clone(),
            warmup: v.warmup,
            duration_s: v.duration_s,
            elapsed_s: v.started.elapsed().as_secs_f64(),
            stage_ok: ok.saturating_sub(v.ok_before),
            stage_failed: failed.saturating_sub(v.failed_before),
            in_flight: sent.saturating_sub(ok + failed + ended),
            dropped: self.dropped.load(Ordering::Relaxed),
            ttft_p50_s: v
                .ttft
                .as_ref()
                .filter(|h| !h.is_empty())
                .map(|h| h.value_at_quantile(0.5) as f64 / 1e6)
                .unwrap_or(0.0),
            stage_eval_scored: v.eval_scored,
            stage_eval_correct: v.eval_correct,
            stage_slo_judged: v.slo_judged,
            stage_slo_met: v.slo_met,
        }
    }
}
