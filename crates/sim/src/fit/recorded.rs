//! Reads a run directory (what a sweep saved) back into what the fit needs: per measured closed-loop stage its level, length,
//! client statistics and server signals (`stages.json`), and the mean prompt
//! and output tokens of its requests (`requests.jsonl`).
//!
//! Only the fields the fit uses are read, so files written by older or newer
//! versions load as long as those fields are there; a missing or unreadable
//! file is an error naming the file.

use std::collections::BTreeMap;
use std::path::Path;

use std::path::PathBuf;

use nyann_model::{ClientStats, RoleSignals};
use nyann_results::{ReadError, RecordError, RunDir};
use serde::Deserialize;

use super::{RecordedRun, RecordedStage};

/// Why a run directory cannot be fitted.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Records(#[from] RecordError),
    #[error(
        "{} holds no {}: the fit needs each request's prompt and output tokens",
        dir.display(),
        nyann_results::REQUESTS
    )]
    NoRecords { dir: PathBuf },
    /// Prompt tokens neither reported by the server (`usage`) nor countable
    /// from characters ([`PromptCount::chars_per_token`] not given).
    #[error("{}: stage {stage} has requests without prompt token counts", file.display())]
    NoPromptTokens { file: PathBuf, stage: String },
    #[error("{} has no measured closed-loop stage with token counts to fit{}", dir.display(), why(skipped))]
    NothingToFit { dir: PathBuf, skipped: Vec<String> },
}

fn why(skipped: &[String]) -> String {
    if skipped.is_empty() {
        String::new()
    } else {
        format!(" ({})", skipped.join("; "))
    }
}

/// One entry of `stages.json`, as far as the fit is concerned.
#[derive(Deserialize)]
struct StageEntry {
    index: usize,
    label: String,
    status: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    concurrency: Option<u32>,
    duration_s: f64,
    #[serde(default)]
    client: Option<ClientStats>,
    #[serde(default)]
    annotation: Option<Annotation>,
}

/// The congestion check's record of a stage (`annotation.congestion`), as
/// far as the fit is concerned: the signals it read.
#[derive(Deserialize)]
struct Annotation {
    congestion: Congestion,
}

#[derive(Deserialize)]
struct Congestion {
    roles: Vec<RoleSignals>,
    #[serde(default)]
    signal_errors: Vec<String>,
    /// The `until_congested(...)` parameters as written.
    #[serde(default)]
    params: Vec<Param>,
}

#[derive(Deserialize)]
struct Param {
    name: String,
    value: serde_json::Value,
}

/// The `until_congested(...)` parameters the first judged stage of the run
/// in `dir` was judged with, as written (`"1s"`, `8.0`...): empty when no
/// stage was judged.
pub fn judged_params(dir: &Path) -> Result<Vec<(String, serde_json::Value)>, RecordingError> {
    let entries: Vec<StageEntry> = RunDir::open(dir)?.stages()?;
    Ok(entries
        .into_iter()
        .find_map(|e| e.annotation)
        .map(|a| a.congestion.params)
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name, p.value))
        .collect())
}

/// One line of `requests.jsonl`, as far as the fit is concerned.
#[derive(Deserialize)]
struct RequestLine {
    stage: usize,
    phase: String,
    status: String,
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    prompt_chars: usize,
}

/// A results directory read back.
pub struct Recording {
    pub run: RecordedRun,
    /// (prompt characters, prompt tokens the server counted) of every
    /// measured request: how the fit estimates the chat template's tokens.
    pub prompt_sizes: Vec<(f64, f64)>,
    /// Stages left out, and why.
    pub skipped: Vec<String>,
}

/// Token sums of one stage's measured, successful requests.
#[derive(Default)]
struct Tokens {
    requests: u64,
    output: u64,
    /// Requests whose prompt tokens the server reported (`usage`), and their sum.
    with_usage: u64,
    prompt: u64,
    prompt_chars: u64,
}

