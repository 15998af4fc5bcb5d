//! The HTTP surface: OpenAI-compatible completions and chat completions
//! (streaming as SSE and not), `/v1/models`, `/health`, `/tokenize`,
//! `/metrics`, `/sim/requests`, and the injected faults. Every bad request
//! gets a 4xx with an OpenAI-style error body, never a panic.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use crate::backend::{EngineHandle, FastBackend, Progress, QueueError, TokenSource};
use crate::engine::{NewSeq, SubmitError};
use crate::metrics::FinishedReason;
use crate::prefix::PrefixKey;
use crate::record::{RequestLog, RequestRecord, unix_now};
use crate::tokens::{count_text, mix, output_token, token_ids};

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

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdBatches(Vec<Vec<u32>>),
}

/// The fields both endpoints share (others are accepted and ignored).
#[derive(Deserialize)]
struct Common {
    model: Option<String>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u32>,
    #[allow(dead_code)] // accepted for compatibility; output length is exact anyway
    ignore_eos: Option<bool>,
    min_tokens: Option<u32>,
    /// vLLM's `cache_salt`: requests with different salts share no cached blocks.
    cache_salt: Option<String>,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: Prompt,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize)]
struct TokenizeBody {
    prompt: Option<Prompt>,
    messages: Option<Vec<Message>>,
}

fn chat_text(messages: &[Message]) -> Result<String, String> {
    let mut parts = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if m.role.is_empty() {
            return Err(format!("messages[{i}].role must not be empty"));
        }
        match &m.content {
            None => {}
            Some(Content::Text(t)) => parts.push(t.clone()),
            Some(Content::Parts(ps)) => {
                for p in ps {
                    if p.kind == "text" {
                        parts.push(p.text.clone().unwrap_or_default());
                    }
                }
            }
        }
    }
    Ok(parts.join("\n"))
}

/// Prompt tokens of a completion prompt.
fn prompt_tokens(p: &Prompt) -> Result<(u32, Vec<u32>), String> {
    match p {
        Prompt::Text(t) => Ok((count_text(t), token_ids(t))),
        Prompt::Texts(ts) if ts.len() == 1 => Ok((count_text(&ts[0]), token_ids(&ts[0]))),
        Prompt::Ids(ids) => Ok((u32::try_from(ids.len()).unwrap_or(u32::MAX), ids.clone())),
        Prompt::IdBatches(b) if b.len() == 1 => {
            Ok((u32::try_from(b[0].len()).unwrap_or(u32::MAX), b[0].clone()))
        }
        _ => Err(
            "batched prompts are not supported by the simulator: send one prompt per request"
                .into(),
        ),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Box<Response>> {
    serde_json::from_slice(body)
        .map_err(|e| Box::new(bad_request(format!("invalid request body: {e}"))))
}

async fn tokenize(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let req: TokenizeBody = match parse(&body) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let (count, tokens) = match (&req.prompt, &req.messages) {
        (Some(p), _) => match prompt_tokens(p) {
            Ok(v) => v,
            Err(e) => return bad_request(e),
        },
        (None, Some(m)) => match chat_text(m) {
            Ok(t) => (
                count_text(&t).saturating_add(app.chat_template_tokens),
                token_ids(&t),
            ),
            Err(e) => return bad_request(e),
        },
        (None, None) => return bad_request("give either \"prompt\" or \"messages\""),
    };
    axum::Json(json!({"count": count, "max_model_len": app.max_model_len, "tokens": tokens, "token_strs": null}))
        .into_response()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// A prompt as the prefix cache hashes it.
enum PromptContent {
    Text(String),
    Ids(Vec<u32>),
}

/// A validated generation request.
struct Gen {
    kind: Kind,
    prompt: PromptContent,
    cache_salt: Option<String>,
    prompt_tokens: u32,
    max_tokens: u32,
    finish: FinishedReason,
    stream: bool,
    include_usage: bool,
    /// The first tokens of the reply: an eval question's answer.
    answer: Vec<String>,
}

fn validate(
    app: &App,
    kind: Kind,
    (prompt, prompt_tokens): (PromptContent, u32),
    c: &Common,
) -> Result<Gen, Box<Response>> {
    if let Some(m) = &c.model
        && *m != app.model
    {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!(
                "The model `{m}` does not exist. This server serves `{}`.",
                app.model
            ),
        )));
    }
    if c.n.is_some_and(|n| n != 1) {
        return Err(Box::new(bad_request(
            "n must be 1: the simulator produces one choice per request",
        )));
    }
    let requested = c.max_completion_tokens.or(c.max_tokens);
    if requested == Some(0) {
        return Err(Box::new(bad_request("max_tokens must be at least 1")));
    }
    let max_tokens = requested.unwrap_or(app.default_max_tokens);
    if c.min_tokens.is_some_and(|m| m > max_tokens) {
        return Err(Box::new(bad_request(
            "min_tokens must be less than or equal to max_tokens",
        )));
    }
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(Box::new(bad_request(
            "stream_options can only be given when stream is true",
        )));
    }
    let prompt_tokens = prompt_tokens.max(1);
    let needed = u64::from(prompt_tokens) + u64::from(max_tokens);
    if needed > u64::from(app.max_model_len) {
        return Err(Box::new(bad_request(
            SubmitError::TooLong {
                max_model_len: app.max_model_len,
                needed,
                prompt: prompt_tokens,
                max_tokens,
            }
            .to_string(),
        )));
    }
    Ok(Gen {
        kind,
        prompt,
        cache_salt: c.cache_salt.clone(),
        prompt_tokens,
        max_tokens,
        // Without max_tokens the "model" stops by itself (EOS) after the default length.
        finish: if requested.is_some() {
            FinishedReason::Length
        } else {
            FinishedReason::Stop
        },
        stream,
        include_usage: app.force_include_usage
            || c.stream_options
                .as_ref()
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        answer: Vec::new(),
    })
}

