//! How long a closed-loop stream waits after a failed or rejected request
//! before it sends its next one: exponential backoff from
//! [`FIRST_BACKOFF`], doubled by each failure in a row up to
//! [`MAX_BACKOFF`], with jitter (each wait is random between half and all
//! of its step, so streams that failed together do not retry together),
//! reset by a success. A busy server's `Retry-After` replaces the backoff,
//! up to the same cap.
//!
//! Without it a stream retries at once: a dead server took ~17,000 failures
//! a second, a server answering 429 ~56,000.

use std::time::Duration;

/// The first wait after a failure.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait, `Retry-After` included.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One stream's failures in a row.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// A success: the next failure waits [`FIRST_BACKOFF`] again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// The wait after one more failure. `jitter` in `[0, 1)` places it
    /// between half and all of the step; `retry_after` (the server's
    /// `Retry-After`) replaces the step.
    pub fn next(&mut self, retry_after: Option<Duration>, jitter: f64) -> Duration {
        let doublings = self.failures.min(16);
        self.failures = self.failures.saturating_add(1);
        match retry_after {
            Some(wait) => wait.min(MAX_BACKOFF),
            None => {
                let step = FIRST_BACKOFF
                    .saturating_mul(1 << doublings)
                    .min(MAX_BACKOFF);
                step.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_with_jitter_up_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        let ms = |d: Duration| d.as_millis();
        assert_eq!(ms(b.next(None, 0.0)), 25);
        assert_eq!(ms(b.next(None, 1.0)), 100);
        assert_eq!(ms(b.next(None, 0.5)), 150);
        for _ in 0..40 {
            assert!(b.next(None, 1.0) <= MAX_BACKOFF);
        }
        assert_eq!(b.next(None, 1.0), MAX_BACKOFF);
        assert_eq!(b.next(None, 0.0), MAX_BACKOFF / 2);
        b.reset();
        assert_eq!(ms(b.next(None, 1.0)), 50);
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let mut b = Backoff::default();
        let wait = b.next(Some(Duration::from_secs(2)), 0.0);
        assert_eq!(wait, Duration::from_secs(2));
        assert_eq!(b.next(Some(Duration::from_secs(3600)), 0.0), MAX_BACKOFF);
        // It still counts as a failure in a row.
        assert_eq!(b.next(None, 1.0), Duration::from_millis(200));
    }
}
