//! Before any load: wait for each target, resolve the model of each stage,
//! build the prompt generators and calibrate characters per token (once per
//! workload, target and model), and keep what the servers said about
//! themselves ([`ServerFacts`], the run directory's `server.json`).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use nyann_model::{CacheSalt, Scenario, Slo, Step, Workload, WorkloadType};
use serde::Serialize;

use crate::client::{Api, Client, ClientError};
use crate::http::{RequestTemplate, Target};
use crate::runner::{DEFAULT_TARGET, RunError, RunOptions};
use crate::workload::{DatasetShare, PromptGen};

/// Per-stage request settings, resolved once before the run.
#[derive(Debug)]
pub(super) struct StageSettings {
    pub(super) target: Arc<Target>,
    /// The head of every streaming request to `target`, rendered once.
    pub(super) endpoint: RequestTemplate,
    pub(super) model: String,
    pub(super) prompts: Arc<PromptGen>,
    pub(super) first_chars: usize,
    pub(super) later_chars: usize,
    pub(super) osl: u32,
    pub(super) turns: u32,
    pub(super) cache_salt: Option<CacheSalt>,
    /// The goals its requests are judged by.
    pub(super) slo: Option<Slo>,
}

impl StageSettings {
    /// How many turns `conversation` has: the workload's `turns`, or
    /// fewer for a ShareGPT conversation with fewer exchanges.
    pub(super) fn turns_of(&self, conversation: u64) -> u32 {
        self.prompts
            .turns(conversation)
            .map_or(self.turns, |turns| turns.clamp(1, self.turns))
    }

    /// `max_tokens` of this conversation's turn: the workload's `osl`, or
    /// a ShareGPT conversation's recorded reply length.
    pub(super) fn max_tokens(&self, conversation: u64, turn: u32) -> u32 {
        self.prompts
            .max_tokens(conversation, turn)
            .unwrap_or(self.osl)
    }
}

pub(super) struct Prepared {
    pub(super) per_step: Vec<Option<Arc<StageSettings>>>,
    pub(super) models: Vec<String>,
    pub(super) targets: Vec<String>,
    pub(super) facts: ServerFacts,
}

/// What the servers said about themselves before the run, saved as the
/// run directory's `server.json`: what `sim fit` needs besides the
/// records, asked while the server is at hand.
#[derive(Debug, Clone, Serialize)]
pub struct ServerFacts {
    pub schema_version: u32,
    /// Each target's `GET /v1/models` answer (vLLM's gives `max_model_len`).
    pub targets: Vec<TargetFacts>,
    /// What each server's `/tokenize` measured, per model and workload
    /// (none when it has no `/tokenize`).
    pub tokenizer: Vec<TokenizerFacts>,
}