async fn chat_completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let req: ChatBody = match parse(&body) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    if req.messages.is_empty() {
        return bad_request("messages must contain at least one message");
    }
    let text = match chat_text(&req.messages) {
        Ok(t) => t,
        Err(e) => return bad_request(e),
    };
    let prompt_tokens = count_text(&text).saturating_add(app.chat_template_tokens);
    let prompt = (PromptContent::Text(text), prompt_tokens);
    match validate(&app, Kind::Chat, prompt, &req.common) {
        Ok(g) => generate(app, g).await,
        Err(resp) => *resp,
    }
}

async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let req: CompletionBody = match parse(&body) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let (count, ids) = match prompt_tokens(&req.prompt) {
        Ok(v) => v,
        Err(e) => return bad_request(e),
    };
    let content = match req.prompt {
        Prompt::Text(t) => PromptContent::Text(t),
        Prompt::Texts(mut ts) => PromptContent::Text(ts.pop().unwrap_or_default()),
        Prompt::Ids(_) | Prompt::IdBatches(_) => PromptContent::Ids(ids),
    };
    match validate(&app, Kind::Completion, (content, count), &req.common) {
        Ok(g) => generate(app, g).await,
        Err(resp) => *resp,
    }
}

/// Writes the request's timing record when dropped (so an abandoned stream is recorded too).
struct RecordGuard {
    log: RequestLog,
    rec: RequestRecord,
    /// The request counts as in flight until its response ends.
    _in_flight: InFlight,
}

impl Drop for RecordGuard {
    fn drop(&mut self) {
        self.rec.end = unix_now();
        self.log.push(self.rec.clone());
    }
}

fn queue_error(e: QueueError) -> Response {
    match e {
        QueueError::Rejected(e) => bad_request(e.to_string()),
        QueueError::Overloaded { .. } => error(
            StatusCode::TOO_MANY_REQUESTS,
            "RateLimitError",
            e.to_string(),
        ),
        QueueError::ShuttingDown => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            e.to_string(),
        ),
    }
}

