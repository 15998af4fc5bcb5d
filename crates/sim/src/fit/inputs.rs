//! A fit from run directories to a profile: the server's limits of each
//! engine (given, else read from a saved `/metrics` text and `/v1/models`
//! answer, else from what the runs saved), the prompts' token counts, the
//! time model fitted, and the profile that replays it. Every input a fit
//! still lacks is named in one error, each with what would supply it.

use std::path::{Path, PathBuf};

use crate::engine::TimeModel;
use crate::profile::{EngineSpec, Limits, ServerProfile};

use super::{
    Fit, FitError, FitSettings, Note, PromptCount, RecordedRun, RecordedServer, RecordingError,
    Setting, chat_template_tokens, max_num_seqs, prefill_max_num_seqs, read_recording, read_server,
};

/// What the user says about the server; `None` is read from the runs.
#[derive(Debug, Clone, Default)]
pub struct GivenServer {
    /// A saved `/metrics` text: the KV cache (`vllm:cache_config_info`).
    pub metrics_file: Option<PathBuf>,
    /// A saved `/v1/models` answer: `max_model_len`.
    pub models_file: Option<PathBuf>,
    pub kv_blocks: Option<u32>,
    pub block_size: Option<u32>,
    pub max_num_seqs: Option<u32>,
    pub max_num_batched_tokens: u32,
    pub max_model_len: Option<u32>,
    pub chat_template_tokens: Option<u32>,
    pub chars_per_token: Option<f64>,
}

/// What the fit holds rather than fits: the noise (a recording cannot
/// tell it from the costs) and a disaggregated server's KV transfer (it
/// adds to TTFT as the request overhead does). See [`TimeModel`].
#[derive(Debug, Clone, Copy)]
pub struct Held {
    pub jitter: f64,
    pub drift: f64,
    /// Seconds.
    pub drift_time: f64,
    /// Seconds.
    pub kv_transfer: f64,
    /// Seconds per prompt token.
    pub kv_transfer_per_token: f64,
}

/// A fit to run: the recorded sweeps, the server as given, what is held.
#[derive(Debug, Clone)]
pub struct FitRequest {
    pub runs: Vec<PathBuf>,
    pub server: GivenServer,
    pub held: Held,
    pub name: String,
    pub seed: u64,
    pub max_evaluations: usize,
}

/// A fitted profile, the fit behind it and the notes on both.
#[derive(Debug, Clone)]
pub struct FittedProfile {
    pub fit: Fit,
    pub profile: ServerProfile,
    pub notes: Vec<Note>,
    /// How the runs' prompts were counted (for predicting held-out runs).
    pub count: PromptCount,
}

/// An input the runs did not record and the user did not give.
#[derive(Debug, Clone, PartialEq)]
pub enum Missing {
    /// A run's prompt tokens: no `usage` in its records, no `/tokenize`
    /// measure saved.
    PromptTokens { records: PathBuf },
    /// The tokens the chat template adds to a prompt.
    ChatTemplateTokens,
    /// The KV cache of an engine (`role`: a disaggregated server's engine).
    KvCache { role: Option<String> },
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::PromptTokens { records } => write!(
                f,
                "the prompts' tokens ({} has no `usage`, and the run saved no /tokenize measure)",
                records.display()
            ),
            Missing::ChatTemplateTokens => f.write_str("the tokens the chat template adds"),
            Missing::KvCache { role: Some(role) } => write!(f, "the {role} engine's KV cache"),
            Missing::KvCache { role: None } => f.write_str("the server's KV cache"),
        }
    }
}

