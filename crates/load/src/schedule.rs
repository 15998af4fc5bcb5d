//! Open-loop arrival times, as offsets in seconds from the stage start.
//!
//! Every arrival time is computed from the absolute timeline, never by adding
//! a sleep to the previous send, so late sends do not push later arrivals back
//! (no drift) and a slow server cannot slow the offered load (no coordinated
//! omission). With a ramp-up of `R` seconds the rate grows linearly from 0 to
//! `rate`, so the expected number of arrivals by time `t` is
//! `N(t) = rate·t²/(2R)` for `t < R` and `rate·R/2 + rate·(t − R)` after.
//! `constant` puts arrival `k` at `N⁻¹(k)`; `poisson` puts it at `N⁻¹(E_k)`
//! where `E_k` are the arrival times of a unit-rate Poisson process (time
//! rescaling: an exact non-homogeneous Poisson process).

use rand::{Rng, SeedableRng, rngs::SmallRng};

/// The arrival process of one open-loop stage.
#[derive(Debug, Clone)]
pub struct Schedule {
    rate: f64,
    rampup: f64,
    kind: Kind,
    next: u64,
}

#[derive(Debug, Clone)]
enum Kind {
    Constant,
    /// Unit-rate Poisson process: cumulative sum of Exp(1) draws.
    Poisson {
        rng: SmallRng,
        cumulative: f64,
    },
}

impl Schedule {
    /// Evenly spaced arrivals at `rate` per second after a linear ramp of `rampup_s`.
    pub fn constant(rate: f64, rampup_s: f64) -> Self {
        Schedule {
            rate,
            rampup: rampup_s.max(0.0),
            kind: Kind::Constant,
            next: 0,
        }
    }

    /// Poisson arrivals at `rate` per second after a linear ramp, reproducible from `seed`.
    pub fn poisson(rate: f64, rampup_s: f64, seed: u64) -> Self {
        Schedule {
            rate,
            rampup: rampup_s.max(0.0),
            kind: Kind::Poisson {
                rng: SmallRng::seed_from_u64(seed),
                cumulative: 0.0,
            },
            next: 0,
        }
    }

    /// The time (seconds from the stage start) by which `n` arrivals are expected.
    fn inverse(&self, n: f64) -> f64 {
        if self.rate <= 0.0 {
            return f64::INFINITY;
        }
        let ramp_arrivals = self.rate * self.rampup / 2.0;
        if n < ramp_arrivals {
            (2.0 * n * self.rampup / self.rate).sqrt()
        } else {
            self.rampup + (n - ramp_arrivals) / self.rate
        }
    }

    /// Expected arrivals by `t` seconds (the inverse of the schedule).
    pub fn expected_by(&self, t: f64) -> f64 {
        if t <= 0.0 || self.rate <= 0.0 {
            0.0
        } else if t < self.rampup {
            self.rate * t * t / (2.0 * self.rampup)
        } else {
            self.rate * self.rampup / 2.0 + self.rate * (t - self.rampup)
        }
    }
}

impl Iterator for Schedule {
    type Item = f64;

    /// The offset of the next arrival (infinite when the rate is zero).
    fn next(&mut self) -> Option<f64> {
        let k = self.next;
        self.next += 1;
        let n = match &mut self.kind {
            Kind::Constant => k as f64,
            Kind::Poisson { rng, cumulative } => {
                // 1 - U is in (0, 1], so the logarithm is finite.
                let u: f64 = rng.random();
                *cumulative += -(1.0 - u).ln();
                *cumulative
            }
        };
        Some(self.inverse(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_has_no_drift_over_60_seconds() {
        // 1000/s for 60 s: arrival k is exactly k ms after the start, whatever came before.
        let times: Vec<f64> = Schedule::constant(1000.0, 0.0).take(60_001).collect();
        for (k, t) in times.iter().enumerate() {
            assert!((t - k as f64 / 1000.0).abs() < 1e-9, "arrival {k} at {t}");
        }
        assert!((times[60_000] - 60.0).abs() < 1e-9);
    }

    #[test]
    fn odd_rates_do_not_accumulate_error() {
        // 7/s: 1/7 is inexact in binary; an added-up interval would drift.
        let t = Schedule::constant(7.0, 0.0).nth(7 * 3600).unwrap();
        assert!((t - 3600.0).abs() < 1e-9, "{t}");
    }

    #[test]
    fn rampup_ramps_linearly_then_holds_the_rate() {
        let s = Schedule::constant(100.0, 10.0);
        let times: Vec<f64> = s.clone().take_while(|&t| t < 60.0).collect();
        // Ramp: 100*10/2 = 500 arrivals in the first 10 s, then 100/s for 50 s.
        assert_eq!(times.iter().filter(|&&t| t < 10.0).count(), 500);
        assert_eq!(times.len(), 500 + 5000);
        // The rate in the first second of the ramp is low, in the last it is near the target.
        let first = times.iter().filter(|&&t| t < 1.0).count();
        let last = times.iter().filter(|&&t| (9.0..10.0).contains(&t)).count();
        assert_eq!(first, 5);
        assert_eq!(last, 95);
        assert!((s.expected_by(60.0) - 5500.0).abs() < 1e-9);
    }

    #[test]
    fn poisson_counts_match_rate_times_duration() {
        let count = Schedule::poisson(200.0, 0.0, 7)
            .take_while(|&t| t < 60.0)
            .count();
        // Mean 12000, standard deviation ~110: 5 sigma bounds.
        assert!((11_450..=12_550).contains(&count), "{count}");
        let ramped = Schedule::poisson(200.0, 20.0, 8)
            .take_while(|&t| t < 60.0)
            .count();
        // Expected 200*20/2 + 200*40 = 10000.
        assert!((9_500..=10_500).contains(&ramped), "{ramped}");
    }

    #[test]
    fn poisson_is_reproducible_and_increasing() {
        let a: Vec<f64> = Schedule::poisson(50.0, 5.0, 42).take(1000).collect();
        let b: Vec<f64> = Schedule::poisson(50.0, 5.0, 42).take(1000).collect();
        assert_eq!(a, b);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
    }
}
