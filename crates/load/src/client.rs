//! The OpenAI-compatible streaming client: builds chat/completions requests,
//! reads the SSE stream to its end and times it.
//!
//! Timing: `sent` is taken just before the request is handed to the HTTP
//! client; TTFT runs to the first chunk carrying content or reasoning text;
//! inter-chunk latencies are the gaps between consecutive text-bearing chunks
//! (chunks that arrive in one network read share its arrival instant); E2E
//! runs to the end of the body. Output tokens come from `usage` when the
//! server sends it, else from the number of text-bearing chunks.
//!
//! Failures (non-2xx with a bounded body excerpt, an `error` event, an
//! unreadable event, a stream that ends without `[DONE]` or a finish reason,
//! a timeout, a transport error) come back as [`Outcome`]s with a reason;
//! they are data, not `Err`.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::sse::{self, Event, SseParser, Usage};

/// Largest excerpt of an error body kept in a record.
pub const ERROR_BODY_EXCERPT: usize = 512;

/// Inter-chunk gaps a request reserves room for up front.
const ITL_PREALLOCATED: usize = 64;

/// Which OpenAI endpoint to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
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
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid header {0:?}: write it as 'Name: value'")]
    Header(String),
    #[error("cannot build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
    #[error(
        "the server at {url} did not answer GET /models within {waited:?} (last error: {last}); \
         start it, check --target, or raise --ready-timeout"
    )]
    NotReady {
        url: String,
        waited: Duration,
        last: String,
    },
    #[error("GET {url} lists no model: pass --model")]
    NoModel { url: String },
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
    /// Base URL ending in `/v1` (no trailing slash).
    pub base: &'a str,
    /// The request URL parsed once, from [`Client::endpoint`] with the same
    /// `base` (parsing it for every request costs more than cloning it);
    /// `None` builds it from `base`.
    pub endpoint: Option<&'a reqwest::Url>,
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
    pub http_status: Option<u16>,
    pub error: Option<String>,
}

/// The shared client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    config: std::sync::Arc<ClientConfig>,
}

