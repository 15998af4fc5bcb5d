//! Work on a thread of its own, waited for at most a wall-clock limit: the
//! host's backstop for what fuel and the epoch deadline cannot interrupt
//! (a call stuck in host code, a compile that takes too long). Work past its
//! limit is abandoned, not killed: its thread finishes on its own and drops
//! what it owns (the store and the instance of a call), and the caller goes
//! on at once.
//!
//! A thread per call also keeps wasmtime-wasi's synchronous shims off the
//! async runtime's worker threads (they would panic there).

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Why bounded work gave no result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Unfinished {
    /// Still running after the limit; abandoned after `elapsed`.
    Abandoned { elapsed: Duration },
    /// The thread could not be started, or panicked.
    Failed(String),
}

/// Run `work` on a new thread named `name`; wait at most `limit` for it.
pub(crate) fn run<R: Send + 'static>(
    name: &str,
    limit: Duration,
    work: impl FnOnce() -> R + Send + 'static,
) -> Result<R, Unfinished> {
    run_noting_delay(name, limit, (limit, || {}), work)
}

/// [`run`], calling `notice` once when the work is still running after
/// `after` (to say that something slow is going on).
pub(crate) fn run_noting_delay<R: Send + 'static>(
    name: &str,
    limit: Duration,
    (after, notice): (Duration, impl FnOnce()),
    work: impl FnOnce() -> R + Send + 'static,
) -> Result<R, Unfinished> {
    let (done, result) = mpsc::sync_channel(1);
    let started = Instant::now();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            // The receiver is gone when the work was abandoned: nobody waits.
            let _ = done.send(work());
        })
        .map_err(|e| Unfinished::Failed(format!("cannot start a thread: {e}")))?;
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
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(Unfinished::Failed(
            "the host's worker thread panicked".to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_within_the_limit_returns_its_result() {
        assert_eq!(run("t", Duration::from_secs(10), || 7), Ok(7));
    }

    #[test]
    fn work_stuck_past_the_limit_is_abandoned() {
        let started = Instant::now();
        let (release, stuck) = mpsc::channel::<()>();
        let result = run("t", Duration::from_millis(50), move || {
            // Blocks until the test releases it: outside any guest code.
            let _ = stuck.recv();
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
            "t",
            Duration::from_secs(10),
            (Duration::from_millis(10), || noted.set(noted.get() + 1)),
            || std::thread::sleep(Duration::from_millis(100)),
        );
        assert_eq!((slow, noted.get()), (Ok(()), 1));
        let quick = run_noting_delay(
            "t",
            Duration::from_secs(10),
            (Duration::from_secs(5), || noted.set(noted.get() + 1)),
            || 3,
        );
        assert_eq!((quick, noted.get()), (Ok(3), 1));
    }

    #[test]
    fn a_panic_is_reported() {
        let result = run("t", Duration::from_secs(10), || -> u8 { panic!("boom") });
        assert_eq!(
            result,
            Err(Unfinished::Failed(
                "the host's worker thread panicked".into()
            ))
        );
    }
}