/// The version of `server.json` this build writes.
pub const SERVER_FACTS_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize)]
pub struct TargetFacts {
    /// The base URL, up to `/v1`.
    pub url: String,
    pub models: serde_json::Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenizerFacts {
    pub target: String,
    pub model: String,
    /// The workload's type (`synthetic`, `sharegpt`...).
    pub workload: String,
    /// Characters per token of the workload's own text.
    pub chars_per_token: f64,
    /// Tokens the server adds to a prompt sent as one chat message (its
    /// chat template and generation prompt); 0 with `--api completions`,
    /// which sends the text as it is.
    pub chat_template_tokens: Option<u64>,
}

/// Waits for each target, resolves models, builds generators and calibrates
/// characters per token (once per workload, target and model).
pub(super) async fn prepare(
    scenario: &Scenario,
    options: &RunOptions,
    client: &Client,
) -> Result<Prepared, RunError> {
    // Per base URL: the target (one connection pool each) and its model list.
    let mut ready: HashMap<String, (Arc<Target>, Vec<String>)> = HashMap::new();
    let mut generators: Vec<(Workload, Arc<PromptGen>)> = Vec::new();
    let mut cpt: HashMap<(String, String, String), f64> = HashMap::new();
    // ShareGPT replays once tokens are counted (by the same key).
    let mut calibrated: HashMap<(String, String, String), Arc<PromptGen>> = HashMap::new();
    let mut per_step = Vec::with_capacity(scenario.steps.len());
    let mut models = Vec::new();
    let mut targets = Vec::new();
    let mut facts = ServerFacts {
        schema_version: SERVER_FACTS_VERSION,
        targets: Vec::new(),
        tokenizer: Vec::new(),
    };
    for (index, step) in scenario.steps.iter().enumerate() {
        let Step::Stage(stage) = step else {
            per_step.push(None);
            continue;
        };
        let base = stage
            .target
            .clone()
            .or_else(|| options.target.clone())
            .or_else(|| scenario.target.clone())
            .unwrap_or_else(|| DEFAULT_TARGET.to_string());
        let base = base.trim_end_matches('/').to_string();
        let (target, listed) = match ready.entry(base.clone()) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(new) => {
                let target = client.target(&base)?;
                tracing::info!(
                    "waiting for {} (up to {:?})",
                    target.url("models"),
                    options.ready_timeout
                );
                let served = client.wait_ready(&target, options.ready_timeout).await?;
                targets.push(base.clone());
                facts.targets.push(TargetFacts {
                    url: base.clone(),
                    models: served.answer,
                });
                new.insert((target, served.ids))
            }
        };
        let model = match stage
            .model
            .clone()
            .or_else(|| options.model.clone())
            .or_else(|| scenario.model.clone())
        {
            Some(model) => model,
            None => {
                let first = listed
                    .first()
                    .ok_or_else(|| ClientError::NoModel {
                        url: target.url("models"),
                    })?
                    .clone();
                if models.is_empty() {
                    tracing::info!("model: {first} (auto-detected from {base}/models)");
                }
                first
            }
        };
        // A model the server does not list would get 404s: refuse before
        // any load. (An empty list says nothing: the server may route any.)
        if !listed.is_empty() && !listed.contains(&model) {
            return Err(ClientError::UnknownModel {
                model,
                url: target.url("models"),
                served: listed.clone(),
            }
            .into());
        }
        if !models.contains(&model) {
            models.push(model.clone());
        }
        let workload = stage
            .workload
            .clone()
            .unwrap_or_else(|| scenario.workload.clone());
        let prompts = match generators.iter().find(|(w, _)| same_text(w, &workload)) {
            Some((_, prompts)) => prompts.clone(),
            None => {
                let prompts = Arc::new(PromptGen::new(
                    &workload,
                    options.seed,
                    options
                        .dataset_share
                        .unwrap_or(DatasetShare::whole(options.seed)),
                )?);
                generators.push((workload.clone(), prompts.clone()));
                prompts
            }
        };
        if let Some(questions) = prompts.eval_questions()
            && stage.max_requests > questions as u64
        {
            tracing::warn!(
                "stage {}: max_requests {} is more than the dataset's {questions} questions \
                 (this process's share): questions are asked again, up to {} times each, and \
                 every reply is scored (give at most {questions} to ask each once)",
                stage.label(index),
                stage.max_requests,
                stage.max_requests.div_ceil(questions as u64),
            );
        }
        let key = (text_key(&workload), base.clone(), model.clone());
        let chars_per_token = match cpt.get(&key) {
            Some(v) => *v,
            None => {
                let sample = prompts.calibration_text();
                let (v, tokens) = calibrate(
                    client,
                    target,
                    &model,
                    &sample,
                    &workload,
                    &stage.label(index),
                )
                .await;
                if let Some(tokens) = tokens {
                    facts.tokenizer.push(TokenizerFacts {
                        target: base.clone(),
                        model: model.clone(),
                        workload: workload.kind.name().to_string(),
                        chars_per_token: v,
                        chat_template_tokens: template_tokens(
                            client, target, &model, &sample, tokens,
                        )
                        .await,
                    });
                }
                cpt.insert(key.clone(), v);
                v
            }
        };
        let prompts = if prompts.needs_calibration() {
            match calibrated.entry(key) {
                Entry::Occupied(known) => known.get().clone(),
                Entry::Vacant(new) => new
                    .insert(Arc::new(prompts.calibrated(chars_per_token)?))
                    .clone(),
            }
        } else {
            prompts
        };
        let chars = |tokens: u32| (tokens as f64 * chars_per_token).round() as usize;
        per_step.push(Some(Arc::new(StageSettings {
            endpoint: client.endpoint(target),
            target: target.clone(),
            model,
            prompts,
            first_chars: chars(workload.isl),
            later_chars: chars(workload.subsequent_isl.unwrap_or(workload.isl)),
            osl: workload.osl,
            turns: workload.turns.max(1),
            cache_salt: workload.cache_salt.clone(),
            slo: stage.slo,
        })));
    }
    Ok(Prepared {
        per_step,
        models,
        targets,
        facts,
    })
}