/// How to count prompt tokens when the server did not report them (a sweep
/// without `--stream-usage`): characters per token of the server's
/// tokenizer, plus the chat template's tokens.
#[derive(Debug, Clone, Copy)]
pub struct PromptCount {
    pub chars_per_token: Option<f64>,
    pub chat_template_tokens: u32,
}

impl Tokens {
    /// Mean prompt tokens per request, from usage or from characters.
    fn prompt_mean(&self, count: PromptCount) -> Option<f64> {
        if self.with_usage == self.requests {
            return Some(self.prompt as f64 / self.requests as f64);
        }
        let chars = self.prompt_chars as f64 / self.requests as f64;
        count
            .chars_per_token
            .map(|k| chars / k + f64::from(count.chat_template_tokens))
    }
}

/// Read `dir` (its `stages.json` and `requests.jsonl`).
pub fn read_recording(dir: &Path, count: PromptCount) -> Result<Recording, RecordingError> {
    let run_dir = RunDir::open(dir)?;
    let entries: Vec<StageEntry> = run_dir.stages()?;
    let Requests {
        tokens,
        prompt_sizes,
    } = read_requests(&run_dir)?;

    let mut stages = Vec::new();
    let mut skipped = Vec::new();
    for e in entries {
        let skip = |why: &str| format!("{} {}: {why}", dir.display(), e.label);
        if e.status != "measured" {
            continue;
        }
        let (Some(concurrency), Some(client)) = (e.concurrency, e.client.clone()) else {
            skipped.push(skip(
                "not a closed-loop stage (the fit replays concurrency levels)",
            ));
            continue;
        };
        if e.mode.as_deref().is_some_and(|m| m != "concurrent") {
            skipped.push(skip(
                "not a closed-loop stage (the fit replays concurrency levels)",
            ));
            continue;
        }
        let Some(t) = tokens.get(&e.index).filter(|t| t.requests > 0) else {
            skipped.push(skip(
                "no successful request with token counts in requests.jsonl",
            ));
            continue;
        };
        let Some(prompt_tokens) = t.prompt_mean(count) else {
            return Err(RecordingError::NoPromptTokens {
                file: run_dir.file(nyann_results::REQUESTS),
                stage: e.label,
            });
        };
        let (server, prefill) = server_signals(e.annotation.as_ref());
        stages.push(RecordedStage {
            label: e.label.clone(),
            concurrency,
            duration_s: e.duration_s,
            prompt_tokens,
            output_tokens: t.output as f64 / t.requests as f64,
            client,
            server,
            prefill,
        });
    }
    if stages.is_empty() {
        return Err(RecordingError::NothingToFit {
            dir: dir.to_path_buf(),
            skipped,
        });
    }
    Ok(Recording {
        run: RecordedRun {
            name: dir.display().to_string(),
            stages,
        },
        prompt_sizes,
        skipped,
    })
}

/// What `requests.jsonl` tells the fit.
struct Requests {
    /// Per stage index, the token sums of its measured successful requests.
    tokens: BTreeMap<usize, Tokens>,
    /// (prompt characters, prompt tokens) of those with usage.
    prompt_sizes: Vec<(f64, f64)>,
}

fn read_requests(dir: &RunDir) -> Result<Requests, RecordingError> {
    let Some(records) = dir.records::<RequestLine>()? else {
        return Err(RecordingError::NoRecords {
            dir: dir.path().to_path_buf(),
        });
    };
    let mut tokens: BTreeMap<usize, Tokens> = BTreeMap::new();
    let mut sizes = Vec::new();
    for record in records {
        let r = record?;
        let Some(output) = r.output_tokens else {
            continue;
        };
        if r.phase != "measured" || r.status != "ok" {
            continue;
        }
        let t = tokens.entry(r.stage).or_default();
        t.requests += 1;
        t.output += output;
        t.prompt_chars += r.prompt_chars as u64;
        if let Some(prompt) = r.prompt_tokens {
            t.with_usage += 1;
            t.prompt += prompt;
            sizes.push((r.prompt_chars as f64, prompt as f64));
        }
    }
    Ok(Requests {
        tokens,
        prompt_sizes: sizes,
    })
}

