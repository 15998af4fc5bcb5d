//! Ctrl-C and SIGTERM during a run, as its [`Stop`]. The first stops new
//! requests and gives those in flight the grace period (`--grace`); the
//! second skips what is left of it: requests still in flight are
//! cancelled, recorded as such, and every output is written all the same.
//! A third exits at once, with whatever was written by then.

use nyann_run::Stop;
use tokio::signal::unix::{SignalKind, signal};

/// Requests `stop` at each Ctrl-C (SIGINT) or SIGTERM, saying what it does;
/// exits with status 130 on the third. It listens until the process ends
/// (once tokio handles a signal, its default action never comes back).
pub fn cancel_on_signals(stop: Stop) {
    tokio::spawn(async move {
        let mut term = signal(SignalKind::terminate()).ok();
        let mut int = signal(SignalKind::interrupt()).ok();
        loop {
            tokio::select! {
                Some(()) = recv(&mut int) => {}
                Some(()) = recv(&mut term) => {}
                else => return,
            }
            // Said before it takes effect, as what it sets off is logged.
            match stop.requests() + 1 {
                1 => tracing::warn!(
                    "interrupted: no new requests; waiting up to the grace period for those \
                     in flight (again to cancel them now)"
                ),
                2 => tracing::warn!(
                    "interrupted again: cancelling the requests in flight and writing the \
                     results (a third time exits at once, results incomplete)"
                ),
                _ => {
                    tracing::error!(
                        "interrupted three times: exiting now; results may be incomplete"
                    );
                    std::process::exit(130);
                }
            }
            stop.request();
        }
    });
}

/// The next delivery of a signal, never if it could not be listened to.
async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}
