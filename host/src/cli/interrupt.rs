//! Ctrl-C and SIGTERM during a run. The first stops new requests and gives
//! those in flight the grace period (`--grace`); the second skips what is
//! left of it: requests still in flight are cancelled, recorded as such,
//! and every output is written all the same. A third exits at once, with
//! whatever was written by then.

use nyann_load::CancellationToken;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// The signal listener of a run. It listens until the process ends (once
/// tokio handles a signal, its default action never comes back).
pub struct Signals {
    received: watch::Receiver<u32>,
}

impl Signals {
    /// Resolves at the next Ctrl-C or SIGTERM after this call (whatever
    /// came before; counted from the call, not from the first poll, so that
    /// a signal between the two is not missed): what comes after the load
    /// (the report) gives way to it.
    pub fn next(&self) -> impl Future<Output = ()> + use<> {
        let mut received = self.received.clone();
        let seen = *received.borrow_and_update();
        async move {
            // The listener never ends while it lives: an error means never.
            if received.wait_for(|n| *n > seen).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Cancels `interrupt` on the first Ctrl-C (SIGINT) or SIGTERM and
/// `interrupt_now` on the second (the runner's `RunOptions` tokens of the
/// same names); exits with status 130 on the third.
pub fn cancel_on_signals(
    interrupt: CancellationToken,
    interrupt_now: CancellationToken,
) -> Signals {
    let (count, received) = watch::channel(0u32);
    tokio::spawn(async move {
        let mut term = signal(SignalKind::terminate()).ok();
        let mut int = signal(SignalKind::interrupt()).ok();
        for signals in 1.. {
            tokio::select! {
                Some(()) = recv(&mut int) => {}
                Some(()) = recv(&mut term) => {}
                else => return,
            }
            count.send_replace(signals);
            match signals {
                1 => {
                    tracing::warn!(
                        "interrupted: no new requests; waiting up to the grace period for those \
                         in flight (again to cancel them now)"
                    );
                    interrupt.cancel();
                }
                2 => {
                    tracing::warn!(
                        "interrupted again: cancelling the requests in flight and writing the \
                         results (a third time exits at once, results incomplete)"
                    );
                    interrupt_now.cancel();
                }
                _ => {
                    tracing::error!(
                        "interrupted three times: exiting now; results may be incomplete"
                    );
                    std::process::exit(130);
                }
            }
        }
    });
    Signals { received }
}

/// The next delivery of a signal, never if it could not be listened to.
async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}
