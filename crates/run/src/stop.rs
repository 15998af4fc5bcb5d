//! Stopping a run from outside (Ctrl-C, SIGTERM, a service's cancel): the
//! first request stops new requests and gives those in flight the grace
//! period; the second cancels them at once (results are written either
//! way). What comes after the load, the report, gives way to the next
//! request.

use std::future::Future;
use std::sync::Arc;

use nyann_load::{CancellationToken, RunOptions};
use tokio::sync::watch;

/// A run's stop: clones stop the same run.
#[derive(Debug, Clone)]
pub struct Stop {
    interrupt: CancellationToken,
    interrupt_now: CancellationToken,
    /// Requests so far. Counted apart from the tokens: a fleet's leader
    /// cancels `interrupt` itself when it aborts, and a request after that
    /// must still end the report.
    requests: Arc<watch::Sender<u32>>,
}

impl Stop {
    /// The stop of a run with `options`' `interrupt` and `interrupt_now`.
    pub(crate) fn of(options: &RunOptions) -> Stop {
        Stop {
            interrupt: options.interrupt.clone(),
            interrupt_now: options.interrupt_now.clone(),
            requests: Arc::new(watch::Sender::new(0)),
        }
    }

    /// How many times the stop was requested.
    pub fn requests(&self) -> u32 {
        *self.requests.borrow()
    }

    /// Asks the run to stop: the first request stops new requests, the
    /// second cancels those in flight; later ones change nothing. Returns
    /// how many requests there have been, this one included.
    pub fn request(&self) -> u32 {
        let mut count = 0;
        self.requests.send_modify(|n| {
            *n += 1;
            count = *n;
        });
        match count {
            1 => self.interrupt.cancel(),
            2 => self.interrupt_now.cancel(),
            _ => {}
        }
        count
    }

    /// Resolves at the next request after this call (counted from the
    /// call, not from the first poll, so that one in between is not
    /// missed).
    pub fn next(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let mut requests = self.requests.subscribe();
        let seen = *requests.borrow_and_update();
        async move {
            // The sender lives as long as a clone of this stop does: an
            // error means no request can come any more.
            if requests.wait_for(|n| *n > seen).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Resolves once the load was asked to stop (by a request, or by a
    /// fleet's leader).
    pub(crate) async fn cancelled(&self) {
        self.interrupt.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_first_request_stops_new_load_the_second_the_load_in_flight() {
        let options = RunOptions::default();
        let stop = Stop::of(&options);
        let next = stop.next();
        assert_eq!(stop.request(), 1);
        assert!(options.interrupt.is_cancelled() && !options.interrupt_now.is_cancelled());
        tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .unwrap_or_else(|_| panic!("the request ends the wait"));
        // A wait that starts after a request waits for the next one.
        let after = tokio::spawn(stop.next());
        tokio::task::yield_now().await;
        assert!(!after.is_finished());
        assert_eq!(stop.clone().request(), 2);
        assert!(options.interrupt_now.is_cancelled());
        tokio::time::timeout(Duration::from_secs(1), after)
            .await
            .unwrap_or_else(|_| panic!("the second request ends the second wait"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stop.request(), 3);
        assert_eq!(stop.requests(), 3);
    }
}
