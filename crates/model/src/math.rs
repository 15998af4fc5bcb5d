//! The signal arithmetic: stage windows, the p50 of a series, Prometheus'
//! `histogram_quantile` and counter increases.
//!
//! The policy interface documents these definitions as part of its contract,
//! so they exist once: both signal sources (`nyann-signals`: the Prometheus
//! API and direct `/metrics` scraping) and the simulator's virtual-clock
//! sweep (`nyann-sim`) compute with them. Everything here is pure and
//! deterministic so that they all get the same numbers from the same
//! samples, and so that the window and quantile rules are tested in one
//! place.

/// Below this length (seconds) the steady window is the whole stage.
pub const MIN_STEADY_SECONDS: f64 = 5.0;

/// A time interval in unix seconds, `start <= end`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub start: f64,
    pub end: f64,
}

impl Window {
    pub fn new(start: f64, end: f64) -> Self {
        Self { start, end }
    }

    /// Length in seconds (0 for an inverted window).
    pub fn seconds(&self) -> f64 {
        (self.end - self.start).max(0.0)
    }

    /// The steady-state window of a stage: `[start + 20%, start + 95%]` of
    /// its length, or the whole stage when that would be shorter than 5 s
    /// (ramp-up and boundary time are excluded).
    pub fn steady(stage: Window) -> Window {
        let len = stage.seconds();
        let steady = Window::new(stage.start + 0.20 * len, stage.start + 0.95 * len);
        if steady.seconds() < MIN_STEADY_SECONDS {
            stage
        } else {
            steady
        }
    }
}

/// Quantile `q` (0..=1) of `values` with linear interpolation between ranks
/// (rank `q * (n - 1)`, as numpy's default). Non-finite values are ignored;
/// `None` when nothing is left.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    quantile_of_sorted(&v, q)
}

/// [`quantile`] of values already sorted ascending and finite, without the
/// copy and the sort: for callers that read several quantiles of one large
/// series (the simulator's sweep, run hundreds of times by a fit).
pub fn quantile_of_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// One cumulative histogram bucket: observations `<= upper_bound`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub upper_bound: f64,
    pub count: f64,
}

/// Prometheus' tolerance for float noise between adjacent cumulative buckets.
const SMALL_DELTA_TOLERANCE: f64 = 1e-12;

/// `histogram_quantile(q, buckets)` exactly as Prometheus computes it for
/// classic histograms (promql/quantile.go, `BucketQuantile`):
///
/// - buckets are sorted by bound and buckets with the same bound merged;
/// - no `+Inf` bucket, fewer than two buckets or zero observations: NaN
///   ("no value");
/// - counts are forced monotonic (float noise below 1e-12 relative ignored);
/// - a rank that falls into the `+Inf` bucket gives the highest finite bound
///   (the second-highest bound, as Prometheus answers);
/// - otherwise linear interpolation inside the bucket, whose lower edge is
///   the previous bound (0 for the first bucket unless its bound is <= 0).
pub fn histogram_quantile(q: f64, buckets: &[Bucket]) -> f64 {
    histogram_quantile_with_bound(q, buckets).0
}

