//! The senders that make the load: closed-loop streams (a request, and the
//! next as soon as it ended; in a `conversation_pool` stage each request is
//! a turn of a pooled conversation, see [`super::pool`]) and the open-loop
//! scheduler ([`super::open_loop`]), and [`Load`], which sets them
//! to a stage's level. A level change grows or shrinks the set of streams
//! without aborting any request in flight (a surplus stream ends after its
//! current request); switching between closed and open loop stops the old
//! senders the same way.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use nyann_model::{Mode, Stage};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::lock;
use crate::record::Phase;
use crate::runner::open_loop;
use crate::runner::pool::{Pool, fresh};
use crate::runner::secs;
use crate::runner::state::Shared;
use crate::runner::turn::{Conversation, Turn, run_turn};
use crate::schedule::Schedule;

/// Closed-loop streams: how many should run and how many do. A stream
/// exists only once started (no per-stream bookkeeping before): memory
/// follows the streams running, not the number configured.
#[derive(Debug, Default)]
struct StreamCount {
    target: u32,
    running: u32,
}

#[derive(Debug, Default)]
struct Streams {
    count: Mutex<StreamCount>,
    /// Cancelled when closed-loop load stops: wakes streams that wait.
    stop: CancellationToken,
}

impl Streams {
    /// Sets how many streams should run; says how many more must start.
    fn set_target(&self, n: u32) -> u32 {
        let mut count = lock(&self.count);
        count.target = n;
        n.saturating_sub(count.running)
    }

    /// Counts in one more stream if fewer than the target run.
    fn admit(&self) -> bool {
        let mut count = lock(&self.count);
        let admitted = count.running < count.target && !self.stop.is_cancelled();
        count.running += u32::from(admitted);
        admitted
    }

    /// Whether a running stream goes on; when not, it is counted out (under
    /// the same lock as `admit`, so a shrink-then-grow never loses a stream).
    fn keep(&self) -> bool {
        let mut count = lock(&self.count);
        let keep = count.running <= count.target && !self.stop.is_cancelled();
        if !keep {
            count.running = count.running.saturating_sub(1);
        }
        keep
    }

    /// A stream that `keep` let go on ends anyway (no request may be sent).
    fn leave(&self) {
        let mut count = lock(&self.count);
        count.running = count.running.saturating_sub(1);
    }
}

/// What sends the load now.
enum Level {
    Idle,
    Closed(Arc<Streams>),
    Open(CancellationToken),
}

/// The load's level, set stage by stage.
pub(super) struct Load {
    shared: Arc<Shared>,
    level: Level,
}

impl Load {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Load {
            shared,
            level: Level::Idle,
        }
    }

    /// Points new requests at `index` and sets the load to the stage's level.
    pub(super) fn start_stage(
        &mut self,
        index: usize,
        stage: &Stage,
        phase: Phase,
        start: Instant,
    ) {
        {
            let mut cur = lock(&self.shared.current);
            cur.stage = index;
            cur.phase = phase;
            cur.stopped = false;
        }
        let rampup = stage.rampup_s.unwrap_or(0.0);
        match stage.mode {
            Mode::Concurrent | Mode::ConversationPool => {
                let pool = (stage.mode == Mode::ConversationPool).then(|| self.pool_for(stage));
                lock(&self.shared.current).pool = pool;
                let streams = self.closed_loop();
                let missing = streams.set_target(stage.concurrency.unwrap_or(1));
                if missing > 0 {
                    self.shared.tracker.spawn(start_streams(
                        self.shared.clone(),
                        streams,
                        missing,
                        start,
                        rampup,
                    ));
                }
            }
            Mode::Constant | Mode::Poisson => {
                lock(&self.shared.current).pool = None;
                self.stop_senders();
                let rate = stage.rate.unwrap_or(0.0);
                let schedule = if stage.mode == Mode::Constant {
                    Schedule::constant(rate, rampup)
                } else {
                    Schedule::poisson(
                        rate,
                        rampup,
                        self.shared.seed ^ (index as u64).wrapping_mul(0x9E37_79B9),
                    )
                };
                let stop = CancellationToken::new();
                self.level = Level::Open(stop.clone());
                open_loop::start(
                    self.shared.clone(),
                    schedule,
                    start,
                    u64::from(stage.max_inflight),
                    stop,
                );
            }
        }
    }

    /// The pool of a `conversation_pool` stage: the previous stage's when
    /// that was a pool of the same workload, target and model (grown to
    /// this stage's size), else a new one.
    fn pool_for(&self, stage: &Stage) -> Arc<Pool> {
        let concurrency = stage.concurrency.unwrap_or(1);
        let size = match stage.conversation_pool_size {
            0 => concurrency,
            n => n.max(concurrency),
        } as usize;
        let key = format!("{:?}", (&stage.workload, &stage.target, &stage.model));
        match lock(&self.shared.current).pool.clone() {
            Some(pool) if pool.key == key => {
                pool.grow_to(size);
                pool
            }
            _ => Arc::new(Pool::new(key, size)),
        }
    }

    /// The running closed-loop streams, after stopping an open-loop scheduler.
    fn closed_loop(&mut self) -> Arc<Streams> {
        if let Level::Closed(streams) = &self.level {
            return streams.clone();
        }
        self.stop_senders();
        let streams = Arc::new(Streams::default());
        self.level = Level::Closed(streams.clone());
        streams
    }

    /// The stage's time is over: keep its level, but tag new requests `hold`.
    pub(super) fn hold(&mut self) {
        lock(&self.shared.current).phase = Phase::Hold;
    }

    fn stop_senders(&mut self) {
        match std::mem::replace(&mut self.level, Level::Idle) {
            Level::Idle => {}
            Level::Closed(streams) => {
                streams.set_target(0);
                streams.stop.cancel();
            }
            Level::Open(stop) => stop.cancel(),
        }
    }

    /// No new request: stop every sender (in-flight requests go on).
    pub(super) fn stop(&mut self) {
        lock(&self.shared.current).stopped = true;
        self.stop_senders();
    }
}

