//! Work on a worker thread, waited for at most a wall-clock limit: the
//! host's backstop for what fuel and the epoch deadline cannot interrupt
//! (a call stuck in host code, a compile that takes too long). Work past its
//! limit is abandoned, not killed: its thread finishes on its own and drops
//! what it owns (the store and the instance of a call), and the caller goes
//! on at once. Waited for by blocking ([`run`]) or by an async task
//! ([`run_async`], which leaves the runtime's threads free meanwhile).
//!
//! The threads are kept and reused: a parked thread takes a call in a
//! wake-up, where a new one costs a spawn per call (a large part of a
//! judgment, which takes tens of microseconds). A thread whose work was
//! abandoned takes new work only once that work has finished; one that
//! panicked ends. The work owns all its state, so nothing of a call stays
//! on its thread for the next.
//!
//! The work returns its result and what it leaves behind (a call's store
//! and instance): the latter is dropped after the caller has the result, so
//! that resetting the instance's memory for the next call is not part of
//! the caller's wait.
//!
//! Threads of their own also keep wasmtime-wasi's synchronous shims off the
//! async runtime's worker threads (they would panic there).

use std::sync::mpsc;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Why bounded work gave no result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Unfinished {
    /// Still running after the limit; abandoned after `elapsed`.
    Abandoned { elapsed: Duration },
    /// The thread could not be started, or panicked.
    Failed(String),
}

const PANICKED: &str = "the host's worker thread panicked";

/// Run `work` on a worker thread; wait at most `limit` for its result.
pub(crate) fn run<R: Send + 'static, L: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> (R, L) + Send + 'static,
) -> Result<R, Unfinished> {
    run_noting_delay(limit, (limit, || {}), work)
}

/// [`run`], calling `notice` once when the work is still running after
/// `after` (to say that something slow is going on).
pub(crate) fn run_noting_delay<R: Send + 'static, L: Send + 'static>(
    limit: Duration,
    (after, notice): (Duration, impl FnOnce()),
    work: impl FnOnce() -> (R, L) + Send + 'static,
) -> Result<R, Unfinished> {
    let (done, result) = mpsc::sync_channel(1);
    let started = Instant::now();
    submit(Box::new(move || {
        let (value, leftover) = work();
        // The receiver is gone when the work was abandoned: nobody waits.
        let _ = done.send(value);
        drop(leftover);
    }))?;
    let waited = match result.recv_timeout(after.min(limit)) {
        Err(mpsc::RecvTimeoutError::Timeout) if after < limit => {
            notice();
            result.recv_timeout(limit.saturating_sub(started.elapsed()))
        }
        waited => waited,
    };
    match waited {
        Ok(value) => Ok(value),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Unfinished::Abandoned {
            elapsed: started.elapsed(),
        }),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(Unfinished::Failed(PANICKED.into())),
    }
}

/// [`run`] for async callers: the task waits, not its thread. Needs a Tokio
/// runtime with its time driver (for the limit).
pub(crate) async fn run_async<R: Send + 'static, L: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> (R, L) + Send + 'static,
) -> Result<R, Unfinished> {
    let (done, result) = tokio::sync::oneshot::channel();
    let started = Instant::now();
    submit(Box::new(move || {
        let (value, leftover) = work();
        let _ = done.send(value);
        drop(leftover);
    }))?;
    match tokio::time::timeout(limit, result).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(_)) => Err(Unfinished::Failed(PANICKED.into())),
        Err(_) => Err(Unfinished::Abandoned {
            elapsed: started.elapsed(),
        }),
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Where to send work to the parked workers, most recently parked last
/// (taken first: its stack is the warmest).
static IDLE: Mutex<Vec<mpsc::Sender<Job>>> = Mutex::new(Vec::new());

/// Most workers kept parked; more finishing at once end. Calls are rarely
/// concurrent (one judgment per stage; `policy check` and `replay` judge
/// one stage after another).
const MAX_IDLE: usize = 4;

/// Hand `job` to a parked worker, or to a new one when none is parked.
fn submit(mut job: Job) -> Result<(), Unfinished> {
    loop {
        let worker = IDLE.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let Some(jobs) = worker else { break };
        // Fails only when that worker has ended: try the next.
        match jobs.send(job) {
            Ok(()) => return Ok(()),
            Err(mpsc::SendError(back)) => job = back,
        }
    }
    spawn_worker(job)
}

