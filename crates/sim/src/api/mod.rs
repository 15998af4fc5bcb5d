//! The HTTP surface: OpenAI-compatible completions and chat completions
//! (streaming as SSE and not), `/v1/models`, `/health`, `/tokenize`,
//! `/metrics`, `/sim/requests`, and the injected faults. Every bad request
//! gets a 4xx with an OpenAI-style error body, never a panic.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use crate::backend::{EngineHandle, FastBackend};
use crate::record::RequestLog;
use crate::tokens::{mix, output_token};

mod generate;
mod request;

use generate::{chat_completions, completions};
use request::{PromptContent, tokenize};

/// Where requests are served.
pub(crate) enum Backend {
    Aggregate(EngineHandle),
    Disaggregated {
        prefill: EngineHandle,
        decode: EngineHandle,
    },
    Fast(Arc<FastBackend>),
}

/// Deterministic fault injection: each decision is a hash of the seed, the
/// request's arrival number and the kind of fault.
#[derive(Debug, Clone)]
pub(crate) struct Faults {
    pub seed: u64,
    pub error_rate: f64,
    pub cut_rate: f64,
    pub cut_after: u32,
    pub stall_rate: f64,
    pub stall: Duration,
    pub reset_rate: f64,
}

impl Faults {
    fn roll(&self, n: u64, salt: u64, rate: f64) -> bool {
        if rate <= 0.0 {
            return false;
        }
        let u = (mix(self.seed ^ mix(n.wrapping_mul(31).wrapping_add(salt))) >> 11) as f64
            / (1u64 << 53) as f64;
        u < rate
    }
}

pub(crate) struct App {
    pub model: String,
    /// The model name as a JSON string literal (quoted, escaped).
    pub model_json: String,
    pub max_model_len: u32,
    /// Tokens the chat template adds to a chat prompt.
    pub chat_template_tokens: u32,
    pub default_max_tokens: u32,
    /// Block size of the engine whose prefix cache prompts are looked up
    /// in; `None` when no engine caches (the fast profile, caching off).
    pub prefix_block_size: Option<u32>,
    /// `--enable-prompt-tokens-details`: usage says how many prompt tokens were cached.
    pub prompt_tokens_details: bool,
    /// `--enable-force-include-usage`: every stream ends with usage.
    pub force_include_usage: bool,
    pub seed: u64,
    pub created: u64,
    pub next: AtomicU64,
    pub backend: Backend,
    pub faults: Faults,
    pub log: RequestLog,
    /// Eval questions it answers (`--eval-gsm8k`, `--eval-gpqa`).
    pub eval: Option<Eval>,
    /// Generation requests being answered now.
    pub in_flight: Arc<AtomicU64>,
}

/// An eval dataset the simulator answers, right with probability `accuracy`.
pub(crate) struct Eval {
    pub set: nyann_datasets::EvalSet,
    pub accuracy: f64,
    /// `(n, accuracy)`: with more than `n` requests in flight, answers are
    /// right with this accuracy instead.
    pub busy: Option<(u64, f64)>,
}

/// Counts a request in flight while it lives.
struct InFlight(Arc<AtomicU64>);

impl InFlight {
    /// Counts one more; returns the guard and the count with it.
    fn enter(counter: &Arc<AtomicU64>) -> (InFlight, u64) {
        let now = counter.fetch_add(1, Ordering::Relaxed) + 1;
        (InFlight(counter.clone()), now)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl App {
    /// The first tokens of request `n`'s reply when its prompt asks one of
    /// the eval questions: the answer, right or not by a seeded roll (with
    /// the busy accuracy when `in_flight` requests are more than its limit).
    fn answer(&self, n: u64, prompt: &PromptContent, in_flight: u64) -> Vec<String> {
        let (Some(eval), PromptContent::Text(text)) = (&self.eval, prompt) else {
            return Vec::new();
        };
        let Some(expected) = eval.set.expected_in(text) else {
            return Vec::new();
        };
        let accuracy = match eval.busy {
            Some((above, busy)) if in_flight > above => busy,
            _ => eval.accuracy,
        };
        let right = !self.faults.roll(n, 5, 1.0 - accuracy);
        eval.set
            .reply(&expected, right)
            .split_whitespace()
            .map(|word| format!(" {word}"))
            .collect()
    }

    /// Token `index` of request `n`'s reply: its answer's, then words.
    fn token<'a>(&self, n: u64, answer: &'a [String], index: u32) -> &'a str {
        match answer.get(index as usize) {
            Some(word) => word,
            None => output_token(self.seed, n, index),
        }
    }
}

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/tokenize", post(tokenize))
        .route("/metrics", get(metrics))
        .route("/sim/requests", get(requests))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(app)
}

/// A router serving only one engine's `/metrics` (disaggregated mode).
pub(crate) fn metrics_router(engine: EngineHandle) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let engine = engine.clone();
                async move {
                    let mut s = String::new();
                    engine.render_metrics(&mut s);
                    exposition(s)
                }
            }),
        )
        .fallback(not_found)
}

fn exposition(body: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"message": message.into(), "type": kind, "param": null, "code": status.as_u16()}});
    (status, axum::Json(body)).into_response()
}

fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "BadRequestError", message)
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "NotFoundError", "no such route")
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": app.model, "object": "model", "created": app.created, "owned_by": "vllm",
            "root": app.model, "parent": null, "max_model_len": app.max_model_len,
        }],
    }))
    .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut s = String::new();
    match &app.backend {
        Backend::Aggregate(e) => e.render_metrics(&mut s),
        Backend::Fast(f) => f.render_metrics(&mut s),
        Backend::Disaggregated { .. } => {
            return error(
                StatusCode::NOT_FOUND,
                "NotFoundError",
                "disaggregated mode: each engine serves /metrics on its own port (printed at start)",
            );
        }
    }
    exposition(s)
}

#[derive(Deserialize)]
struct SinceQuery {
    since: Option<f64>,
}

async fn requests(State(app): State<Arc<App>>, Query(q): Query<SinceQuery>) -> Response {
    axum::Json(app.log.snapshot(q.since)).into_response()
}

// ---- request bodies ----
