//! The OpenAI-compatible streaming client: builds chat/completions requests,
//! reads the SSE stream to its end and times it.
//!
//! Timing: `sent` is taken just before the request is handed to the
//! transport ([`crate::http`]: a pooled connection, or a new one whose
//! connect time then counts); TTFT runs to the arrival of the first chunk
//! carrying content or reasoning text (the kernel's receive timestamp of the
//! read that returned it, else the read itself: see [`crate::http`]);
//! inter-chunk latencies are the gaps between the arrivals of consecutive
//! text-bearing chunks (chunks of one read share its instant); E2E runs to
//! the arrival of the end of the body (the same clock: a client too busy to
//! read at once does not stretch E2E either). Output tokens come from
//! `usage` when the server sends it, else from the number of text-bearing
//! chunks.
//!
//! Failures (non-2xx with a bounded body excerpt, an `error` event, an
//! unreadable event, a stream that ends without `[DONE]` or a finish reason,
//! a JSON body where a stream was asked for, a timeout, a transport error) come back as [`Outcome`]s with a reason;
//! they are data, not `Err`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::http::{HttpError, Proxies, RequestTemplate, Target, TargetError};
use crate::sse::{self, Event, SseParser, Usage};

/// Largest excerpt of an error body kept in a record.
pub const ERROR_BODY_EXCERPT: usize = 512;

/// Longest wait for the answer to a small request (`/models`, `/tokenize`).
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause between two attempts of the readiness wait.
const READY_POLL: Duration = Duration::from_millis(250);

/// Inter-chunk gaps a request reserves room for up front.
const ITL_PREALLOCATED: usize = 64;

/// Which OpenAI endpoint to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `/chat/completions` with a `messages` list.
    #[default]
    Chat,
    /// `/completions` with a text `prompt`.
    Completions,
}

impl Api {
    /// The endpoint below the base URL.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "chat/completions",
            Api::Completions => "completions",
        }
    }
}

/// Settings of the HTTP client shared by every request of a run.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub api: Api,
    pub stream_usage: bool,
    /// Send vLLM's `ignore_eos`/`min_tokens` so outputs have the requested length.
    pub length_extensions: bool,
    pub api_key: Option<String>,
    /// Extra `(name, value)` headers.
    pub headers: Vec<(String, String)>,
    pub request_timeout: Duration,
    /// CA certificates an `https` target may chain to besides the
    /// platform's (`--ca-cert`).
    pub ca_certs: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// Proxies (from the environment: `HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`).
    pub proxies: Proxies,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            api: Api::Chat,
            stream_usage: false,
            length_extensions: true,
            api_key: None,
            headers: Vec::new(),
            request_timeout: Duration::from_secs(600),
            ca_certs: Vec::new(),
            proxies: Proxies::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid header {0:?}: write it as 'Name: value'")]
    Header(String),
    #[error("invalid target URL {base:?}: {reason}")]
    Target { base: String, reason: TargetError },
    /// The caller says what to do (start the server, check the target,
    /// wait longer).
    #[error(
        "the server at {url} did not answer GET /models within {waited:?} (last error: {last})"
    )]
    NotReady {
        url: String,
        waited: Duration,
        last: String,
    },
    /// The caller says how to name the model.
    #[error("GET {url} lists no model")]
    NoModel { url: String },
    /// The model asked for is not among those the server lists: every
    /// request would fail (404), so nothing is sent.
    #[error("model {model:?} is not served at {url} (it serves {})", served.join(", "))]
    UnknownModel {
        model: String,
        url: String,
        served: Vec<String>,
    },
    /// The server's certificate is not trusted: waiting cannot fix that.
    #[error("the server at {url} presented a certificate this client does not trust: {why}")]
    Certificate { url: String, why: String },
    /// `BASE/models` is not found but `BASE/v1/models` answers: the target
    /// lacks the API's `/v1`.
    #[error("{url} is not found (HTTP 404), but {suggested}/models answers")]
    MissingV1 { url: String, suggested: String },
}

/// A user or assistant message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: &'static str,
    pub content: String,
}

