//! The open-loop scheduler: each arrival of a stage's [`Schedule`] claimed
//! at its instant and sent as a conversation of its own (or recorded as
//! dropped when `max_inflight` requests are in flight).
//!
//! It runs on a blocking thread of its own rather than as a task: tokio's
//! timer wakes on a 1 ms grain, so a task sent each request 1 ms late at the
//! median and 2 ms at p99, and bunched ten arrivals per tick at 10,000 req/s.
//! The thread sleeps until an arrival's instant with the kernel's timer, its
//! slack cut to a microsecond from the default 50 µs (it then wakes 10-40 µs
//! late), and spawns the arrival's request onto the runtime.
//!
//! After a wait of a millisecond or more it spins the last 200 µs instead
//! of sleeping them: in such a gap the core goes idle, and an idle core,
//! a virtual one above all, wakes late now and then. With the spin, p99 at
//! 300 and 1,000 req/s went from 0.17-0.20 ms to 0.12-0.16 ms on a quiet
//! machine, and from 0.25-0.56 ms to 0.16 ms on a busier one
//! (`bench/open-loop.sh`). Only long gaps end in a spin, so it costs a few
//! percent of a core (5 -> 9% at 300 req/s, 10 -> 16% at 1,000) and nothing
//! at high rates, where a thread spinning before every arrival took the
//! core the runtime's workers needed (p99 25 ms at 10,000 req/s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::runner::state::{Claim, Shared};
use crate::runner::turn::{Conversation, run_turn};
use crate::schedule::Schedule;

/// The longest sleep without a look at whether the stage stopped.
const SLICE: Duration = Duration::from_millis(5);

/// A wait at least this long ends in a spin of [`SPIN`] (see the module doc).
const SPIN_AFTER: Duration = Duration::from_millis(1);
const SPIN: Duration = Duration::from_micros(200);

/// Starts the scheduler of an open-loop stage begun at `start`; it ends
/// when `stop` or the run's halt is cancelled, or the load stops.
pub(super) fn start(
    shared: Arc<Shared>,
    schedule: Schedule,
    start: Instant,
    max_inflight: u64,
    stop: CancellationToken,
) {
    let runtime = Handle::current();
    let tracker = shared.tracker.clone();
    tracker.spawn_blocking(move || {
        let _precise = PreciseTimers::set();
        let stopped = || stop.is_cancelled() || shared.halt.is_cancelled();
        for offset in schedule {
            let Ok(offset) = Duration::try_from_secs_f64(offset) else {
                return;
            };
            let due = start + offset;
            if !sleep_until(due, &stopped) {
                return;
            }
            let scheduled_at = shared.clock.unix(due);
            if max_inflight > 0 && shared.inflight.get() >= max_inflight {
                let dropped = shared.clone();
                shared.tracker.spawn_on(
                    async move { dropped.record_drop(scheduled_at).await },
                    &runtime,
                );
                continue;
            }
            let Some(claim) = shared.claim(Some(scheduled_at)) else {
                return;
            };
            shared
                .tracker
                .spawn_on(conversation(shared.clone(), claim), &runtime);
        }
    });
}

/// Blocks until `due`; false as soon as `stopped` says so instead.
fn sleep_until(due: Instant, stopped: &impl Fn() -> bool) -> bool {
    let spin = if due.saturating_duration_since(Instant::now()) >= SPIN_AFTER {
        SPIN
    } else {
        Duration::ZERO
    };
    loop {
        if stopped() {
            return false;
        }
        let left = due.saturating_duration_since(Instant::now());
        if left <= spin {
            while Instant::now() < due {
                std::hint::spin_loop();
            }
            return true;
        }
        std::thread::sleep((left - spin).min(SLICE));
    }
}

/// The calling thread's timer slack cut to 1 µs while held, then restored
/// (the thread goes back to tokio's blocking pool). Linux only; elsewhere,
/// and where the kernel refuses, the default slack stays.
struct PreciseTimers {
    #[cfg(target_os = "linux")]
    previous: Option<u64>,
}

impl PreciseTimers {
    fn set() -> Self {
        #[cfg(target_os = "linux")]
        {
            use nix::sys::prctl;
            let previous = prctl::get_timerslack()
                .ok()
                .and_then(|ns| u64::try_from(ns).ok());
            let _ = prctl::set_timerslack(1_000);
            PreciseTimers { previous }
        }
        #[cfg(not(target_os = "linux"))]
        PreciseTimers {}
    }
}

impl Drop for PreciseTimers {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(ns) = self.previous {
            let _ = nix::sys::prctl::set_timerslack(ns);
        }
    }
}

/// An open-loop arrival: one conversation, its later turns sent as soon as the previous reply is in.
async fn conversation(shared: Arc<Shared>, first: Claim) {
    let mut conv = Conversation::new(&shared, &first.settings);
    let mut claim = first;
    loop {
        let turn = run_turn(&shared, claim, &mut conv).await;
        if conv.is_over(&turn) {
            break;
        }
        claim = match shared.claim(None) {
            Some(c) => c,
            None => break,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn a_stop_ends_the_wait_for_a_far_arrival() {
        let looks = AtomicU32::new(0);
        // Stopped at the third look: the wait for an arrival an hour away
        // must look again while it sleeps, not sleep the hour.
        let stopped = || looks.fetch_add(1, Ordering::SeqCst) >= 2;
        let due = Instant::now() + Duration::from_secs(3600);
        assert!(!sleep_until(due, &stopped));
        assert_eq!(looks.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn an_arrival_due_is_not_waited_for() {
        assert!(sleep_until(Instant::now(), &|| false));
    }

    /// Short waits (slept) and long ones (ending in a spin) alike end at
    /// their instant, never before it.
    #[test]
    fn a_wait_never_ends_before_its_instant() {
        for wait_us in [50, 300, 999, 1000, 1500, 6000] {
            let due = Instant::now() + Duration::from_micros(wait_us);
            assert!(sleep_until(due, &|| false));
            assert!(Instant::now() >= due, "a wait of {wait_us} µs ended early");
        }
    }
}
