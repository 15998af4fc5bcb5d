//! Per-stage aggregation of request records into client statistics, and
//! what those say about the client itself ([`client_warning`]).
//!
//! Latencies go into HdrHistograms at microsecond resolution with three
//! significant digits (quantiles within 0.1%), so memory stays fixed however
//! many requests and chunks a stage sees.
//!
//! A [`StageAccumulator`] serializes as its exact counters plus, per
//! histogram, the `[value, count]` pairs of its non-empty buckets: a
//! deserialized copy merges with others into exactly the histogram one
//! process would have built from all their records (counts exact, quantiles
//! within the same 0.1%).

use std::time::Duration;

use hdrhistogram::Histogram;
use nyann_model::{ClientStats, EvalStats};
use serde::{Deserialize, Serialize};

use crate::goodput::SloCounts;
use crate::record::{RequestRecord, Status};

/// Longest latency recorded exactly (1 hour); longer values are clamped.
const MAX_MICROS: u64 = 3_600_000_000;

/// The figures of one stage beyond [`ClientStats`] (the tables and summary use them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StageDetail {
    /// Requests sent in the stage (ok + failed + rejected + late + cancelled).
    pub sent: u64,
    pub cancelled: u64,
    /// Open-loop arrivals not sent because `max_inflight` requests were in flight.
    pub dropped: u64,
    /// Failed requests whose failure was the client's own (out of file
    /// descriptors, local ports...).
    #[serde(default)]
    pub client_errors: u64,
    pub output_tokens: u64,
    pub ttft_mean_seconds: f64,
    pub ttft_p90_seconds: f64,
    /// Absent from files written before it existed: read as 0.
    #[serde(default)]
    pub itl_p90_seconds: f64,
    pub e2e_mean_seconds: f64,
    #[serde(default)]
    pub e2e_p90_seconds: f64,
    /// Over requests: the longest a read of the response came after its
    /// bytes had arrived (0 without kernel receive timestamps).
    #[serde(default)]
    pub client_lag_p50_seconds: f64,
    #[serde(default)]
    pub client_lag_p99_seconds: f64,
    /// TTFT of first turns and of later turns (a later turn's prompt starts
    /// with the conversation so far: where prefix caching shows), and how
    /// many later turns succeeded (0 for single-turn workloads).
    #[serde(default)]
    pub first_turn_ttft_p50_seconds: f64,
    #[serde(default)]
    pub first_turn_ttft_p99_seconds: f64,
    #[serde(default)]
    pub later_turns_ok: u64,
    #[serde(default)]
    pub later_turn_ttft_p50_seconds: f64,
    #[serde(default)]
    pub later_turn_ttft_p99_seconds: f64,
    /// Share of prompt tokens the server's prefix cache served, over the
    /// successful requests whose usage said (`cached_tokens`): absent when
    /// none did (vLLM without `--enable-prompt-tokens-details`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_prompt_share: Option<f64>,
}

/// Client lag p99 above which a stage may warn that the client fell behind
/// (when it is also more than [`CLIENT_LAG_SHARE`] of a request's E2E p50).
pub const CLIENT_LAG_WARNING: Duration = Duration::from_millis(10);
/// The share of a request's E2E p50 a lag must exceed to be warned about.
pub const CLIENT_LAG_SHARE: f64 = 0.1;

/// A closed loop that kept this share of its streams in flight on average
/// held its load.
pub const HELD_SHARE: f64 = 0.95;

