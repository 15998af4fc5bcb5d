//! The run's timeline for the report: per-request records binned by time,
//! so the page's size does not grow with the number of requests.
//!
//! A run is cut into at most [`MAX_BINS`] equal bins (each at least
//! [`MIN_BIN_S`] wide). Each bin keeps: requests sent, successes and errors
//! (by when they ended), the time-weighted mean of requests in flight, and
//! the TTFT p50/p90/p99 of the requests whose first token arrived in it.
//! Nothing per request survives the binning, which is how a run of 100,000
//! requests gives a report of the same size as a run of 100.

use serde::Deserialize;

/// Most bins in a run's timeline.
pub const MAX_BINS: usize = 600;
/// Narrowest bin, seconds.
pub const MIN_BIN_S: f64 = 1.0;

/// The fields of a `requests.jsonl` line the report reads (others are
/// ignored, so newer or older files read alike).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RecordLine {
    #[serde(default)]
    pub stage: usize,
    /// `ok`, `failed`, `rejected`, `late`, `dropped`, `cancelled`, or any status a later
    /// version writes: only `ok` counts as a success and `dropped` as not
    /// sent.
    #[serde(default)]
    pub status: String,
    pub sent_at: Option<f64>,
    pub first_token_at: Option<f64>,
    pub end_at: Option<f64>,
    pub ttft_s: Option<f64>,
    pub http_status: Option<u16>,
    pub error: Option<String>,
}

impl RecordLine {
    fn is_ok(&self) -> bool {
        self.status == "ok"
    }

    /// A request that was sent and did not succeed.
    pub fn is_error(&self) -> bool {
        !self.is_ok() && self.status != "dropped"
    }
}

/// One bin of the timeline.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bin {
    pub sent: u32,
    pub ok: u32,
    pub errors: u32,
    /// Time-weighted mean of requests in flight over the bin.
    pub in_flight: f64,
    /// TTFT p50, p90, p99 (seconds) of the first tokens that arrived in the
    /// bin; `None` when none did.
    pub ttft: Option<[f64; 3]>,
}

/// A run's binned timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    pub start_unix: f64,
    pub bin_s: f64,
    pub bins: Vec<Bin>,
    /// Records read (every line, dropped arrivals included).
    pub records: u64,
}

impl Timeline {
    /// Start of bin `i`, seconds since the run started.
    pub fn bin_start(&self, i: usize) -> f64 {
        i as f64 * self.bin_s
    }
}

/// Builds a [`Timeline`] from records streamed in any order.
pub struct TimelineBuilder {
    start_unix: f64,
    bin_s: f64,
    bins: Vec<Bin>,
    /// Busy seconds per bin (the integral of requests in flight).
    busy: Vec<f64>,
    ttfts: Vec<Vec<f64>>,
    records: u64,
}

impl TimelineBuilder {
    /// A timeline over `[start_unix, end_unix]`.
    pub fn new(start_unix: f64, end_unix: f64) -> Self {
        let span = (end_unix - start_unix).max(0.0);
        let bin_s = (span / MAX_BINS as f64).max(MIN_BIN_S);
        let count = ((span / bin_s).ceil() as usize).clamp(1, MAX_BINS);
        TimelineBuilder {
            start_unix,
            bin_s,
            bins: vec![Bin::default(); count],
            busy: vec![0.0; count],
            ttfts: vec![Vec::new(); count],
            records: 0,
        }
    }

    /// The bin of an instant, if it falls in the run (the last bin takes
    /// the end instant itself).
    fn bin_of(&self, unix: f64) -> Option<usize> {
        let offset = (unix - self.start_unix) / self.bin_s;
        if !offset.is_finite() || offset < 0.0 {
            return None;
        }
        let i = offset as usize;
        match i.cmp(&self.bins.len()) {
            std::cmp::Ordering::Less => Some(i),
            _ if offset <= self.bins.len() as f64 + 1e-9 => Some(self.bins.len() - 1),
            _ => None,
        }
    }