/// Workloads that produce the same text share a generator and a
/// calibration: the same type, reading the same files the same way (a
/// ShareGPT replay keeps as many turns of each conversation as it sends).
fn same_text(a: &Workload, b: &Workload) -> bool {
    a.kind == b.kind
        && a.corpus_path == b.corpus_path
        && a.path == b.path
        && a.train_path == b.train_path
        && a.fewshot == b.fewshot
        && (a.kind != WorkloadType::ShareGpt || a.turns == b.turns)
}

/// What a calibration (and a ShareGPT replay's selection) depends on.
fn text_key(w: &Workload) -> String {
    format!(
        "{:?}:{}:{}:{}:{}:{}:{}:{}:{}",
        w.kind,
        w.corpus_path.as_deref().unwrap_or(""),
        w.path.as_deref().unwrap_or(""),
        w.train_path.as_deref().unwrap_or(""),
        w.fewshot,
        if w.kind == WorkloadType::ShareGpt {
            w.turns
        } else {
            0
        },
        w.max_isl,
        w.max_osl,
        w.chars_per_token
    )
}

/// Tokens the chat template adds to `sample` (`bare` tokens on its own)
/// sent as one message: `/tokenize` of the message less `bare`.
async fn template_tokens(
    client: &Client,
    target: &Target,
    model: &str,
    sample: &str,
    bare: u64,
) -> Option<u64> {
    if client.config().api == Api::Completions {
        return Some(0);
    }
    let chat = client.count_chat_tokens(target, model, sample).await?;
    let added = chat.saturating_sub(bare);
    tracing::debug!("the chat template adds {added} tokens (/tokenize)");
    Some(added)
}

/// Characters per token of the workload's text `sample`, and its tokens
/// when the server's `/tokenize` counted them; without `/tokenize`, the
/// workload's `chars_per_token`, else 4.0.
async fn calibrate(
    client: &Client,
    target: &Target,
    model: &str,
    sample: &str,
    workload: &Workload,
    label: &str,
) -> (f64, Option<u64>) {
    if let Some(count) = client.count_tokens(target, model, sample).await
        && count > 0
    {
        {
            let v = sample.len() as f64 / count as f64;
            tracing::info!(
                "ISL calibration ({label}, {:?}): {v:.3} characters per token, measured with /tokenize",
                workload.kind
            );
            return (v, Some(count));
        }
    }
    if workload.chars_per_token > 0.0 {
        tracing::info!(
            "ISL calibration ({label}): the server has no /tokenize; using the workload's chars_per_token = {}",
            workload.chars_per_token
        );
        (workload.chars_per_token, None)
    } else {
        tracing::info!(
            "ISL calibration ({label}): the server has no /tokenize and the workload sets no chars_per_token; \
             assuming 4.0 characters per token (prompt lengths are approximate)"
        );
        (4.0, None)
    }
}