/// Why a stage's figures may say more about the client than the server.
/// `concurrency` is the stage's closed-loop level, if it is one: a closed
/// loop that held its streams in flight (by Little's law, requests/s times
/// the mean E2E) is not falling behind, however late it read.
pub fn client_warning(
    client: &ClientStats,
    detail: &StageDetail,
    concurrency: Option<u32>,
) -> Option<String> {
    if detail.client_errors > 0 && detail.client_errors * 2 >= client.requests_failed {
        return Some(format!(
            "{} of its {} errors were the client's own (out of open files, local ports or \
             buffers): the client is the cause, not the server; give it more open files \
             (ulimit -n) or fewer streams",
            detail.client_errors, client.requests_failed
        ));
    }
    // A late read costs a closed-loop stream that long before its next
    // request: it matters against what a request takes, not in itself (a
    // busy box reads a few ms late, kernel timestamps keep the latencies
    // right). Warn when it is both long and a real share of a request.
    let lag = detail.client_lag_p99_seconds;
    let request = client.e2e_p50_seconds;
    let held = concurrency.is_some_and(|c| {
        client.requests_per_second * detail.e2e_mean_seconds >= HELD_SHARE * f64::from(c)
    });
    if !held && lag > CLIENT_LAG_WARNING.as_secs_f64() && lag > CLIENT_LAG_SHARE * request {
        return Some(format!(
            "the client is falling behind: it read responses up to {:.0} ms after they arrived \
             (p99), {:.0}% of a request's E2E p50 ({:.0} ms), so it may not have held the \
             configured load (its latencies are still right): use more workers or cores",
            lag * 1000.0,
            100.0 * lag / request.max(f64::MIN_POSITIVE),
            request * 1000.0
        ));
    }
    None
}

/// How long `record` waited for its first token: its TTFT; without a first
/// token, the time from sending to its end (a timeout, a cut stream, a
/// request abandoned late or cancelled), unless the server answered with an
/// error status or the failure was the client's own (no wait on the server).
fn first_token_wait(record: &RequestRecord) -> Option<f64> {
    if record.ttft_s.is_some() {
        return record.ttft_s;
    }
    let answered_error = record.http_status.is_some_and(|s| s >= 400);
    if answered_error || record.client_error || record.status == Status::Dropped {
        return None;
    }
    record.e2e_s
}

/// Accumulates the records of one stage.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(into = "WireAccumulator", from = "WireAccumulator")]
pub struct StageAccumulator {
    ok: u64,
    failed: u64,
    rejected: u64,
    late: u64,
    cancelled: u64,
    dropped: u64,
    client_errors: u64,
    output_tokens: u64,
    cached: CachedTokens,
    ttft: Histogram<u64>,
    /// The TTFT of first turns and of later turns.
    first_ttft: Histogram<u64>,
    later_ttft: Histogram<u64>,
    itl: Histogram<u64>,
    e2e: Histogram<u64>,
    client_lag: Histogram<u64>,
    /// The longest any request waited for its first token (µs), see
    /// [`first_token_wait`].
    longest_first_token_wait: u64,
    eval: EvalCounts,
    slo: SloCounts,
}

/// The scored replies of eval requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
struct EvalCounts {
    answered: u64,
    correct: u64,
    unanswerable: u64,
}

impl EvalCounts {
    fn add(&mut self, record: &RequestRecord) {
        let Some(correct) = record.eval_correct else {
            return;
        };
        self.answered += 1;
        self.correct += u64::from(correct);
        self.unanswerable += u64::from(record.eval_extracted.is_none());
    }

    /// Workers' counts, added; saturating (a worker's counts come over the
    /// network, and an overflow must not wrap to a small count).
    fn merge(&mut self, other: EvalCounts) {
        self.answered = self.answered.saturating_add(other.answered);
        self.correct = self.correct.saturating_add(other.correct);
        self.unanswerable = self.unanswerable.saturating_add(other.unanswerable);
    }
}

impl Default for StageAccumulator {
    fn default() -> Self {
        Self::new()
    }
}

/// Sums over the successful requests that reported `cached_tokens`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct CachedTokens {
    cached: u64,
    prompt: u64,
}

impl CachedTokens {
    fn add(&mut self, record: &RequestRecord) {
        if let (Some(cached), Some(prompt)) = (record.cached_tokens, record.prompt_tokens) {
            self.cached += cached;
            self.prompt += prompt;
        }
    }

    fn merge(&mut self, other: CachedTokens) {
        self.cached += other.cached;
        self.prompt += other.prompt;
    }