/// The server signals of a judged stage: its `aggregate` role, or its only
/// role; with the roles of a disaggregated server, its `decode` role (the
/// engine the client reads its tokens from) and its `prefill` role. None
/// when a query failed: the failed signals read 0 (fail-open), which is no
/// measurement.
fn server_signals(annotation: Option<&Annotation>) -> (Option<RoleSignals>, Option<RoleSignals>) {
    let Some(congestion) = annotation.map(|a| &a.congestion) else {
        return (None, None);
    };
    if !congestion.signal_errors.is_empty() {
        return (None, None);
    }
    let roles = &congestion.roles;
    let role = |name: &str| roles.iter().find(|r| r.role == name).cloned();
    match roles.as_slice() {
        // A stage that read only the prefill role still is the prefill engine's.
        [only] if only.role == "prefill" => (None, Some(only.clone())),
        [only] => (Some(only.clone()), None),
        _ if role("aggregate").is_none()
            && role("prefill").is_some()
            && role("decode").is_some() =>
        {
            (role("decode"), role("prefill"))
        }
        _ => (role("aggregate"), None),
    }
}

/// What a run saved about its server besides the records (`server.json`
/// and `metrics/`, written by runs since they existed): the inputs of a fit
/// that are not fitted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedServer {
    /// `max_model_len` of the first model of the first target's `/v1/models`.
    pub max_model_len: Option<u32>,
    /// Characters per token `/tokenize` measured on the first workload.
    pub chars_per_token: Option<f64>,
    /// Tokens the chat template added to a message (`/tokenize`).
    pub chat_template_tokens: Option<u32>,
    /// A saved `/metrics` text (at the end of the run, else its start; the
    /// `aggregate` role's, else the first).
    pub metrics_text: Option<PathBuf>,
    /// Each role's saved `/metrics` text (at the end of the run, else its
    /// start), by role: a disaggregated server's engines' KV caches.
    pub role_metrics_texts: Vec<(String, PathBuf)>,
}

/// `server.json`, as far as the fit is concerned.
#[derive(Deserialize)]
struct ServerFile {
    #[serde(default)]
    targets: Vec<TargetFile>,
    #[serde(default)]
    tokenizer: Vec<TokenizerFile>,
}

#[derive(Deserialize)]
struct TargetFile {
    models: serde_json::Value,
}

#[derive(Deserialize)]
struct TokenizerFile {
    chars_per_token: f64,
    #[serde(default)]
    chat_template_tokens: Option<u32>,
}

/// Reads what `dir` saved about its server (nothing for older runs).
pub fn read_server(dir: &Path) -> Result<RecordedServer, RecordingError> {
    let run_dir = RunDir::open(dir)?;
    let file: Option<ServerFile> = run_dir.server()?;
    let metrics_text = ["end", "start"].iter().find_map(|moment| {
        let texts = run_dir.metrics_texts(moment);
        let aggregate = texts.iter().position(|(role, _)| role == "aggregate");
        texts
            .into_iter()
            .nth(aggregate.unwrap_or(0))
            .map(|(_, path)| path)
    });
    let mut role_metrics_texts = run_dir.metrics_texts("end");
    for (role, path) in run_dir.metrics_texts("start") {
        if !role_metrics_texts.iter().any(|(r, _)| *r == role) {
            role_metrics_texts.push((role, path));
        }
    }
    let Some(file) = file else {
        return Ok(RecordedServer {
            metrics_text,
            role_metrics_texts,
            ..RecordedServer::default()
        });
    };
    let max_model_len = file
        .targets
        .first()
        .and_then(|t| t.models["data"][0]["max_model_len"].as_u64())
        .and_then(|v| u32::try_from(v).ok());
    let tokenizer = file.tokenizer.first();
    Ok(RecordedServer {
        max_model_len,
        chars_per_token: tokenizer
            .map(|t| t.chars_per_token)
            .filter(|k| k.is_finite() && *k > 0.0),
        chat_template_tokens: tokenizer.and_then(|t| t.chat_template_tokens),
        metrics_text,
        role_metrics_texts,
    })
}