/// Why a fit could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum FitInputError {
    #[error("{}", missing_list(.0))]
    Missing(Vec<Missing>),
    #[error(
        "the runs mix a disaggregated server (prefill and decode roles' signals) and a single \
         engine: fit each kind on its own"
    )]
    MixedServers,
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error("cannot read {what} {}", .path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} has no vllm:cache_config_info: is it a vLLM /metrics text?", .0.display())]
    NoCacheConfig(PathBuf),
    #[error("{}: vllm:cache_config_info has no numeric `{label}` label", .path.display())]
    CacheConfigLabel { path: PathBuf, label: &'static str },
    #[error("{} is not a /v1/models answer with data[0].max_model_len", .0.display())]
    NoMaxModelLen(PathBuf),
    #[error("the KV cache's blocks and block size must be at least 1")]
    EmptyKvCache,
    #[error(transparent)]
    Fit(#[from] FitError),
}

fn missing_list(missing: &[Missing]) -> String {
    let items: Vec<String> = missing.iter().map(|m| format!("\n  - {m}")).collect();
    format!(
        "the fit needs what the run(s) did not record:{}",
        items.concat()
    )
}

/// Read the runs, size the engines and fit the time model. Blocking (file
/// reads, then the search: seconds).
pub fn fit_profile(request: &FitRequest) -> Result<FittedProfile, FitInputError> {
    let given = &request.server;
    let recorded = request
        .runs
        .iter()
        .map(|dir| read_server(dir))
        .collect::<Result<Vec<_>, _>>()?;
    let known_template = given
        .chat_template_tokens
        .or_else(|| recorded.iter().find_map(|r| r.chat_template_tokens));
    let count = PromptCount {
        chars_per_token: given
            .chars_per_token
            .or_else(|| recorded.iter().find_map(|r| r.chars_per_token)),
        chat_template_tokens: known_template.unwrap_or(0),
    };
    let mut missing = Vec::new();
    let mut runs = Vec::new();
    let mut sizes = Vec::new();
    for dir in &request.runs {
        let recording = match read_recording(dir, count) {
            Err(RecordingError::NoPromptTokens { file, .. }) => {
                missing.push(Missing::PromptTokens { records: file });
                continue;
            }
            other => other?,
        };
        for skipped in &recording.skipped {
            tracing::warn!("left out: {skipped}");
        }
        sizes.extend(recording.prompt_sizes);
        runs.push(recording.run);
    }
    let template =
        known_template.or_else(|| chat_template_tokens(&sizes).map(|t| t.round() as u32));
    if template.is_none() {
        missing.push(Missing::ChatTemplateTokens);
    }
    // A disaggregated recording (prefill and decode roles' signals) fits a
    // prefill engine and a decode engine, each with its own limits.
    let disaggregated = runs.iter().any(RecordedRun::is_disaggregated);
    if disaggregated && !runs.iter().all(RecordedRun::is_disaggregated) {
        return Err(FitInputError::MixedServers);
    }
    let mut notes = Vec::new();
    let limits = engine_limits(given, &recorded, &runs, disaggregated.then_some("decode"))?;
    let prefill_limits = match disaggregated {
        true => Some(engine_limits(given, &recorded, &runs, Some("prefill"))?),
        false => None,
    };
    let mut take = |limits: EngineLimits| match limits {
        EngineLimits::Known(limits, note) => {
            notes.extend(note);
            Some(limits)
        }
        EngineLimits::Missing(why) => {
            missing.push(why);
            None
        }
    };
    let limits = take(limits);
    let prefill_limits = prefill_limits.and_then(&mut take);
    let (Some(limits), Some(template), true) = (limits, template, missing.is_empty()) else {
        return Err(FitInputError::Missing(missing));
    };
    let settings = FitSettings {
        limits,
        prefill: prefill_limits,
        noise: TimeModel {
            step_overhead: 0.0,
            prefill_per_token: 0.0,
            decode_per_seq: 0.0,
            decode_per_context_token: 0.0,
            request_overhead: 0.0,
            jitter: request.held.jitter,
            drift: request.held.drift,
            drift_time: request.held.drift_time,
            kv_transfer: request.held.kv_transfer,
            kv_transfer_per_token: request.held.kv_transfer_per_token,
        },
        seed: request.seed,
        max_evaluations: request.max_evaluations,
    };
    let stages: usize = runs.iter().map(|r| r.stages.len()).sum();
    tracing::info!(
        "fitting the time model to {stages} stages of {} run(s) (at most {} simulated sweeps)",
        runs.len(),
        request.max_evaluations
    );
    let fit = super::fit(&runs, &settings)?;
    let engine = EngineSpec {
        limits,
        time: fit.time,
    };
    let profile = ServerProfile {
        name: request.name.clone(),
        description: format!(
            "fitted by nyann-bench sim fit from {}",
            request
                .runs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        chat_template_tokens: template,
        default_max_tokens: 256,
        engine,
        // Disaggregated, the decode engine is the base the prefill engine's
        // section differs from.
        prefill: prefill_limits
            .zip(fit.prefill)
            .map(|(limits, time)| EngineSpec { limits, time }),
        decode: disaggregated.then_some(engine),
        disaggregated,
    };
    notes.splice(0..0, fit.notes.iter().cloned());
    Ok(FittedProfile {
        fit,
        profile,
        notes,
        count: PromptCount {
            chat_template_tokens: template,
            ..count
        },
    })
}

impl FittedProfile {
    /// The fitted costs (per engine, side by side when disaggregated) and
    /// the residual of every stage, as the terminal shows them.
    pub fn summary(&self) -> String {
        use std::fmt::Write as _;
        let (fit, profile) = (&self.fit, &self.profile);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "time model fitted over {} simulated sweeps (rms log-ratio {:.3}):",
            fit.evaluations, fit.rms
        );
        let engines: Vec<(&str, TimeModel)> =
            match profile.prefill.filter(|_| profile.disaggregated) {
                Some(prefill) => vec![("prefill", prefill.time), ("decode", profile.engine.time)],
                None => vec![("", profile.engine.time)],
            };
        if engines.len() > 1 {
            let _ = write!(out, "  {:<28}", "");
            for (role, _) in &engines {
                let _ = write!(out, " {role:>10}");
            }
            let _ = writeln!(out);
        }
        let costs = |t: &TimeModel| {
            [
                t.step_overhead,
                t.prefill_per_token,
                t.decode_per_seq,
                t.decode_per_context_token,
                t.request_overhead,
            ]
        };
        for (i, name) in [
            "step_overhead_us",
            "prefill_per_token_us",
            "decode_per_seq_us",
            "decode_per_context_token_us",
            "request_overhead_us",
        ]
        .into_iter()
        .enumerate()
        {
            let _ = write!(out, "  {name:<28}");
            for (_, t) in &engines {
                let _ = write!(out, " {:>10.3}", costs(t)[i] * 1e6);
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(
            out,
            "  chat_template_tokens         {:>10}",
            profile.chat_template_tokens
        );
        let _ = writeln!(
            out,
            "\nresidual per stage (simulated, and its error against the recording):"
        );
        for stage in &fit.residuals {
            let _ = writeln!(out, "  {} {}: {stage}", stage.run, stage.label);
        }
        out
    }
}

/// One engine's limits, or what is missing to know them.
enum EngineLimits {
    /// With a note when `max_num_seqs` was inferred.
    Known(Limits, Option<Note>),
    Missing(Missing),
}

/// The limits of one engine (`role`: a disaggregated server's `prefill` or
/// `decode` engine; `None`, the single one): given values first (for every
/// engine), then the saved server answers (the role's own `/metrics` text;
/// for a single engine, the run's), then what the run directories recorded.
fn engine_limits(
    given: &GivenServer,
    recorded: &[RecordedServer],
    runs: &[RecordedRun],
    role: Option<&str>,
) -> Result<EngineLimits, FitInputError> {
    let role_text = |r: &RecordedServer| {
        let (_, path) = r
            .role_metrics_texts
            .iter()
            .find(|(name, _)| Some(name.as_str()) == role)?;
        Some(path.clone())
    };
    let metrics_file = given
        .metrics_file
        .clone()
        .or_else(|| recorded.iter().find_map(role_text))
        // An engine of a disaggregated server is never sized from another
        // engine's text: the run's is the first role's.
        .or_else(|| {
            role.is_none()
                .then(|| recorded.iter().find_map(|r| r.metrics_text.clone()))
                .flatten()
        });
    let cache = metrics_file.as_deref().map(cache_config).transpose()?;
    // The server's prefix caching as its metrics say (vLLM V1's default, on, without them).
    let enable_prefix_caching = cache.is_none_or(|c| c.prefix_caching);
    let (kv_blocks, block_size) = match (given.kv_blocks, given.block_size, cache) {
        (Some(k), Some(b), _) => (k, b),
        (k, b, Some(c)) => (k.unwrap_or(c.kv_blocks), b.unwrap_or(c.block_size)),
        _ => {
            return Ok(EngineLimits::Missing(Missing::KvCache {
                role: role.map(str::to_string),
            }));
        }
    };
    if kv_blocks == 0 || block_size == 0 {
        return Err(FitInputError::EmptyKvCache);
    }
    let max_model_len = match (given.max_model_len, &given.models_file) {
        (Some(len), _) => Some(len),
        (None, Some(path)) => Some(model_len(path)?),
        (None, None) => recorded.iter().find_map(|r| r.max_model_len),
    };
    let (max_num_seqs, note) = match given.max_num_seqs {
        Some(n) => (n, None),
        None => {
            let (n, why) = if role == Some("prefill") {
                prefill_max_num_seqs(runs, given.max_num_batched_tokens)
            } else {
                max_num_seqs(runs)
            };
            let whose = role.map_or(String::new(), |r| format!("{r} engine's "));
            let note = Note {
                text: format!("{whose}max_num_seqs {n} ({why})"),
                set_by: Some(Setting::MaxNumSeqs),
            };
            (n, Some(note))
        }
    };
    let limits = Limits {
        max_num_seqs: max_num_seqs.max(1),
        max_num_batched_tokens: given.max_num_batched_tokens.max(1),
        kv_blocks,
        block_size,
        max_model_len,
        enable_prefix_caching,
    };
    Ok(EngineLimits::Known(limits, note))
}

/// What a saved `/metrics` text says about the server's KV cache.
#[derive(Clone, Copy)]
struct CacheConfig {
    kv_blocks: u32,
    block_size: u32,
    prefix_caching: bool,
}

/// The KV cache from `vllm:cache_config_info` in a saved `/metrics` text.
/// vLLM counts one null block in `num_gpu_blocks`.
fn cache_config(path: &Path) -> Result<CacheConfig, FitInputError> {
    let text = std::fs::read_to_string(path).map_err(|source| FitInputError::Read {
        what: "the /metrics text",
        path: path.to_path_buf(),
        source,
    })?;
    let parsed = nyann_signals::exposition::parse(&text);
    let info = parsed
        .samples
        .iter()
        .find(|s| s.name == "vllm:cache_config_info" || s.name == "vllm_cache_config_info")
        .ok_or_else(|| FitInputError::NoCacheConfig(path.to_path_buf()))?;
    let number = |label: &'static str| {
        info.label(label)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| FitInputError::CacheConfigLabel {
                path: path.to_path_buf(),
                label,
            })
    };
    let blocks: u32 = number("num_gpu_blocks")?;
    Ok(CacheConfig {
        kv_blocks: blocks.saturating_sub(1).max(1),
        block_size: number("block_size")?,
        prefix_caching: info.label("enable_prefix_caching") != Some("False"),
    })
}

/// `max_model_len` of the first model in a saved `/v1/models` answer.
fn model_len(path: &Path) -> Result<u32, FitInputError> {
    let text = std::fs::read_to_string(path).map_err(|source| FitInputError::Read {
        what: "the /v1/models answer",
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|json| json["data"][0]["max_model_len"].as_u64())
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| FitInputError::NoMaxModelLen(path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disaggregated run that saved only the decode engine's `/metrics`:
    /// the prefill engine's KV cache is missing, and said so, not taken from
    /// the decode engine's text.
    #[test]
    fn an_engine_is_not_sized_from_another_engines_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let decode = dir.path().join("decode-0-end.txt");
        std::fs::write(
            &decode,
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1024\"} 1\n",
        )
        .unwrap();
        let recorded = [RecordedServer {
            metrics_text: Some(decode.clone()),
            role_metrics_texts: vec![("decode".to_string(), decode)],
            ..RecordedServer::default()
        }];
        let given = GivenServer {
            max_num_batched_tokens: 2048,
            ..GivenServer::default()
        };
        let EngineLimits::Known(decode, _) =
            engine_limits(&given, &recorded, &[], Some("decode")).unwrap()
        else {
            panic!("the decode engine is sized from its own text");
        };
        assert_eq!(decode.kv_blocks, 1023);
        let EngineLimits::Missing(missing) =
            engine_limits(&given, &recorded, &[], Some("prefill")).unwrap()
        else {
            panic!("the prefill engine must not be sized from the decode engine's text");
        };
        assert_eq!(
            missing,
            Missing::KvCache {
                role: Some("prefill".into())
            }
        );
    }
}