    fn share(&self) -> Option<f64> {
        (self.prompt > 0).then(|| self.cached as f64 / self.prompt as f64)
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 h with 3 significant digits: the bounds are valid constants.
    #[allow(clippy::expect_used)]
    Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("valid histogram bounds")
}

/// The serialized form of a [`StageAccumulator`].
#[derive(Serialize, Deserialize)]
struct WireAccumulator {
    ok: u64,
    failed: u64,
    rejected: u64,
    late: u64,
    cancelled: u64,
    dropped: u64,
    client_errors: u64,
    output_tokens: u64,
    /// `[microseconds, count]` per non-empty bucket.
    ttft: Vec<(u64, u64)>,
    itl: Vec<(u64, u64)>,
    e2e: Vec<(u64, u64)>,
    client_lag: Vec<(u64, u64)>,
    /// TTFT of first and of later turns (conversation_pool); absent from
    /// messages of builds before the pool.
    #[serde(default)]
    first_ttft: Vec<(u64, u64)>,
    #[serde(default)]
    later_ttft: Vec<(u64, u64)>,
    /// Absent from messages of builds before it.
    #[serde(default)]
    cached: CachedTokens,
    /// Microseconds; absent from messages of builds before it.
    #[serde(default)]
    longest_first_token_wait: u64,
    #[serde(default)]
    eval: EvalCounts,
    /// Absent from messages of builds before SLOs.
    #[serde(default)]
    slo: SloCounts,
}

fn buckets(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

fn from_buckets(buckets: &[(u64, u64)]) -> Histogram<u64> {
    let mut h = histogram();
    for &(value, count) in buckets {
        // Out-of-range values (a hand-made message) clamp like recorded ones.
        let _ = h.record_n(value.clamp(1, MAX_MICROS), count);
    }
    h
}

impl From<StageAccumulator> for WireAccumulator {
    fn from(a: StageAccumulator) -> Self {
        WireAccumulator {
            ok: a.ok,
            failed: a.failed,
            rejected: a.rejected,
            late: a.late,
            cancelled: a.cancelled,
            dropped: a.dropped,
            client_errors: a.client_errors,
            output_tokens: a.output_tokens,
            cached: a.cached,
            ttft: buckets(&a.ttft),
            itl: buckets(&a.itl),
            e2e: buckets(&a.e2e),
            client_lag: buckets(&a.client_lag),
            first_ttft: buckets(&a.first_ttft),
            later_ttft: buckets(&a.later_ttft),
            longest_first_token_wait: a.longest_first_token_wait,
            eval: a.eval,
            slo: a.slo,
        }
    }
}

impl From<WireAccumulator> for StageAccumulator {
    fn from(w: WireAccumulator) -> Self {
        StageAccumulator {
            ok: w.ok,
            failed: w.failed,
            rejected: w.rejected,
            late: w.late,
            cancelled: w.cancelled,
            dropped: w.dropped,
            client_errors: w.client_errors,
            output_tokens: w.output_tokens,
            cached: w.cached,
            ttft: from_buckets(&w.ttft),
            itl: from_buckets(&w.itl),
            e2e: from_buckets(&w.e2e),
            client_lag: from_buckets(&w.client_lag),
            first_ttft: from_buckets(&w.first_ttft),
            later_ttft: from_buckets(&w.later_ttft),
            longest_first_token_wait: w.longest_first_token_wait,
            eval: w.eval,
            slo: w.slo,
        }
    }
}

fn micros(seconds: f64) -> u64 {
    ((seconds * 1e6).round() as u64).clamp(1, MAX_MICROS)
}

fn quantile(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1e6
    }
}

fn mean(h: &Histogram<u64>) -> f64 {
    if h.is_empty() { 0.0 } else { h.mean() / 1e6 }
}

impl StageAccumulator {
    pub fn new() -> Self {
        StageAccumulator {
            ok: 0,
            failed: 0,
            rejected: 0,
            late: 0,
            cancelled: 0,
            dropped: 0,
            client_errors: 0,
            output_tokens: 0,
            cached: CachedTokens::default(),
            ttft: histogram(),
            first_ttft: histogram(),
            later_ttft: histogram(),
            itl: histogram(),
            e2e: histogram(),
            client_lag: histogram(),
            longest_first_token_wait: 0,
            eval: EvalCounts::default(),
            slo: SloCounts::default(),
        }
    }