async fn generate(app: Arc<App>, mut g: Gen) -> Response {
    let n = app.next.fetch_add(1, Ordering::Relaxed);
    let (in_flight, busy) = InFlight::enter(&app.in_flight);
    g.answer = app.answer(n, &g.prompt, busy);
    let id = match g.kind {
        Kind::Chat => format!("chatcmpl-{n}"),
        Kind::Completion => format!("cmpl-{n}"),
    };
    let mut guard = RecordGuard {
        _in_flight: in_flight,
        log: app.log.clone(),
        rec: RequestRecord {
            id: id.clone(),
            arrival: unix_now(),
            first_token: None,
            end: 0.0,
            prompt_tokens: g.prompt_tokens,
            completion_tokens: 0,
            status: "aborted",
        },
    };
    let f = &app.faults;
    if f.roll(n, 1, f.error_rate) {
        guard.rec.status = "error";
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            "simulated internal error (--fault-error-rate)",
        );
    }
    if f.roll(n, 2, f.reset_rate) {
        guard.rec.status = "reset";
        // A body that fails before its first byte: the connection is closed with no complete response.
        let body = Body::from_stream(futures_util::stream::once(async {
            Err::<Bytes, std::io::Error>(std::io::Error::other("simulated connection reset"))
        }));
        return Response::new(body);
    }
    if f.roll(n, 3, f.stall_rate) {
        tokio::time::sleep(f.stall).await;
    }
    let cut_after = f.roll(n, 4, f.cut_rate).then_some(f.cut_after);

    let new = NewSeq {
        finish: g.finish,
        ..NewSeq::new(n, g.prompt_tokens, g.max_tokens)
    };
    let prefix = prefix_key(&app, &g, n);
    let source = match &app.backend {
        Backend::Aggregate(e) => TokenSource::engine(e, new, prefix),
        Backend::Disaggregated { prefill, decode } => {
            TokenSource::disaggregated(prefill, decode, new, prefix)
        }
        Backend::Fast(b) => Ok(TokenSource::fast(
            b,
            g.prompt_tokens,
            g.max_tokens,
            g.finish,
        )),
    };
    let source = match source {
        Ok(s) => s,
        Err(e) => {
            guard.rec.status = "error";
            return queue_error(e);
        }
    };
    let chunks = Chunks::new(&app, &id, g.kind);
    if g.stream {
        let st = StreamState {
            app,
            g,
            n,
            source,
            chunks,
            sent: 0,
            cut_after,
            cut_pending: false,
            guard,
            done: false,
        };
        let stream = futures_util::stream::unfold(st, |mut st| async move {
            let frame = st.next_frame().await?;
            Some((frame, st))
        });
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| {
                error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalServerError",
                    "response build failed",
                )
            })
    } else {
        complete(app, g, n, source, chunks, guard).await
    }
}

/// The prefix-cache key of request `n`: its prompt followed by the output
/// it will produce (what its KV blocks hold when it ends).
fn prefix_key(app: &App, g: &Gen, n: u64) -> PrefixKey {
    let Some(size) = app.prefix_block_size else {
        return PrefixKey::none();
    };
    let salt = g.cache_salt.as_deref();
    let output: String = (0..g.max_tokens)
        .map(|i| output_token(app.seed, n, i))
        .collect();
    match &g.prompt {
        PromptContent::Text(text) => PrefixKey::of_text(text, &output, size, salt),
        PromptContent::Ids(ids) => PrefixKey::of_ids(ids, &token_ids(&output), size, salt),
    }
}

/// Pre-rendered pieces of the SSE chunks of one response.
struct Chunks {
    /// `data: {...,"choices":[{"index":0,` up to where the choice's fields start.
    head: String,
    id: String,
    kind: Kind,
}

impl Chunks {
    fn new(app: &App, id: &str, kind: Kind) -> Chunks {
        let object = match kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        let head = format!(
            "data: {{\"id\":\"{id}\",\"object\":\"{object}\",\"created\":{},\"model\":{},\"choices\":[{{\"index\":0,",
            unix_now() as u64,
            app.model_json
        );
        Chunks {
            head,
            id: id.to_string(),
            kind,
        }
    }