/// Starts `count` more closed-loop streams, staggered over the ramp-up
/// (all at once without one), each only when its time comes.
async fn start_streams(
    shared: Arc<Shared>,
    streams: Arc<Streams>,
    count: u32,
    start: Instant,
    rampup: f64,
) {
    for k in 0..count {
        let offset = rampup * f64::from(k) / f64::from(count);
        if offset > 0.0 {
            let at = tokio::time::Instant::from_std(start + secs(offset));
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                _ = streams.stop.cancelled() => return,
                _ = shared.halt.cancelled() => return,
            }
        } else if k % 256 == 255 {
            // Thousands at once: let the started ones run meanwhile.
            tokio::task::yield_now().await;
        }
        if shared.halt.is_cancelled() || !streams.admit() {
            return;
        }
        shared
            .tracker
            .spawn(stream_task(shared.clone(), streams.clone()));
    }
}

/// One closed-loop stream: a request, and the next as soon as it ended (or
/// after a backoff when it failed), while the stream is wanted.
async fn stream_task(shared: Arc<Shared>, streams: Arc<Streams>) {
    let mut conv: Option<Conversation> = None;
    let mut backoff = Backoff::default();
    while streams.keep() {
        let Some(claim) = shared.claim(None) else {
            streams.leave();
            return;
        };
        let turn = match claim.pool.clone() {
            Some(pool) => {
                // A pool stage: the stream's own conversation (from an
                // earlier `concurrent` stage) is over.
                conv = None;
                let settings = claim.settings.clone();
                let mut c = pool.take(fresh(&shared, &settings));
                let turn = run_turn(&shared, claim, &mut c).await;
                let over = c.is_over(&turn);
                pool.put_back(c, over, fresh(&shared, &settings));
                turn
            }
            None => {
                let c = conv.get_or_insert_with(|| Conversation::new(&shared, &claim.settings));
                let turn = run_turn(&shared, claim, c).await;
                if c.is_over(&turn) {
                    conv = None;
                }
                turn
            }
        };
        match turn {
            Turn::Ok => backoff.reset(),
            Turn::Failed { retry_after } => {
                let wait = backoff.next(retry_after, rand::random());
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = streams.stop.cancelled() => {}
                    _ = shared.halt.cancelled() => {}
                }
            }
            Turn::Abandoned => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinking_then_growing_keeps_every_running_stream() {
        let streams = Streams::default();
        assert_eq!(streams.set_target(3), 3);
        assert!(streams.admit() && streams.admit() && streams.admit());
        assert!(!streams.admit(), "no fourth stream");
        // Shrink to 1: two streams end at their next turn...
        assert_eq!(streams.set_target(1), 0);
        assert!(!streams.keep());
        // ...but a grow back to 3 before the last one checks keeps it.
        assert_eq!(streams.set_target(3), 1);
        assert!(streams.keep());
        assert!(streams.admit());
        assert!(!streams.admit());
    }

    #[test]
    fn stopped_streams_admit_and_keep_none() {
        let streams = Streams::default();
        streams.set_target(2);
        assert!(streams.admit());
        streams.stop.cancel();
        assert!(!streams.admit());
        assert!(!streams.keep());
        assert_eq!(lock(&streams.count).running, 0);
    }
}