    /// The SLO its records were judged by (see [`crate::goodput::judge`]):
    /// its statistics then say the stage's goodput.
    pub fn judged_by(&mut self, goals: nyann_model::Slo) {
        self.slo.judged_by(goals);
    }

    /// Adds one record. Latencies count only for successful requests.
    pub fn add(&mut self, record: &RequestRecord) {
        if let Some(wait) = first_token_wait(record) {
            self.longest_first_token_wait = self.longest_first_token_wait.max(micros(wait));
        }
        if let Some(lag) = record.client_lag_s {
            self.client_lag.saturating_record(micros(lag));
        }
        self.eval.add(record);
        self.slo.add(record);
        match record.status {
            Status::Ok => {
                self.ok += 1;
                self.output_tokens += record.output_tokens.unwrap_or(0);
                self.cached.add(record);
                if let Some(ttft) = record.ttft_s {
                    self.ttft.saturating_record(micros(ttft));
                    let by_turn = if record.turn > 1 {
                        &mut self.later_ttft
                    } else {
                        &mut self.first_ttft
                    };
                    by_turn.saturating_record(micros(ttft));
                }
                if let Some(e2e) = record.e2e_s {
                    self.e2e.saturating_record(micros(e2e));
                }
                for &gap in &record.itl_s {
                    self.itl.saturating_record(micros(gap));
                }
            }
            Status::Failed => {
                self.failed += 1;
                self.client_errors += u64::from(record.client_error);
            }
            Status::Rejected => self.rejected += 1,
            Status::Late => self.late += 1,
            Status::Cancelled => self.cancelled += 1,
            Status::Dropped => self.dropped += 1,
        }
    }

    /// Adds everything `other` accumulated (for run totals).
    pub fn merge(&mut self, other: &StageAccumulator) {
        self.eval.merge(other.eval);
        self.slo.merge(&other.slo);
        self.ok += other.ok;
        self.failed += other.failed;
        self.rejected += other.rejected;
        self.late += other.late;
        self.cancelled += other.cancelled;
        self.dropped += other.dropped;
        self.client_errors += other.client_errors;
        self.output_tokens += other.output_tokens;
        self.cached.merge(other.cached);
        // Same bounds on both sides: adding cannot fail.
        let _ = self.ttft.add(&other.ttft);
        let _ = self.first_ttft.add(&other.first_ttft);
        let _ = self.later_ttft.add(&other.later_ttft);
        let _ = self.itl.add(&other.itl);
        let _ = self.e2e.add(&other.e2e);
        let _ = self.client_lag.add(&other.client_lag);
        self.longest_first_token_wait = self
            .longest_first_token_wait
            .max(other.longest_first_token_wait);
    }

    /// The longest any request of the stage waited for its first token, in
    /// seconds (0 when none was sent): a server that produced no first token
    /// while this was long was stalled, not idle.
    pub fn longest_first_token_wait(&self) -> f64 {
        if self.longest_first_token_wait == 0 {
            0.0
        } else {
            self.longest_first_token_wait as f64 / 1e6
        }
    }

    /// Current TTFT median, for live progress.
    pub fn ttft_p50(&self) -> f64 {
        quantile(&self.ttft, 0.5)
    }

    /// Current E2E p99 (the drain time of a stage's last requests scales with it).
    pub fn e2e_p99(&self) -> f64 {
        quantile(&self.e2e, 0.99)
    }