/// One request to send.
#[derive(Debug)]
pub struct RequestSpec<'a> {
    pub target: &'a Target,
    /// The streaming request's head, from [`Client::endpoint`] for the same target.
    pub endpoint: &'a RequestTemplate,
    pub model: &'a str,
    /// The conversation so far, ending with the new user message.
    pub messages: &'a [Message],
    pub max_tokens: u32,
    pub cache_salt: Option<&'a str>,
    /// Keep the generated text (needed for multi-turn replay).
    pub keep_reply: bool,
}

/// Everything measured about one request.
#[derive(Debug, Default)]
pub struct Outcome {
    pub ok: bool,
    pub sent: Option<Instant>,
    pub first_token: Option<Instant>,
    pub end: Option<Instant>,
    pub itl: Vec<f64>,
    pub reply: String,
    pub chunks_with_text: u64,
    /// Tokens per text chunk, when the server reports usage in every chunk
    /// (vLLM's `continuous_usage_stats`): deltas of `completion_tokens`.
    pub chunk_tokens: Vec<u32>,
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
    /// The server's id of the response (from its first chunk).
    pub response_id: Option<String>,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    /// `Retry-After` of a 429 or 503 answer.
    pub retry_after: Option<Duration>,
    /// The failure was the client's own (out of file descriptors, ports...).
    pub client_side: bool,
    /// Sent again on a new connection: the kept-alive one had been closed.
    pub resent: bool,
    /// How long after their arrival the response's bytes were read, at
    /// worst (known with kernel receive timestamps only).
    pub lag: Option<Duration>,
}

impl Outcome {
    /// The server refused the request because it is busy (429, or 503 with
    /// `Retry-After`) rather than broken.
    pub fn rejected(&self) -> bool {
        match self.http_status {
            Some(429) => true,
            Some(503) => self.retry_after.is_some(),
            _ => false,
        }
    }
}

/// What a server's `GET /v1/models` answered.
#[derive(Debug, Clone)]
pub struct ServedModels {
    /// The model ids it lists.
    pub ids: Vec<String>,
    /// The whole answer, as it gave it (vLLM's has each model's `max_model_len`).
    pub answer: serde_json::Value,
}

/// The shared client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    config: Arc<ClientConfig>,
    /// `--header`s and the API key, sent with every request.
    headers: Arc<HeaderMap>,
    /// `headers` plus the content type and `Accept` of a streaming request.
    stream_headers: Arc<HeaderMap>,
}

#[derive(Serialize)]
struct CompletionRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<&'a [Message]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<String>,
    max_tokens: u32,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignore_eos: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_salt: Option<&'a str>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