fn spawn_worker(first: Job) -> Result<(), Unfinished> {
    let (jobs, inbox) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("nyann-policy-worker".into())
        .spawn(move || {
            let mut job = first;
            loop {
                // A panic ends the thread here, and drops the job's result
                // sender: its caller hears of it.
                job();
                {
                    let mut idle = IDLE.lock().unwrap_or_else(PoisonError::into_inner);
                    if idle.len() >= MAX_IDLE {
                        return;
                    }
                    idle.push(jobs.clone());
                }
                match inbox.recv() {
                    Ok(next) => job = next,
                    Err(mpsc::RecvError) => return,
                }
            }
        })
        .map(|_| ())
        .map_err(|e| Unfinished::Failed(format!("cannot start a thread: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn work_within_the_limit_returns_its_result() {
        assert_eq!(run(Duration::from_secs(10), || (7, ())), Ok(7));
    }

    #[test]
    fn work_stuck_past_the_limit_is_abandoned() {
        let started = Instant::now();
        let (release, stuck) = mpsc::channel::<()>();
        let result = run(Duration::from_millis(50), move || {
            // Blocks until the test releases it: outside any guest code.
            (stuck.recv(), ())
        });
        let Err(Unfinished::Abandoned { elapsed }) = result else {
            panic!("{result:?}");
        };
        assert!(elapsed >= Duration::from_millis(50), "{elapsed:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        drop(release);
    }

    #[test]
    fn slow_work_is_noted_once_and_quick_work_never() {
        let noted = std::cell::Cell::new(0);
        let slow = run_noting_delay(
            Duration::from_secs(10),
            (Duration::from_millis(10), || noted.set(noted.get() + 1)),
            || (std::thread::sleep(Duration::from_millis(100)), ()),
        );
        assert_eq!((slow, noted.get()), (Ok(()), 1));
        let quick = run_noting_delay(
            Duration::from_secs(10),
            (Duration::from_secs(5), || noted.set(noted.get() + 1)),
            || (3, ()),
        );
        assert_eq!((quick, noted.get()), (Ok(3), 1));
    }

    #[test]
    fn a_panic_is_reported() {
        let result = run(Duration::from_secs(10), || -> (u8, ()) { panic!("boom") });
        assert_eq!(result, Err(Unfinished::Failed(PANICKED.into())));
        // The pool goes on without that thread.
        assert_eq!(run(Duration::from_secs(10), || (4, ())), Ok(4));
    }

    #[test]
    fn threads_are_reused() {
        // Other tests take and park workers meanwhile: count, don't pin.
        let mut threads: Vec<_> = (0..20)
            .map(|_| {
                run(Duration::from_secs(10), || {
                    (std::thread::current().id(), ())
                })
                .unwrap()
            })
            .collect();
        threads.sort_by_key(|id| format!("{id:?}"));
        threads.dedup();
        assert!(threads.len() < 10, "{} threads for 20 runs", threads.len());
    }

    #[test]
    fn a_thread_running_abandoned_work_takes_no_other() {
        let (release, stuck) = mpsc::channel::<()>();
        let (started, running) = mpsc::channel();
        let abandoned = run(Duration::from_millis(20), move || {
            let _ = started.send(std::thread::current().id());
            (stuck.recv(), ())
        });
        assert!(matches!(abandoned, Err(Unfinished::Abandoned { .. })));
        let busy = running.recv().unwrap();
        for _ in 0..10 {
            let thread = run(Duration::from_secs(10), || {
                (std::thread::current().id(), ())
            });
            assert_ne!(thread.unwrap(), busy);
        }
        drop(release);
    }

    #[tokio::test]
    async fn async_work_returns_is_abandoned_or_reports_its_panic() {
        assert_eq!(run_async(Duration::from_secs(10), || (7, ())).await, Ok(7));
        let (release, stuck) = mpsc::channel::<()>();
        let result = run_async(Duration::from_millis(50), move || (stuck.recv(), ())).await;
        let Err(Unfinished::Abandoned { elapsed }) = result else {
            panic!("{result:?}");
        };
        assert!(elapsed >= Duration::from_millis(50), "{elapsed:?}");
        drop(release);
        let result = run_async(Duration::from_secs(10), || -> (u8, ()) { panic!("boom") }).await;
        assert_eq!(result, Err(Unfinished::Failed(PANICKED.into())));
    }

    /// What the work leaves behind is dropped after its result is in.
    #[test]
    fn the_leftover_is_dropped_after_the_result_is_sent() {
        struct Slow(mpsc::Sender<()>);
        impl Drop for Slow {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(200));
                let _ = self.0.send(());
            }
        }
        let (dropped, was_dropped) = mpsc::channel();
        let started = Instant::now();
        assert_eq!(
            run(Duration::from_secs(10), move || (5, Slow(dropped))),
            Ok(5)
        );
        assert!(was_dropped.try_recv().is_err(), "not dropped yet");
        assert!(started.elapsed() < Duration::from_millis(200));
        was_dropped.recv_timeout(Duration::from_secs(10)).unwrap();
    }
}
