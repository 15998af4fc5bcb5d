//! An OpenAI-compatible server that queues like an engine with a fixed
//! number of slots: at most `slots` requests run at once, each for
//! `service`, the rest wait. Its `/metrics` (vLLM's names) report the
//! waiting and running requests as they are at the scrape and each
//! request's time to first token, so congestion is a known function of the
//! level: at closed-loop concurrency c, `c - slots` requests wait (none
//! when c <= slots), whatever the machine's speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::Uri;
use axum::routing::{get, post};
use tokio::sync::Semaphore;

use crate::exporter::Engine;

/// How the server behaves.
#[derive(Debug, Clone, Copy)]
pub struct Queue {
    /// Requests served at once.
    pub slots: usize,
    /// How long each request takes once it runs (its reply comes at the end).
    pub service: Duration,
    /// A request whose client went away is still served (waiting, then
    /// running), like a server that does not abort on disconnect.
    pub serves_abandoned: bool,
}

struct Shared {
    queue: Queue,
    slots: Semaphore,
    waiting: AtomicUsize,
    running: AtomicUsize,
    engine: Mutex<Engine>,
}

/// A running [`Queue`] server on an ephemeral loopback port.
pub struct QueueServer {
    pub addr: SocketAddr,
}

impl QueueServer {
    pub async fn start(queue: Queue) -> Self {
        let shared = Arc::new(Shared {
            queue,
            slots: Semaphore::new(queue.slots),
            waiting: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            engine: Mutex::new(Engine::new()),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/v1/completions", post(complete))
            .route("/v1/models", get(models))
            .route("/metrics", get(metrics))
            .with_state(shared);
        QueueServer {
            addr: crate::exporter::serve(app).await,
        }
    }

    /// The base URL for `--target`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }
}

/// Counts itself in a gauge while it lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn enter(gauge: &'a AtomicUsize) -> Self {
        gauge.fetch_add(1, Ordering::SeqCst);
        Counted(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits for a slot, holds it for the service time, then replies in one
/// piece (a one-token stream).
async fn complete(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
) -> ([(&'static str, &'static str); 1], String) {
    if shared.queue.serves_abandoned {
        // A task of its own outlives the connection's handler.
        let _ = tokio::spawn(serve(shared)).await;
    } else {
        serve(shared).await;
    }
    let delta = if uri.path().contains("chat") {
        r#""delta":{"content":"ok "}"#
    } else {
        r#""text":"ok ""#
    };
    let body = format!(
        "data: {{\"choices\":[{{\"index\":0,{delta},\"finish_reason\":null}}]}}\n\n\
         data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"text\":\"\",\"finish_reason\":\"length\"}}]}}\n\n\
         data: [DONE]\n\n"
    );
    ([("content-type", "text/event-stream")], body)
}

async fn serve(shared: Arc<Shared>) {
    let arrived = Instant::now();
    let waiting = Counted::enter(&shared.waiting);
    let _slot = shared.slots.acquire().await.unwrap();
    drop(waiting);
    let _running = Counted::enter(&shared.running);
    tokio::time::sleep(shared.queue.service).await;
    let mut engine = shared.engine.lock().unwrap();
    engine.observe_ttft(arrived.elapsed().as_secs_f64());
    engine.generation_tokens += 1.0;
}

async fn models() -> ([(&'static str, &'static str); 1], &'static str) {
    (
        [("content-type", "application/json")],
        r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#,
    )
}

async fn metrics(State(shared): State<Arc<Shared>>) -> ([(&'static str, &'static str); 1], String) {
    let mut engine = shared.engine.lock().unwrap().clone();
    engine.waiting = shared.waiting.load(Ordering::SeqCst) as f64;
    engine.running = shared.running.load(Ordering::SeqCst) as f64;
    (
        [("content-type", "text/plain; version=0.0.4")],
        engine.exposition(),
    )
}