impl Client {
    pub fn new(config: ClientConfig) -> Result<Self, ClientError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let invalid = || ClientError::Header(format!("{name}: {value}"));
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
            let value = HeaderValue::from_str(value).map_err(|_| invalid())?;
            headers.append(name, value);
        }
        if let Some(key) = &config.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| ClientError::Header("Authorization: Bearer <api key>".into()))?;
            headers.insert(header::AUTHORIZATION, value);
        }
        // Servers log it; `--header 'User-Agent: …'` replaces it.
        headers
            .entry(header::USER_AGENT)
            .or_insert(HeaderValue::from_static(concat!(
                "nyann-bench/",
                env!("CARGO_PKG_VERSION")
            )));
        let mut stream_headers = headers.clone();
        stream_headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        stream_headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        Ok(Client {
            config: Arc::new(config),
            headers: Arc::new(headers),
            stream_headers: Arc::new(stream_headers),
        })
    }

    /// The server at base URL `base` (`http://host:port/v1`), with its own
    /// connection pool.
    pub fn target(&self, base: &str) -> Result<Arc<Target>, ClientError> {
        let connect_timeout = Duration::from_secs(30).min(self.config.request_timeout);
        Target::new(
            base,
            connect_timeout,
            &self.config.ca_certs,
            &self.config.proxies,
        )
        .map(Arc::new)
        .map_err(|reason| ClientError::Target {
            base: base.to_string(),
            reason,
        })
    }

    /// The head of the streaming requests [`Client::send`] posts to `target`.
    pub fn endpoint(&self, target: &Target) -> RequestTemplate {
        target.template("POST", self.config.api.path(), &self.stream_headers)
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Polls `GET base/models` until it answers 2xx or `timeout` passes; returns the model ids.
    pub async fn wait_ready(
        &self,
        target: &Target,
        timeout: Duration,
    ) -> Result<ServedModels, ClientError> {
        let url = target.url("models");
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            // No attempt outlasts the whole wait (but each gets a moment).
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = left.clamp(READY_POLL, FETCH_TIMEOUT);
            match self.models(target, attempt).await {
                Ok(models) => return Ok(models),
                Err((Some(404), err)) => {
                    // Not a server still starting: a path that does not exist.
                    // Most often the API's `/v1` is missing from the target.
                    if let Some(suggested) = self.with_v1(target, attempt).await {
                        return Err(ClientError::MissingV1 { url, suggested });
                    }
                    last = err;
                }
                Err((None, err))
                    if err.contains("TLS handshake failed") && err.contains("certificate") =>
                {
                    return Err(ClientError::Certificate { url, why: err });
                }
                Err((_, err)) => last = err,
            }
            if Instant::now() >= deadline {
                return Err(ClientError::NotReady {
                    url,
                    waited: timeout,
                    last,
                });
            }
            tracing::debug!("waiting for {url}: {last}");
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// `target`'s base with `/v1` added, when its `/models` answers there.
    async fn with_v1(&self, target: &Target, timeout: Duration) -> Option<String> {
        let base = &target.base;
        if base.ends_with("/v1") {
            return None;
        }
        let suggested = format!("{base}/v1");
        let alternative = self.target(&suggested).ok()?;
        self.models(&alternative, timeout)
            .await
            .ok()
            .map(|_| suggested)
    }

    /// What `GET base/models` answers; the error carries the HTTP status
    /// when the server answered.
    async fn models(
        &self,
        target: &Target,
        timeout: Duration,
    ) -> Result<ServedModels, (Option<u16>, String)> {
        #[derive(Deserialize)]
        struct Models {
            data: Vec<ModelEntry>,
        }
        #[derive(Deserialize)]
        struct ModelEntry {
            id: String,
        }
        let (status, body) = self
            .fetch(target, "GET", "models", b"", timeout)
            .await
            .map_err(|e| (None, e))?;
        if !(200..300).contains(&status) {
            return Err((
                Some(status),
                format!("{}: {}", status_line(status), sse::excerpt(&body, 200)),
            ));
        }
        let unreadable =
            |e: serde_json::Error| (Some(status), format!("unreadable model list: {e}"));
        let answer: serde_json::Value = serde_json::from_slice(&body).map_err(unreadable)?;
        let models = Models::deserialize(&answer).map_err(unreadable)?;
        Ok(ServedModels {
            ids: models.data.into_iter().map(|m| m.id).collect(),
            answer,
        })
    }

    /// Asks the server's `/tokenize` (vLLM: at the root, beside `/v1`) how many
    /// tokens `text` is; `None` when the server has no such endpoint.
    pub async fn count_tokens(&self, target: &Target, model: &str, text: &str) -> Option<u64> {
        let body =
            serde_json::json!({ "model": model, "prompt": text, "add_special_tokens": false });
        self.tokenize(target, &body).await
    }

    /// Asks `/tokenize` how many tokens `text` is as the one user message of
    /// a chat request, the chat template applied (with the generation
    /// prompt, as `/chat/completions` applies it).
    pub async fn count_chat_tokens(&self, target: &Target, model: &str, text: &str) -> Option<u64> {
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "add_generation_prompt": true,
        });
        self.tokenize(target, &body).await
    }

    async fn tokenize(&self, target: &Target, body: &serde_json::Value) -> Option<u64> {
        #[derive(Deserialize)]
        struct Tokenized {
            #[serde(default)]
            count: Option<u64>,
            #[serde(default)]
            tokens: Option<Vec<serde_json::Value>>,
        }
        let body = body.to_string();
        for path in ["/tokenize", "tokenize"] {
            let Ok((status, bytes)) = self
                .fetch(target, "POST", path, body.as_bytes(), FETCH_TIMEOUT)
                .await
            else {
                continue;
            };
            if (200..300).contains(&status)
                && let Ok(t) = serde_json::from_slice::<Tokenized>(&bytes)
                && let Some(count) = t.count.or(t.tokens.map(|v| v.len() as u64))
            {
                return Some(count);
            }
        }
        None
    }

    /// A small request whose whole response body is wanted within `timeout`.
    async fn fetch(
        &self,
        target: &Target,
        method: &str,
        path: &str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), String> {
        /// Larger answers to these requests are cut (and then unreadable).
        const LIMIT: usize = 16 << 20;
        let mut headers = (*self.headers).clone();
        if method == "POST" {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        let request = target.template(method, path, &headers).with_body(body);
        let exchange = async {
            let mut response = target.send(&request).await?;
            let (body, _) = response.collect(LIMIT).await?;
            let status = response.status;
            response.finish(target);
            Ok::<_, HttpError>((status, body))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {timeout:?}")),
        }
    }

    /// Sends one streaming request and reads it to the end.
    pub async fn send(&self, spec: &RequestSpec<'_>) -> Outcome {
        let config = &*self.config;
        let (messages, prompt) = match config.api {
            Api::Chat => (Some(spec.messages), None),
            Api::Completions => {
                let mut prompt = String::new();
                for m in spec.messages {
                    prompt.push_str(&m.content);
                }
                (None, Some(prompt))
            }
        };
        let body = CompletionRequest {
            model: spec.model,
            messages,
            prompt,
            max_tokens: spec.max_tokens,
            stream: true,
            stream_options: config.stream_usage.then_some(StreamOptions {
                include_usage: true,
            }),
            ignore_eos: config.length_extensions.then_some(true),
            min_tokens: config.length_extensions.then_some(spec.max_tokens),
            cache_salt: spec.cache_salt,
        };
        let mut outcome = Outcome {
            // Room for the gaps of a typical stream without regrowing, but
            // bounded: it is held per request in flight.
            itl: Vec::with_capacity((spec.max_tokens as usize).min(ITL_PREALLOCATED)),
            ..Outcome::default()
        };
        let body = match serde_json::to_vec(&body) {
            Ok(body) => body,
            Err(err) => {
                outcome.error = Some(format!("cannot encode the request: {err}"));
                return outcome;
            }
        };
        let request = spec.endpoint.with_body(&body);
        let sent = Instant::now();
        outcome.sent = Some(sent);
        let timeout = config.request_timeout;
        let exchange = read_stream(spec.target, &request, spec.keep_reply, &mut outcome);
        match tokio::time::timeout(timeout, exchange).await {
            Ok(()) => {}
            Err(_) => {
                outcome.ok = false;
                outcome.end = None;
                outcome.error = Some(format!("timed out after {timeout:?} (the request timeout)"));
            }
        }
        // A complete response ends when its last bytes arrived (the clock of
        // TTFT and ITL); anything else when the client gave up on it.
        outcome.end.get_or_insert_with(Instant::now);
        outcome
    }
}

