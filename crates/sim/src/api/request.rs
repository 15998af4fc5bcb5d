//! Request bodies: parsing the OpenAI-style JSON, validating it against
//! the served model, and `/tokenize`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::engine::SubmitError;
use crate::metrics::FinishedReason;
use crate::tokens::{count_text, token_ids};

use super::{App, bad_request, error};

#[derive(Deserialize)]
pub(super) struct StreamOptions {
    pub(super) include_usage: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
pub(super) struct Part {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) text: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct Message {
    pub(super) role: String,
    pub(super) content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdBatches(Vec<Vec<u32>>),
}

/// The fields both endpoints share (others are accepted and ignored).
#[derive(Deserialize)]
pub(super) struct Common {
    pub(super) model: Option<String>,
    pub(super) max_tokens: Option<u32>,
    pub(super) max_completion_tokens: Option<u32>,
    pub(super) stream: Option<bool>,
    pub(super) stream_options: Option<StreamOptions>,
    pub(super) n: Option<u32>,
    #[allow(dead_code)] // accepted for compatibility; output length is exact anyway
    pub(super) ignore_eos: Option<bool>,
    pub(super) min_tokens: Option<u32>,
    /// vLLM's `cache_salt`: requests with different salts share no cached blocks.
    pub(super) cache_salt: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct ChatBody {
    pub(super) messages: Vec<Message>,
    #[serde(flatten)]
    pub(super) common: Common,
}

#[derive(Deserialize)]
pub(super) struct CompletionBody {
    pub(super) prompt: Prompt,
    #[serde(flatten)]
    pub(super) common: Common,
}

#[derive(Deserialize)]
pub(super) struct TokenizeBody {
    pub(super) prompt: Option<Prompt>,
    pub(super) messages: Option<Vec<Message>>,
}

pub(super) fn chat_text(messages: &[Message]) -> Result<String, String> {
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
pub(super) fn prompt_tokens(p: &Prompt) -> Result<(u32, Vec<u32>), String> {
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

pub(super) fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Box<Response>> {
    serde_json::from_slice(body)
        .map_err(|e| Box::new(bad_request(format!("invalid request body: {e}"))))
}

pub(super) async fn tokenize(State(app): State<Arc<App>>, body: Bytes) -> Response {
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
pub(super) enum Kind {
    Chat,
    Completion,
}

/// A prompt as the prefix cache hashes it.
pub(super) enum PromptContent {
    Text(String),
    Ids(Vec<u32>),
}

/// A validated generation request.
pub(super) struct Gen {
    pub(super) kind: Kind,
    pub(super) prompt: PromptContent,
    pub(super) cache_salt: Option<String>,
    pub(super) prompt_tokens: u32,
    pub(super) max_tokens: u32,
    pub(super) finish: FinishedReason,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    /// The first tokens of the reply: an eval question's answer.
    pub(super) answer: Vec<String>,
}

pub(super) fn validate(
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