#[derive(Serialize)]
struct Body<'a> {
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
        // reqwest is built without a bundled crypto provider: install ring's
        // (a second call finds one installed and changes nothing).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in &config.headers {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ClientError::Header(format!("{name}: {value}")))?;
            let value = reqwest::header::HeaderValue::from_str(value)
                .map_err(|_| ClientError::Header(format!("{name}: {value}")))?;
            headers.append(name, value);
        }
        if let Some(key) = &config.api_key {
            let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| ClientError::Header("Authorization: Bearer <api key>".into()))?;
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .tcp_nodelay(true)
            .pool_max_idle_per_host(usize::MAX)
            .pool_idle_timeout(Duration::from_secs(90))
            .connect_timeout(Duration::from_secs(30).min(config.request_timeout))
            .no_proxy()
            .build()
            .map_err(ClientError::Build)?;
        Ok(Client {
            http,
            config: std::sync::Arc::new(config),
        })
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Polls `GET base/models` until it answers 2xx or `timeout` passes; returns the model ids.
    pub async fn wait_ready(
        &self,
        base: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, ClientError> {
        let url = format!("{base}/models");
        let start = Instant::now();
        let mut last;
        loop {
            match self.models(&url).await {
                Ok(models) => return Ok(models),
                Err(err) => last = err,
            }
            if start.elapsed() >= timeout {
                return Err(ClientError::NotReady {
                    url,
                    waited: timeout,
                    last,
                });
            }
            tracing::debug!("waiting for {url}: {last}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn models(&self, url: &str) -> Result<Vec<String>, String> {
        #[derive(Deserialize)]
        struct Models {
            data: Vec<ModelEntry>,
        }
        #[derive(Deserialize)]
        struct ModelEntry {
            id: String,
        }
        let response = self
            .http
            .get(url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| error_chain(&e))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| error_chain(&e))?;
        if !status.is_success() {
            return Err(format!("HTTP {status}: {}", sse::excerpt(&body, 200)));
        }
        let models: Models =
            serde_json::from_slice(&body).map_err(|e| format!("unreadable model list: {e}"))?;
        Ok(models.data.into_iter().map(|m| m.id).collect())
    }

    /// Asks the server's `/tokenize` (vLLM: at the root, beside `/v1`) how many
    /// tokens `text` is; `None` when the server has no such endpoint.
    pub async fn count_tokens(&self, base: &str, model: &str, text: &str) -> Option<u64> {
        #[derive(Deserialize)]
        struct Tokenized {
            #[serde(default)]
            count: Option<u64>,
            #[serde(default)]
            tokens: Option<Vec<serde_json::Value>>,
        }
        let root = base.strip_suffix("/v1").unwrap_or(base);
        for url in [format!("{root}/tokenize"), format!("{base}/tokenize")] {
            let body =
                serde_json::json!({ "model": model, "prompt": text, "add_special_tokens": false });
            let Ok(response) = self
                .http
                .post(&url)
                .json_body(&body)
                .timeout(Duration::from_secs(10))
                .send()
                .await
            else {
                continue;
            };
            if !response.status().is_success() {
                let _ = response.bytes().await;
                continue;
            }
            let Ok(bytes) = response.bytes().await else {
                continue;
            };
            if let Ok(t) = serde_json::from_slice::<Tokenized>(&bytes)
                && let Some(count) = t.count.or(t.tokens.map(|v| v.len() as u64))
            {
                return Some(count);
            }
        }
        None
    }

    /// The URL [`Client::send`] posts to for `base` (`None` when it does not parse:
    /// the request then fails with reqwest's own message).
    pub fn endpoint(&self, base: &str) -> Option<reqwest::Url> {
        reqwest::Url::parse(&format!("{base}/{}", self.config.api.path())).ok()
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
        let body = Body {
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
        let request = match spec.endpoint {
            Some(url) => self.http.post(url.clone()),
            None => self
                .http
                .post(format!("{}/{}", spec.base, config.api.path())),
        };
        let request = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .body(body);
        let sent = Instant::now();
        outcome.sent = Some(sent);
        let timeout = config.request_timeout;
        match tokio::time::timeout(timeout, read_stream(request, spec.keep_reply, &mut outcome))
            .await
        {
            Ok(()) => {}
            Err(_) => {
                outcome.ok = false;
                outcome.error = Some(format!("timed out after {timeout:?} (--request-timeout)"));
            }
        }
        outcome.end = Some(Instant::now());
        outcome
    }
}

/// Small extension so `json` does not need reqwest's `json` feature.
trait JsonBody {
    fn json_body(self, value: &serde_json::Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, value: &serde_json::Value) -> Self {
        self.header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(value.to_string())
    }
}

async fn read_stream(request: reqwest::RequestBuilder, keep_reply: bool, out: &mut Outcome) {
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            out.error = Some(format!("request failed: {}", error_chain(&err)));
            return;
        }
    };
    let status = response.status();
    out.http_status = Some(status.as_u16());
    if !status.is_success() {
        // Read the whole body (so the connection can be reused) but keep an excerpt.
        let mut excerpt = Vec::new();
        let mut total = 0usize;
        while let Ok(Some(piece)) = response.chunk().await {
            total += piece.len();
            let room = ERROR_BODY_EXCERPT.saturating_sub(excerpt.len());
            excerpt.extend_from_slice(&piece[..piece.len().min(room)]);
        }
        let mut text = String::from_utf8_lossy(&excerpt).into_owned();
        if total > excerpt.len() {
            text.push_str(&format!("… ({total} bytes)"));
        }
        out.error = Some(format!("HTTP {status}: {text}"));
        return;
    }
    let mut parser = SseParser::new();
    let mut state = StreamState::default();
    loop {
        match response.chunk().await {
            Ok(Some(piece)) => {
                let now = Instant::now();
                parser.feed(&piece, |payload| state.event(payload, now, keep_reply, out));
            }
            Ok(None) => break,
            Err(err) => {
                state
                    .error
                    .get_or_insert(format!("stream broken: {}", error_chain(&err)));
                break;
            }
        }
    }
    let now = Instant::now();
    parser.finish(|payload| state.event(payload, now, keep_reply, out));
    out.ok = state.error.is_none() && (state.done || out.finish_reason.is_some());
    if let Some(error) = state.error {
        out.error = Some(error);
    } else if !out.ok {
        out.error =
            Some("stream ended before [DONE] and without a finish reason (truncated)".into());
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

/// An error with its causes (reqwest hides the useful part in `source()`).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