    /// The statistics over a stage that lasted `duration_s` seconds.
    pub fn finish(&self, duration_s: f64) -> (ClientStats, StageDetail) {
        let per_second = |n: u64| {
            if duration_s > 0.0 {
                n as f64 / duration_s
            } else {
                0.0
            }
        };
        let client = ClientStats {
            requests_ok: self.ok,
            requests_failed: self.failed,
            requests_per_second: per_second(self.ok),
            output_tokens_per_second: per_second(self.output_tokens),
            ttft_p50_seconds: quantile(&self.ttft, 0.5),
            ttft_p99_seconds: quantile(&self.ttft, 0.99),
            itl_p50_seconds: quantile(&self.itl, 0.5),
            itl_p99_seconds: quantile(&self.itl, 0.99),
            e2e_p50_seconds: quantile(&self.e2e, 0.5),
            e2e_p99_seconds: quantile(&self.e2e, 0.99),
            dropped: self.dropped,
            requests_rejected: self.rejected,
            rejected_per_second: per_second(self.rejected),
            requests_late: self.late,
            eval: (self.eval.answered > 0).then(|| {
                EvalStats::of(
                    self.eval.answered,
                    self.eval.correct,
                    self.eval.unanswerable,
                )
            }),
            slo: self.slo.finish(duration_s),
        };
        let detail = StageDetail {
            sent: self.ok + self.failed + self.rejected + self.late + self.cancelled,
            cancelled: self.cancelled,
            dropped: self.dropped,
            client_errors: self.client_errors,
            output_tokens: self.output_tokens,
            ttft_mean_seconds: mean(&self.ttft),
            ttft_p90_seconds: quantile(&self.ttft, 0.9),
            itl_p90_seconds: quantile(&self.itl, 0.9),
            e2e_mean_seconds: mean(&self.e2e),
            e2e_p90_seconds: quantile(&self.e2e, 0.9),
            client_lag_p50_seconds: quantile(&self.client_lag, 0.5),
            client_lag_p99_seconds: quantile(&self.client_lag, 0.99),
            first_turn_ttft_p50_seconds: quantile(&self.first_ttft, 0.5),
            first_turn_ttft_p99_seconds: quantile(&self.first_ttft, 0.99),
            later_turns_ok: self.later_ttft.len(),
            later_turn_ttft_p50_seconds: quantile(&self.later_ttft, 0.5),
            later_turn_ttft_p99_seconds: quantile(&self.later_ttft, 0.99),
            cached_prompt_share: self.cached.share(),
        };
        (client, detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Workers' eval counts near the top of u64 saturate instead of
    /// wrapping to a small count (release builds do not check overflow).
    #[test]
    fn merged_eval_counts_saturate() {
        let mut total = EvalCounts {
            answered: u64::MAX - 1,
            correct: u64::MAX - 1,
            unanswerable: 0,
        };
        total.merge(EvalCounts {
            answered: 5,
            correct: 5,
            unanswerable: 1,
        });
        assert_eq!((total.answered, total.correct), (u64::MAX, u64::MAX));
        assert_eq!(total.unanswerable, 1);
    }

    fn record(status: Status, ttft: f64, tokens: u64) -> RequestRecord {
        RequestRecord {
            ttft_s: Some(ttft),
            e2e_s: Some(ttft * 2.0),
            itl_s: vec![0.01, 0.02],
            output_tokens: Some(tokens),
            client_lag_s: Some(0.002),
            ..RequestRecord::sample(status)
        }
    }

    /// Eval answers count like requests: exactly, through a fleet's wire
    /// form and its merge.
    #[test]
    fn eval_answers_are_counted_and_merged_exactly() {
        let scored = |extracted: Option<&str>, correct: Option<bool>| RequestRecord {
            eval_expected: Some("7".into()),
            eval_extracted: extracted.map(String::from),
            eval_correct: correct,
            ..record(Status::Ok, 0.1, 3)
        };
        let mut one = StageAccumulator::new();
        one.add(&scored(Some("7"), Some(true)));
        one.add(&scored(Some("8"), Some(false)));
        let mut other = StageAccumulator::new();
        other.add(&scored(None, Some(false)));
        other.add(&scored(Some("7"), Some(true)));
        // A failed request has no reply to score.
        other.add(&RequestRecord {
            eval_expected: Some("7".into()),
            ..record(Status::Failed, 0.1, 0)
        });
        let wire: StageAccumulator =
            serde_json::from_str(&serde_json::to_string(&other).unwrap()).unwrap();
        one.merge(&wire);
        let eval = one.finish(1.0).0.eval.unwrap();
        assert_eq!((eval.answered, eval.correct, eval.unanswerable), (4, 2, 1));
        assert_eq!(eval.accuracy, 0.5);
        assert!(eval.accuracy_low < 0.5 && eval.accuracy_high > 0.5);
        assert_eq!(StageAccumulator::new().finish(1.0).0.eval, None);
    }

    #[test]
    fn quantiles_rates_and_counts() {
        let mut acc = StageAccumulator::new();
        for i in 1..=100 {
            acc.add(&record(Status::Ok, i as f64 / 1000.0, 10));
        }
        acc.add(&record(Status::Failed, 9.0, 10));
        acc.add(&RequestRecord {
            client_error: true,
            ..record(Status::Failed, 9.0, 10)
        });
        acc.add(&record(Status::Dropped, 9.0, 10));
        for _ in 0..5 {
            acc.add(&record(Status::Rejected, 9.0, 10));
        }
        acc.add(&record(Status::Late, 9.0, 10));
        let (client, detail) = acc.finish(10.0);
        assert_eq!(client.requests_ok, 100);
        assert_eq!(client.requests_failed, 2);
        assert_eq!(detail.client_errors, 1);
        assert_eq!((client.requests_rejected, client.requests_late), (5, 1));
        assert!((client.rejected_per_second - 0.5).abs() < 1e-9);
        assert_eq!(detail.dropped, 1);
        assert_eq!(detail.sent, 108);
        assert!((detail.client_lag_p99_seconds - 0.002).abs() < 1e-5);
        assert!((client.requests_per_second - 10.0).abs() < 1e-9);
        assert!((client.output_tokens_per_second - 100.0).abs() < 1e-9);
        assert!(
            (client.ttft_p50_seconds - 0.050).abs() < 0.0001,
            "{}",
            client.ttft_p50_seconds
        );
        assert!((client.ttft_p99_seconds - 0.099).abs() < 0.0001);
        assert!((client.itl_p99_seconds - 0.02).abs() < 0.0001);
        assert!((detail.ttft_mean_seconds - 0.0505).abs() < 0.0001);
    }

    /// The cached share sums over the successful requests that reported
    /// it; with none, it is absent (not a fake 0).
    #[test]
    fn cached_prompt_share_counts_only_requests_that_reported_it() {
        let mut acc = StageAccumulator::new();
        acc.add(&RequestRecord {
            prompt_tokens: Some(100),
            ..record(Status::Ok, 0.01, 1)
        });
        assert_eq!(acc.finish(1.0).1.cached_prompt_share, None);
        for (prompt, cached, status) in [
            (100, 0, Status::Ok),
            (300, 240, Status::Ok),
            (500, 500, Status::Failed),
        ] {
            acc.add(&RequestRecord {
                prompt_tokens: Some(prompt),
                cached_tokens: Some(cached),
                ..record(status, 0.01, 1)
            });
        }
        assert_eq!(acc.finish(1.0).1.cached_prompt_share, Some(0.6));
        let wire = serde_json::to_string(&acc).unwrap();
        let back: StageAccumulator = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.finish(1.0), acc.finish(1.0));
        let detail = serde_json::to_string(&StageAccumulator::new().finish(1.0).1).unwrap();
        assert!(!detail.contains("cached_prompt_share"), "{detail}");
    }

    /// A stalled server shows in what the client waited, answered or not;
    /// an error the server answered, or the client's own failure, is no wait.
    #[test]
    fn the_longest_first_token_wait_counts_requests_never_answered() {
        let unanswered = |status, e2e: f64| RequestRecord {
            ttft_s: None,
            e2e_s: Some(e2e),
            ..record(status, 0.0, 0)
        };
        let mut acc = StageAccumulator::new();
        assert_eq!(acc.longest_first_token_wait(), 0.0);
        acc.add(&record(Status::Ok, 0.25, 1));
        acc.add(&RequestRecord {
            http_status: Some(500),
            ..unanswered(Status::Failed, 40.0)
        });
        acc.add(&RequestRecord {
            client_error: true,
            ..unanswered(Status::Failed, 50.0)
        });
        assert_eq!(acc.longest_first_token_wait(), 0.25);
        acc.add(&unanswered(Status::Late, 31.5));
        assert_eq!(acc.longest_first_token_wait(), 31.5);
        // A stream the server opened (200) and never wrote into is a wait.
        let mut other = StageAccumulator::new();
        other.add(&RequestRecord {
            http_status: Some(200),
            ..unanswered(Status::Failed, 45.0)
        });
        let wire = serde_json::to_string(&other).unwrap();
        acc.merge(&serde_json::from_str(&wire).unwrap());
        assert_eq!(acc.longest_first_token_wait(), 45.0);
    }

    /// A few ms of late reading on a busy box is no alarm: it is warned
    /// about when it is also a real share of a request (what a closed-loop
    /// stream loses before its next one), with the figures that triggered it.
    #[test]
    fn the_client_lag_warning_weighs_the_lag_against_a_request() {
        let stage = |lag: f64, e2e: f64| {
            let client = ClientStats {
                e2e_p50_seconds: e2e,
                ..ClientStats::default()
            };
            let detail = StageDetail {
                client_lag_p99_seconds: lag,
                ..StageDetail::default()
            };
            client_warning(&client, &detail, None)
        };
        // 25 ms late against requests of 400 ms (the simulator at c=4), 12 ms
        // against 3 s (a real vLLM): the load was held.
        assert_eq!(stage(0.025, 0.4), None);
        assert_eq!(stage(0.012, 3.0), None);
        // 5 ms is never a reason, whatever the requests.
        assert_eq!(stage(0.005, 0.01), None);
        let warning = stage(0.2, 0.5).unwrap();
        assert!(
            warning.contains(
                "up to 200 ms after they arrived (p99), 40% of a request's E2E p50 (500 ms)"
            ),
            "{warning}"
        );
        // The same lag in a closed loop of 4 streams that held 3.99 of
        // them in flight (7.98 req/s of 0.5 s each): no warning. Holding
        // 3 of 4 is falling behind.
        let closed = |requests_per_second: f64| {
            let client = ClientStats {
                e2e_p50_seconds: 0.5,
                requests_per_second,
                ..ClientStats::default()
            };
            let detail = StageDetail {
                client_lag_p99_seconds: 0.2,
                e2e_mean_seconds: 0.5,
                ..StageDetail::default()
            };
            client_warning(&client, &detail, Some(4))
        };
        assert_eq!(closed(7.98), None);
        assert!(closed(6.0).is_some());
    }

    #[test]
    fn empty_stage_is_all_zero() {
        let (client, _) = StageAccumulator::new().finish(0.0);
        assert_eq!(client, ClientStats::default());
    }

    /// Three workers' accumulators, each sent as JSON and merged, give
    /// exactly the statistics of one accumulator fed every record.
    #[test]
    fn serialized_accumulators_merge_into_the_whole() {
        let mut whole = StageAccumulator::new();
        let mut parts = vec![
            StageAccumulator::new(),
            StageAccumulator::new(),
            StageAccumulator::new(),
        ];
        for i in 0..3000u64 {
            let status = if i % 97 == 0 {
                Status::Failed
            } else {
                Status::Ok
            };
            let r = RequestRecord {
                itl_s: vec![(i % 13) as f64 / 1000.0, 0.003],
                client_lag_s: Some((i % 7) as f64 / 10_000.0),
                prompt_tokens: Some(50),
                cached_tokens: (i % 5 == 0).then_some(i % 40),
                ..record(status, (1 + i * 37 % 5000) as f64 / 10_000.0, i % 50)
            };
            whole.add(&r);
            parts[(i % 3) as usize].add(&r);
        }
        let mut merged = StageAccumulator::new();
        for part in &parts {
            let wire = serde_json::to_string(part).unwrap();
            let back: StageAccumulator = serde_json::from_str(&wire).unwrap();
            merged.merge(&back);
        }
        assert_eq!(merged.finish(3.0), whole.finish(3.0));
    }
}