/// `HTTP 503 Service Unavailable`.
fn status_line(status: u16) -> String {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason());
    match reason {
        Some(reason) => format!("HTTP {status} {reason}"),
        None => format!("HTTP {status}"),
    }
}

async fn read_stream(target: &Target, request: &[u8], keep_reply: bool, out: &mut Outcome) {
    let mut response = match target.send(request).await {
        Ok(response) => response,
        Err(err) => {
            out.client_side = err.is_client_side();
            out.resent = matches!(err, HttpError::Resent(_));
            out.error = Some(format!("request failed: {err}"));
            return;
        }
    };
    out.resent = response.resent;
    let status = response.status;
    out.http_status = Some(status);
    if !(200..300).contains(&status) {
        out.retry_after = response.retry_after;
        // Read the whole body (so the connection can be reused) but keep an excerpt.
        let text = match response.collect(ERROR_BODY_EXCERPT).await {
            Ok((excerpt, total)) => {
                let mut text = String::from_utf8_lossy(&excerpt).into_owned();
                if total > excerpt.len() {
                    text.push_str(&format!("… ({total} bytes)"));
                }
                text
            }
            Err(err) => format!("(body unreadable: {err})"),
        };
        out.lag = response.lag();
        response.finish(target);
        out.error = Some(format!("{}: {text}", status_line(status)));
        return;
    }
    let mut parser = SseParser::new();
    let mut state = StreamState::default();
    let mut body = BodyStart::default();
    loop {
        match response.next_piece().await {
            Ok(Some((at, piece))) => {
                body.see(piece);
                parser.feed(piece, |payload| state.event(payload, at, keep_reply, out));
            }
            Ok(None) => {
                out.end = Some(response.received_at());
                out.lag = response.lag();
                response.finish(target);
                break;
            }
            Err(err) => {
                out.lag = response.lag();
                state.error.get_or_insert(format!("stream broken: {err}"));
                break;
            }
        }
    }
    // An event without its closing blank line ends with the body.
    let end = out.end.unwrap_or_else(Instant::now);
    parser.finish(|payload| state.event(payload, end, keep_reply, out));
    out.ok = state.error.is_none() && (state.done || out.finish_reason.is_some());
    if let Some(error) = state.error {
        out.error = Some(error);
    } else if !out.ok {
        out.error = Some(body.not_a_stream().unwrap_or_else(|| {
            "stream ended before [DONE] and without a finish reason (truncated)".into()
        }));
    }
}

