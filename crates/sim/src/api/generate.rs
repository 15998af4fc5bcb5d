//! Generation: a validated request through the engine, answered as one
//! JSON body or streamed as SSE chunks, with its record logged.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::backend::{Progress, QueueError, TokenSource};
use crate::engine::NewSeq;
use crate::metrics::FinishedReason;
use crate::prefix::PrefixKey;
use crate::record::{RequestLog, RequestRecord, unix_now};
use crate::tokens::{count_text, output_token, token_ids};

use super::request::{
    ChatBody, CompletionBody, Gen, Kind, Prompt, PromptContent, chat_text, parse, prompt_tokens,
    validate,
};
use super::{App, Backend, InFlight, bad_request, error};

pub(super) async fn chat_completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
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

pub(super) async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
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
pub(super) struct RecordGuard {
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

pub(super) fn queue_error(e: QueueError) -> Response {
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

pub(super) async fn generate(app: Arc<App>, mut g: Gen) -> Response {
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
pub(super) fn prefix_key(app: &App, g: &Gen, n: u64) -> PrefixKey {
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
pub(super) struct Chunks {
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

pub(super) struct StreamState {
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

pub(super) async fn complete(
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
