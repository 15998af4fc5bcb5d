//! The per-request timing record: a bounded ring of what the server saw of
//! each request (arrival, first token sent, end), so a benchmark can compare
//! the client's measurements with the server's own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// One request as the server saw it. Times are unix seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    /// The response id (`chatcmpl-N`, `cmpl-N`).
    pub id: String,
    /// When the HTTP handler received the request.
    pub arrival: f64,
    /// When the first output token was handed to the connection (streaming)
    /// or produced (non-streaming).
    pub first_token: Option<f64>,
    /// When the response was complete, failed or was abandoned.
    pub end: f64,
    pub prompt_tokens: u32,
    /// Output tokens sent.
    pub completion_tokens: u32,
    /// `ok`, `aborted` (client went away), `error` (4xx/5xx), `cut` or `reset` (injected faults).
    pub status: &'static str,
}

/// The bounded record (cheap to clone; all clones share it).
#[derive(Debug, Clone)]
pub struct RequestLog {
    inner: Arc<Mutex<VecDeque<RequestRecord>>>,
    capacity: usize,
}

/// Now, in unix seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl RequestLog {
    /// A record keeping the last `capacity` requests.
    pub fn new(capacity: usize) -> RequestLog {
        RequestLog {
            inner: Arc::new(Mutex::new(VecDeque::new())),
            capacity,
        }
    }

    pub fn push(&self, r: RequestRecord) {
        if self.capacity == 0 {
            return;
        }
        let mut q = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= self.capacity {
            q.pop_front();
        }
        q.push_back(r);
    }

    /// Records whose end is at or after `since` (unix seconds), oldest first.
    pub fn snapshot(&self, since: Option<f64>) -> Vec<RequestRecord> {
        let q = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        q.iter()
            .filter(|r| since.is_none_or(|s| r.end >= s))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_capacity_records() {
        let log = RequestLog::new(2);
        for i in 0..3 {
            log.push(RequestRecord {
                id: format!("r{i}"),
                arrival: f64::from(i),
                first_token: None,
                end: f64::from(i),
                prompt_tokens: 1,
                completion_tokens: 0,
                status: "ok",
            });
        }
        let ids: Vec<String> = log.snapshot(None).into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["r1", "r2"]);
        assert_eq!(log.snapshot(Some(2.0)).len(), 1);
    }
}