/// The start of a response body, kept only when it is not an event stream
/// (a JSON body where events were asked for): what the server sent instead.
#[derive(Default)]
enum BodyStart {
    /// No byte but white space yet.
    #[default]
    Empty,
    /// Events (or anything else that is not JSON): nothing kept.
    Stream,
    /// A JSON body: its first bytes.
    Json(Vec<u8>),
}

impl BodyStart {
    fn see(&mut self, piece: &[u8]) {
        match self {
            BodyStart::Stream => {}
            BodyStart::Json(start) => {
                let room = ERROR_BODY_EXCERPT.saturating_sub(start.len());
                start.extend_from_slice(&piece[..room.min(piece.len())]);
            }
            BodyStart::Empty => match piece.iter().position(|b| !b.is_ascii_whitespace()) {
                None => {}
                Some(at) if matches!(piece[at], b'{' | b'[') => {
                    *self = BodyStart::Json(Vec::new());
                    self.see(&piece[at..]);
                }
                Some(_) => *self = BodyStart::Stream,
            },
        }
    }

    /// What the server did instead of streaming, when the body says it.
    fn not_a_stream(&self) -> Option<String> {
        let start = match self {
            BodyStart::Stream => return None,
            BodyStart::Empty => {
                return Some("the server answered with an empty body, not an event stream".into());
            }
            BodyStart::Json(start) => start,
        };
        let text = String::from_utf8_lossy(start);
        // The excerpt may end inside the body: its keys, not its parse.
        if text.contains("\"choices\"") {
            return Some(
                "the server answered with a whole completion in one JSON body, not an event \
                 stream: it ignored \"stream\": true (TTFT and ITL need the stream)"
                    .into(),
            );
        }
        let message = serde_json::from_slice::<serde_json::Value>(start)
            .ok()
            .and_then(|j| Some(j.get("error")?.get("message")?.as_str()?.to_string()));
        let cut = if start.len() >= ERROR_BODY_EXCERPT {
            "…"
        } else {
            ""
        };
        Some(match message {
            Some(message) => format!(
                "the server answered with an error in a JSON body, not an event stream: {message}"
            ),
            None => {
                format!("the server answered with a JSON body, not an event stream: {text}{cut}")
            }
        })
    }
}

#[derive(Default)]
struct StreamState {
    done: bool,
    last_text: Option<Instant>,
    error: Option<String>,
}

impl StreamState {
    fn event(&mut self, payload: &[u8], now: Instant, keep_reply: bool, out: &mut Outcome) {
        if self.done || self.error.is_some() {
            return;
        }
        match sse::parse_chunk(payload) {
            Event::Done => self.done = true,
            Event::Error(message) => self.error = Some(message),
            Event::Chunk(chunk) => {
                if out.response_id.is_none()
                    && let Some(id) = &chunk.id
                {
                    out.response_id = Some(id.to_string());
                }
                let has_text = chunk.has_text();
                if has_text {
                    match self.last_text {
                        None => out.first_token = Some(now),
                        Some(last) => out.itl.push(now.duration_since(last).as_secs_f64()),
                    }
                    self.last_text = Some(now);
                    out.chunks_with_text += 1;
                    if keep_reply {
                        out.reply.push_str(&chunk.content);
                    }
                }
                if chunk.finish_reason.is_some() {
                    out.finish_reason = chunk.finish_reason;
                }
                if let Some(usage) = chunk.usage {
                    if has_text && let Some(total) = usage.completion_tokens {
                        let before = out.usage.and_then(|u| u.completion_tokens).unwrap_or(0);
                        out.chunk_tokens.push(total.saturating_sub(before) as u32);
                    }
                    out.usage = Some(usage);
                }
            }
        }
    }
}