    pub fn add(&mut self, record: &RecordLine) {
        self.records += 1;
        let Some(sent) = record.sent_at.filter(|t| t.is_finite()) else {
            return;
        };
        if let Some(i) = self.bin_of(sent) {
            self.bins[i].sent += 1;
        }
        if let Some(end) = record.end_at {
            if let Some(i) = self.bin_of(end) {
                if record.is_ok() {
                    self.bins[i].ok += 1;
                } else if record.is_error() {
                    self.bins[i].errors += 1;
                }
            }
            self.add_busy(sent, end);
        }
        if let (Some(first), Some(ttft)) = (record.first_token_at, record.ttft_s)
            && record.is_ok()
            && ttft.is_finite()
            && let Some(i) = self.bin_of(first)
        {
            self.ttfts[i].push(ttft);
        }
    }

    /// Spreads the request's time in flight over the bins it overlaps.
    fn add_busy(&mut self, sent: f64, end: f64) {
        let from = (sent - self.start_unix).max(0.0);
        let to = (end - self.start_unix).min(self.bins.len() as f64 * self.bin_s);
        if to.partial_cmp(&from) != Some(std::cmp::Ordering::Greater) {
            return;
        }
        let first = (from / self.bin_s) as usize;
        let last = ((to / self.bin_s) as usize).min(self.bins.len() - 1);
        for i in first..=last {
            let (lo, hi) = (i as f64 * self.bin_s, (i + 1) as f64 * self.bin_s);
            self.busy[i] += (to.min(hi) - from.max(lo)).max(0.0);
        }
    }

    pub fn finish(mut self) -> Timeline {
        for (i, bin) in self.bins.iter_mut().enumerate() {
            bin.in_flight = self.busy[i] / self.bin_s;
            let ttfts = &mut self.ttfts[i];
            if !ttfts.is_empty() {
                ttfts.sort_by(f64::total_cmp);
                bin.ttft = Some([0.5, 0.9, 0.99].map(|q| nearest_rank(ttfts, q)));
            }
        }
        Timeline {
            start_unix: self.start_unix,
            bin_s: self.bin_s,
            bins: self.bins,
            records: self.records,
        }
    }
}