/// Tokens the chat template adds, from how the server's prompt token count
/// grows with the prompt's characters (`tokens = template + chars / k`):
/// `None` unless the prompts had at least two lengths far enough apart.
pub fn chat_template_tokens(sizes: &[(f64, f64)]) -> Option<f64> {
    let n = sizes.len() as f64;
    if n < 2.0 {
        return None;
    }
    let (mx, my) = (
        sizes.iter().map(|s| s.0).sum::<f64>() / n,
        sizes.iter().map(|s| s.1).sum::<f64>() / n,
    );
    let sxx: f64 = sizes.iter().map(|s| (s.0 - mx).powi(2)).sum();
    let sxy: f64 = sizes.iter().map(|s| (s.0 - mx) * (s.1 - my)).sum();
    // The characters must vary by more than a few tokens' worth.
    if sxx / n < 100.0 {
        return None;
    }
    let slope = sxy / sxx;
    Some((my - slope * mx).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_tokens_are_the_intercept_of_tokens_over_characters() {
        // 4 characters per token, 16 template tokens, two prompt lengths.
        let sizes: Vec<(f64, f64)> = [240.0, 2000.0]
            .iter()
            .flat_map(|&c| std::iter::repeat_n((c, 16.0 + c / 4.0), 10))
            .collect();
        let t = chat_template_tokens(&sizes).unwrap();
        assert!((t - 16.0).abs() < 1e-6, "{t}");
        // One length: not identifiable.
        assert_eq!(chat_template_tokens(&sizes[..10]), None);
    }

    #[test]
    fn a_disaggregated_stage_gives_the_decode_role_and_the_prefill_role() {
        let annotation = |roles: &[&str]| -> Annotation {
            let roles: Vec<RoleSignals> = roles
                .iter()
                .map(|name| RoleSignals {
                    role: (*name).into(),
                    ..RoleSignals::default()
                })
                .collect();
            serde_json::from_value(serde_json::json!({"congestion": {"roles": roles}})).unwrap()
        };
        let roles = |names: &[&str]| {
            let (server, prefill) = server_signals(Some(&annotation(names)));
            (server.map(|s| s.role), prefill.map(|s| s.role))
        };
        assert_eq!(
            roles(&["prefill", "decode"]),
            (Some("decode".into()), Some("prefill".into()))
        );
        // One engine, whatever its name; an aggregate among others.
        assert_eq!(roles(&["decode"]), (Some("decode".into()), None));
        assert_eq!(
            roles(&["prefill", "aggregate"]),
            (Some("aggregate".into()), None)
        );
    }

    #[test]
    fn a_stage_whose_signal_query_failed_has_no_server_figures() {
        let role = |name: &str| RoleSignals {
            role: name.into(),
            waiting_requests_p50: 3.0,
            ..RoleSignals::default()
        };
        let annotation = |errors: &[&str]| -> Annotation {
            serde_json::from_value(serde_json::json!({"congestion": {
                "policy": {"name": "builtin", "version": "0.1.0", "origin": "builtin"},
                "mode": "enforce",
                "roles": [role("prefill"), role("aggregate")],
                "signal_errors": errors,
                "verdict": null,
                "policy_error": null,
                "check_seconds": 0.0,
            }}))
            .unwrap()
        };
        assert_eq!(
            server_signals(Some(&annotation(&[]))).0,
            Some(role("aggregate"))
        );
        // The failed signal read 0: fitting to it would fit a server with no queue.
        assert_eq!(
            server_signals(Some(&annotation(&["aggregate: waiting: timeout"]))).0,
            None
        );
        assert_eq!(server_signals(None).0, None);
    }
}