    fn role(&self, out: &mut String) {
        if self.kind == Kind::Chat {
            out.push_str(&self.head);
            out.push_str("\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
        }
    }

    fn token(&self, out: &mut String, text: &str, finish: Option<&str>) {
        out.push_str(&self.head);
        let fin = match finish {
            Some(f) => format!("\"{f}\""),
            None => "null".into(),
        };
        match self.kind {
            Kind::Chat => {
                out.push_str("\"delta\":{\"content\":\"");
                out.push_str(text);
                out.push_str("\"},\"logprobs\":null,\"finish_reason\":");
                out.push_str(&fin);
                out.push_str("}]}\n\n");
            }
            Kind::Completion => {
                out.push_str("\"text\":\"");
                out.push_str(text);
                out.push_str("\",\"logprobs\":null,\"finish_reason\":");
                out.push_str(&fin);
                out.push_str(",\"stop_reason\":null}]}\n\n");
            }
        }
    }

    /// The final usage chunk; `cached`: the prompt tokens the prefix cache
    /// served, when `--enable-prompt-tokens-details` asks for them (vLLM
    /// leaves the null `prompt_tokens_details` out of stream chunks).
    fn usage(&self, out: &mut String, prompt: u32, completion: u32, cached: Option<u32>) {
        // Same envelope, empty choices.
        let head = self.head.trim_end_matches("{\"index\":0,");
        out.push_str(head);
        out.push_str(&format!(
            "],\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion}",
            prompt + completion
        ));
        if let Some(cached) = cached {
            out.push_str(&format!(
                ",\"prompt_tokens_details\":{{\"cached_tokens\":{cached}}}"
            ));
        }
        out.push_str("}}\n\n");
    }
}

struct StreamState {
    app: Arc<App>,
    g: Gen,
    n: u64,
    source: TokenSource,
    chunks: Chunks,
    sent: u32,
    cut_after: Option<u32>,
    cut_pending: bool,
    guard: RecordGuard,
    done: bool,
}

impl StreamState {
    /// The next piece of the SSE body, `None` at the end.
    async fn next_frame(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        loop {
            if self.done {
                return None;
            }
            if self.cut_pending {
                // Hand control back once before failing the body: hyper flushes what it has
                // buffered only when the body is pending, and an error that follows a chunk
                // at once would drop that chunk with the connection.
                tokio::task::yield_now().await;
                self.done = true;
                return Some(Err(std::io::Error::other("simulated stream cut")));
            }
            let p: Progress = match self.source.next().await {
                Ok(p) => p,
                Err(e) => {
                    self.done = true;
                    self.guard.rec.status = "error";
                    let msg = json!({"error": {"message": e.to_string(), "type": "InternalServerError", "param": null, "code": 500}});
                    return Some(Ok(Bytes::from(format!("data: {msg}\n\ndata: [DONE]\n\n"))));
                }
            };
            let mut out = String::new();
            if self.sent == 0 && p.generated > 0 {
                self.chunks.role(&mut out);
                self.guard.rec.first_token = Some(unix_now());
            }
            let target = p.generated.min(self.g.max_tokens);
            while self.sent < target {
                if self.cut_after.is_some_and(|c| self.sent >= c) {
                    // Deliver what is ready, then fail the body: the connection closes mid-stream.
                    self.guard.rec.status = "cut";
                    self.cut_pending = true;
                    break;
                }
                let last = p.finished && self.sent + 1 == target;
                let finish = last.then_some(match self.g.finish {
                    FinishedReason::Stop => "stop",
                    _ => "length",
                });
                let token = self.app.token(self.n, &self.g.answer, self.sent);
                self.chunks.token(&mut out, token, finish);
                self.sent += 1;
                self.guard.rec.completion_tokens = self.sent;
            }
            if p.finished && !self.cut_pending {
                if self.g.include_usage {
                    let cached = self.app.prompt_tokens_details.then_some(p.cached_tokens);
                    self.chunks
                        .usage(&mut out, self.g.prompt_tokens, self.sent, cached);
                }
                out.push_str("data: [DONE]\n\n");
                self.done = true;
                self.guard.rec.status = "ok";
            }
            if !out.is_empty() {
                return Some(Ok(Bytes::from(out)));
            }
        }
    }
}

async fn complete(
    app: Arc<App>,
    g: Gen,
    n: u64,
    mut source: TokenSource,
    chunks: Chunks,
    mut guard: RecordGuard,
) -> Response {
    let cached_tokens = loop {
        match source.next().await {
            Ok(p) => {
                if guard.rec.first_token.is_none() && p.generated > 0 {
                    guard.rec.first_token = Some(unix_now());
                }
                if p.finished {
                    break p.cached_tokens;
                }
            }
            Err(e) => {
                guard.rec.status = "error";
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalServerError",
                    e.to_string(),
                );
            }
        }
    };
    let text: String = (0..g.max_tokens)
        .map(|i| app.token(n, &g.answer, i))
        .collect();
    guard.rec.completion_tokens = g.max_tokens;
    guard.rec.status = "ok";
    let finish = match g.finish {
        FinishedReason::Stop => "stop",
        _ => "length",
    };
    let usage = json!({
        "prompt_tokens": g.prompt_tokens,
        "total_tokens": g.prompt_tokens + g.max_tokens,
        "completion_tokens": g.max_tokens,
        "prompt_tokens_details": app
            .prompt_tokens_details
            .then(|| json!({"cached_tokens": cached_tokens})),
    });
    let created = unix_now() as u64;
    let body = match g.kind {
        Kind::Chat => json!({
            "id": chunks.id, "object": "chat.completion", "created": created, "model": app.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text, "reasoning_content": null, "tool_calls": []},
                "logprobs": null, "finish_reason": finish, "stop_reason": null,
            }],
            "usage": usage,
        }),
        Kind::Completion => json!({
            "id": chunks.id, "object": "text_completion", "created": created, "model": app.model,
            "choices": [{
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null,
                "prompt_logprobs": null,
            }],
            "usage": usage,
        }),
    };
    axum::Json(body).into_response()
}