/// [`histogram_quantile`], and whether the rank fell into the `+Inf` bucket:
/// the value is then the largest finite bound, and the true quantile is at
/// least that (a lower bound).
pub fn histogram_quantile_with_bound(q: f64, buckets: &[Bucket]) -> (f64, bool) {
    let value = |v: f64| (v, false);
    if q.is_nan() {
        return value(f64::NAN);
    }
    if q < 0.0 {
        return value(f64::NEG_INFINITY);
    }
    if q > 1.0 {
        return value(f64::INFINITY);
    }
    let mut b: Vec<Bucket> = buckets.to_vec();
    if b.is_empty() {
        return value(f64::NAN);
    }
    b.sort_by(|x, y| x.upper_bound.total_cmp(&y.upper_bound));
    if b.last().is_none_or(|l| l.upper_bound != f64::INFINITY) {
        return value(f64::NAN);
    }
    // coalesceBuckets: merge buckets with the same upper bound.
    let mut merged: Vec<Bucket> = Vec::with_capacity(b.len());
    for bucket in b {
        match merged.last_mut() {
            Some(last) if last.upper_bound == bucket.upper_bound => last.count += bucket.count,
            _ => merged.push(bucket),
        }
    }
    let mut b = merged;
    ensure_monotonic(&mut b);
    if b.len() < 2 {
        return value(f64::NAN);
    }
    let observations = b[b.len() - 1].count;
    if observations == 0.0 {
        return value(f64::NAN);
    }
    let mut rank = q * observations;
    // sort.Search(len-1, count >= rank): first bucket reaching the rank, or len-1.
    let idx = b[..b.len() - 1]
        .iter()
        .position(|x| x.count >= rank)
        .unwrap_or(b.len() - 1);
    if idx == b.len() - 1 {
        return (b[b.len() - 2].upper_bound, true);
    }
    if idx == 0 && b[0].upper_bound <= 0.0 {
        return value(b[0].upper_bound);
    }
    let bucket_end = b[idx].upper_bound;
    let mut count = b[idx].count;
    let mut bucket_start = 0.0;
    if idx > 0 {
        bucket_start = b[idx - 1].upper_bound;
        count -= b[idx - 1].count;
        rank -= b[idx - 1].count;
    }
    value(bucket_start + (bucket_end - bucket_start) * (rank / count))
}

/// `ensureMonotonicAndIgnoreSmallDeltas` from Prometheus.
fn ensure_monotonic(b: &mut [Bucket]) {
    let Some(first) = b.first() else { return };
    let mut prev = first.count;
    for bucket in b.iter_mut().skip(1) {
        let curr = bucket.count;
        if curr == prev {
            continue;
        }
        if almost_equal(prev, curr, SMALL_DELTA_TOLERANCE) || curr < prev {
            bucket.count = prev;
            continue;
        }
        prev = curr;
    }
}

/// Prometheus' `almost.Equal`.
fn almost_equal(a: f64, b: f64, epsilon: f64) -> bool {
    if a == b {
        return true;
    }
    let abs_sum = a.abs() + b.abs();
    let diff = (a - b).abs();
    if a == 0.0 || b == 0.0 || abs_sum < f64::MIN_POSITIVE {
        return diff < epsilon * f64::MIN_POSITIVE;
    }
    diff / abs_sum.min(f64::MAX) < epsilon
}