/// The nearest-rank quantile of sorted, non-empty `values`.
fn nearest_rank(values: &[f64], q: f64) -> f64 {
    let rank = (q * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Requests that did not succeed, grouped by what went wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorCount {
    pub reason: String,
    pub count: u64,
    /// Stages (indices) in which it happened, in order.
    pub stages: Vec<usize>,
}

/// Groups error records by reason (the error text, or the HTTP status or
/// the status when there is none), most frequent first.
#[derive(Debug, Default)]
pub struct ErrorTally {
    counts: Vec<ErrorCount>,
}

/// Longest reason kept: messages that differ only after it count together.
const REASON_CHARS: usize = 160;

impl ErrorTally {
    pub fn add(&mut self, record: &RecordLine) {
        if !record.is_error() {
            return;
        }
        let reason = match (&record.error, record.http_status) {
            (Some(error), _) => error.chars().take(REASON_CHARS).collect(),
            (None, Some(status)) => format!("HTTP {status}"),
            (None, None) => record.status.clone(),
        };
        let i = match self.counts.iter().position(|c| c.reason == reason) {
            Some(i) => i,
            None => {
                self.counts.push(ErrorCount {
                    reason,
                    count: 0,
                    stages: Vec::new(),
                });
                self.counts.len() - 1
            }
        };
        let entry = &mut self.counts[i];
        entry.count += 1;
        if !entry.stages.contains(&record.stage) {
            entry.stages.push(record.stage);
            entry.stages.sort_unstable();
        }
    }

    pub fn finish(mut self) -> Vec<ErrorCount> {
        self.counts
            .sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
        self.counts
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ok(sent: f64, ttft: f64, end: f64) -> RecordLine {
        RecordLine {
            status: "ok".into(),
            sent_at: Some(sent),
            first_token_at: Some(sent + ttft),
            end_at: Some(end),
            ttft_s: Some(ttft),
            ..RecordLine::default()
        }
    }

    #[test]
    fn bins_count_sends_ends_in_flight_and_ttft_quantiles() {
        let mut builder = TimelineBuilder::new(100.0, 110.0);
        // Two requests in flight for the whole of bin 0 ([100, 101)).
        builder.add(&ok(100.0, 0.1, 101.0));
        builder.add(&ok(100.0, 0.3, 101.0));
        // One failure sent in bin 2 that ended in bin 3.
        builder.add(&RecordLine {
            status: "failed".into(),
            sent_at: Some(102.5),
            end_at: Some(103.5),
            error: Some("HTTP 500".into()),
            ..RecordLine::default()
        });
        // A dropped arrival: counted as a record, never as sent.
        builder.add(&RecordLine {
            status: "dropped".into(),
            ..RecordLine::default()
        });
        let timeline = builder.finish();
        assert_eq!(timeline.bins.len(), 10);
        assert_eq!(timeline.bin_s, 1.0);
        assert_eq!(timeline.records, 4);
        let b0 = &timeline.bins[0];
        assert_eq!((b0.sent, b0.ok, b0.errors), (2, 0, 0));
        assert!((b0.in_flight - 2.0).abs() < 1e-9, "{}", b0.in_flight);
        assert_eq!(b0.ttft, Some([0.1, 0.3, 0.3]));
        // The end instant of bin 0 falls in bin 1.
        assert_eq!(timeline.bins[1].ok, 2);
        assert_eq!(timeline.bins[2].sent, 1);
        assert!((timeline.bins[2].in_flight - 0.5).abs() < 1e-9);
        assert!((timeline.bins[3].in_flight - 0.5).abs() < 1e-9);
        assert_eq!(timeline.bins[3].errors, 1);
        assert_eq!(timeline.bins[9], Bin::default());
    }

    /// The report's size bound: however long the run and however many
    /// requests, at most MAX_BINS bins.
    #[test]
    fn bins_are_bounded_however_long_and_busy_the_run() {
        let mut builder = TimelineBuilder::new(0.0, 7200.0);
        for i in 0..100_000 {
            let t = i as f64 * 0.072;
            builder.add(&ok(t, 0.05, t + 1.0));
        }
        let timeline = builder.finish();
        assert_eq!(timeline.bins.len(), MAX_BINS);
        assert_eq!(timeline.bin_s, 12.0);
        assert_eq!(
            timeline.bins.iter().map(|b| b.sent as u64).sum::<u64>(),
            100_000
        );
        // A short run keeps 1-second bins.
        assert_eq!(TimelineBuilder::new(0.0, 30.5).finish().bins.len(), 31);
        // An empty or inverted span still gives one bin.
        assert_eq!(TimelineBuilder::new(5.0, 5.0).finish().bins.len(), 1);
    }

    #[test]
    fn records_outside_the_run_or_without_times_are_not_binned() {
        let mut builder = TimelineBuilder::new(10.0, 12.0);
        builder.add(&ok(5.0, 0.1, 6.0));
        builder.add(&ok(f64::NAN, 0.1, 11.0));
        builder.add(&RecordLine::default());
        let timeline = builder.finish();
        assert_eq!(timeline.records, 3);
        assert!(timeline.bins.iter().all(|b| b.sent == 0 && b.ok == 0));
    }

    #[test]
    fn errors_are_grouped_by_reason_most_frequent_first() {
        let mut tally = ErrorTally::default();
        let failed = |stage: usize, error: Option<&str>, http: Option<u16>| RecordLine {
            stage,
            status: "failed".into(),
            error: error.map(str::to_owned),
            http_status: http,
            ..RecordLine::default()
        };
        tally.add(&failed(2, Some("connection refused"), None));
        tally.add(&failed(1, None, Some(503)));
        tally.add(&failed(1, Some("connection refused"), None));
        tally.add(&ok(0.0, 0.1, 1.0));
        tally.add(&RecordLine {
            status: "cancelled".into(),
            stage: 3,
            ..RecordLine::default()
        });
        let counts = tally.finish();
        assert_eq!(
            counts,
            vec![
                ErrorCount {
                    reason: "connection refused".into(),
                    count: 2,
                    stages: vec![1, 2]
                },
                ErrorCount {
                    reason: "HTTP 503".into(),
                    count: 1,
                    stages: vec![1]
                },
                ErrorCount {
                    reason: "cancelled".into(),
                    count: 1,
                    stages: vec![3]
                },
            ]
        );
    }
}