/// Increase of a counter over consecutive samples, with reset handling: a
/// drop means the counter restarted from zero, so the new value is itself the
/// increase since the restart (as Prometheus' `increase`, without its
/// extrapolation to the window edges). Non-finite samples are skipped.
pub fn counter_increase(values: &[f64]) -> f64 {
    let mut it = values.iter().copied().filter(|v| v.is_finite());
    let Some(mut prev) = it.next() else {
        return 0.0;
    };
    let mut total = 0.0;
    for v in it {
        total += if v >= prev { v - prev } else { v };
        prev = v;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bk(pairs: &[(f64, f64)]) -> Vec<Bucket> {
        pairs
            .iter()
            .map(|&(upper_bound, count)| Bucket { upper_bound, count })
            .collect()
    }

    #[test]
    fn steady_window_drops_ramp_and_tail() {
        let w = Window::steady(Window::new(100.0, 160.0));
        assert!((w.start - 112.0).abs() < 1e-9 && (w.end - 157.0).abs() < 1e-9);
    }

    #[test]
    fn short_stage_uses_whole_stage() {
        // 6 s stage: 75% of it is 4.5 s < 5 s.
        let stage = Window::new(10.0, 16.0);
        assert_eq!(Window::steady(stage), stage);
        // 20 s stage: 15 s steady window.
        let w = Window::steady(Window::new(0.0, 20.0));
        assert_eq!(w, Window::new(4.0, 19.0));
    }

    #[test]
    fn quantile_interpolates_between_ranks() {
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[f64::NAN], 0.5), None);
        assert_eq!(quantile(&[3.0], 0.5), Some(3.0));
        assert_eq!(quantile(&[4.0, 1.0, 3.0, 2.0], 0.5), Some(2.5));
        assert_eq!(quantile(&[1.0, 2.0, 3.0], 0.5), Some(2.0));
        assert_eq!(quantile(&[0.0, 10.0], 0.99), Some(9.9));
        // The sorted variant is the same rule without the sort.
        assert_eq!(quantile_of_sorted(&[], 0.5), None);
        assert_eq!(quantile_of_sorted(&[1.0, 2.0, 3.0, 4.0], 0.5), Some(2.5));
        assert_eq!(quantile_of_sorted(&[0.0, 10.0], 0.99), Some(9.9));
    }

    #[test]
    fn histogram_quantile_matches_prometheus_examples() {
        // Interpolation inside a bucket: 100 obs, rank 99 in (0.5, 1.0] holding 10.
        let b = bk(&[
            (0.1, 50.0),
            (0.5, 90.0),
            (1.0, 100.0),
            (f64::INFINITY, 100.0),
        ]);
        assert!((histogram_quantile(0.99, &b) - 0.95).abs() < 1e-12);
        // First bucket: lower edge 0.
        assert!((histogram_quantile(0.25, &b) - 0.05).abs() < 1e-12);
        // Rank in the +Inf bucket: highest finite bound, a lower bound of
        // the truth (Prometheus answers the same second-highest bound).
        let b = bk(&[(0.1, 1.0), (2560.0, 1.0), (f64::INFINITY, 10.0)]);
        assert_eq!(histogram_quantile(0.99, &b), 2560.0);
        assert_eq!(histogram_quantile_with_bound(0.99, &b), (2560.0, true));
        assert_eq!(histogram_quantile_with_bound(0.05, &b), (0.05, false));
        // No observations, no +Inf, a single bucket: NaN.
        let b = bk(&[(0.1, 0.0), (f64::INFINITY, 0.0)]);
        assert!(histogram_quantile(0.99, &b).is_nan());
        assert!(histogram_quantile(0.5, &bk(&[(0.1, 1.0), (1.0, 2.0)])).is_nan());
        assert!(histogram_quantile(0.5, &bk(&[(f64::INFINITY, 2.0)])).is_nan());
        assert!(histogram_quantile(0.5, &[]).is_nan());
        // Out-of-range q.
        assert_eq!(histogram_quantile(-0.1, &b), f64::NEG_INFINITY);
        assert_eq!(histogram_quantile(1.1, &b), f64::INFINITY);
    }

    #[test]
    fn histogram_quantile_sorts_merges_and_forces_monotonic() {
        // Unsorted, duplicated bound (two pods), and a non-monotonic dip.
        let b = bk(&[
            (f64::INFINITY, 10.0),
            (1.0, 4.0),
            (0.5, 3.0),
            (1.0, 4.0),
            (2.0, 7.0), // dip: below 8 after merging 1.0 -> forced to 8
            (f64::INFINITY, 10.0),
        ]);
        // merged: 0.5:3, 1.0:8, 2.0:7->8, inf:20. q=0.5 -> rank 10 -> +Inf bucket.
        assert_eq!(histogram_quantile(0.5, &b), 2.0);
        // q=0.3 -> rank 6 -> bucket (0.5,1.0]: 0.5 + 0.5 * (3/5)
        assert!((histogram_quantile(0.3, &b) - 0.8).abs() < 1e-12);
        // Non-positive first bound returns the bound itself.
        let b = bk(&[(-1.0, 5.0), (0.0, 6.0), (f64::INFINITY, 6.0)]);
        assert_eq!(histogram_quantile(0.5, &b), -1.0);
    }

    #[test]
    fn counter_increase_handles_resets() {
        assert_eq!(counter_increase(&[]), 0.0);
        assert_eq!(counter_increase(&[5.0]), 0.0);
        assert_eq!(counter_increase(&[1.0, 3.0, 6.0]), 5.0);
        // Reset after 6: restarted and reached 2.
        assert_eq!(counter_increase(&[1.0, 6.0, 2.0, 4.0]), 9.0);
        assert_eq!(counter_increase(&[1.0, f64::NAN, 4.0]), 3.0);
    }
}
