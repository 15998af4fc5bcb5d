//! Fit a time model to recorded sweeps: find the [`TimeModel`] whose
//! simulated sweep ([`crate::sweep`]), with the same stages, workload and
//! limits, measures what the real server measured.
//!
//! The fit minimises the squared log-ratios between the simulated and the
//! recorded figures of every stage (output tokens/s, client TTFT p50 and
//! p99, ITL p50, E2E p50, and the server's waiting p50, TTFT p99 and
//! preemptions when they were read), with the Nelder-Mead simplex over the
//! logarithms of the costs, so every cost stays positive. Each candidate is
//! a whole virtual sweep with the same seed, so the search is deterministic.
//!
//! What a recording cannot tell apart is held, and said: with a single
//! prompt and output length, the decode cost per context token moves with
//! the decode cost per sequence, so it stays at 0; the noise (`jitter`,
//! `drift`) is given, not fitted.
//!
//! A recording of a disaggregated server (the signals of a prefill and a
//! decode role) is fitted as one: a prefill engine in front of a decode
//! engine ([`sweep::run_disaggregated`]), each role's waiting p50,
//! preemptions and server TTFT p50 compared with its recorded role's. The
//! prefill engine's costs and the decode engine's are searched in turn,
//! each holding the other's; what neither engine shows on its own (the
//! split of the request overhead between them, the KV transfer, the costs
//! of work an engine never does) is held, and said.

mod guess;
mod inputs;
mod objective;
mod recorded;
mod search;

use nyann_model::{ClientStats, RoleSignals};

use crate::engine::TimeModel;
use crate::profile::{EngineSpec, Limits, Role, ServerProfile};
use crate::sweep::{self, StageFigures, SweepStage};

pub use inputs::{
    FitInputError, FitRequest, FittedProfile, GivenServer, Held, Missing, fit_profile,
};
pub use search::fit;

use objective::sweep_stages;

pub use recorded::{
    PromptCount, RecordedServer, Recording, RecordingError, chat_template_tokens, judged_params,
    read_recording, read_server,
};

/// The server's `max_num_seqs` as the recordings show it, and how it was
/// read: the most requests running (p50) in a stage whose requests queued
/// (waiting p50 above 0) with KV cache to spare (usage under 90%), where
/// only that limit holds requests back; else the highest recorded level,
/// since the server never had more requests at once and a higher limit
/// replays the same. Disaggregated, this is the decode engine's
/// ([`prefill_max_num_seqs`] the prefill engine's).
pub fn max_num_seqs(runs: &[RecordedRun]) -> (u32, String) {
    max_num_seqs_of(runs, |s| s.server.as_ref())
}

/// [`max_num_seqs`] of a disaggregated server's prefill engine, read from
/// its role's signals the same way, but only from stages whose running
/// prompts left room in the step's token budget (`max_num_batched_tokens`):
/// long prompts queue on the budget, with few of them running, and the
/// replay queues them the same way whatever the limit.
pub fn prefill_max_num_seqs(runs: &[RecordedRun], max_num_batched_tokens: u32) -> (u32, String) {
    max_num_seqs_of(runs, |s| {
        s.prefill.as_ref().filter(|p| {
            let running = p.extra("running_requests_p50").unwrap_or(0.0);
            (running + 1.0) * s.prompt_tokens <= f64::from(max_num_batched_tokens)
        })
    })
}

fn max_num_seqs_of(
    runs: &[RecordedRun],
    signals: impl Fn(&RecordedStage) -> Option<&RoleSignals>,
) -> (u32, String) {
    let stages = runs.iter().flat_map(|r| &r.stages);
    let held_back = stages
        .clone()
        .filter_map(signals)
        .filter(|s| s.waiting_requests_p50 > 0.0 && s.kv_cache_usage_max < 0.9)
        .filter_map(|s| s.extra("running_requests_p50"))
        .fold(None, |most: Option<f64>, running| {
            Some(most.map_or(running, |m| m.max(running)))
        });
    if let Some(running) = held_back.filter(|r| *r >= 1.0) {
        return (
            running.round() as u32,
            "the running requests of a stage that queued with KV cache to spare".to_string(),
        );
    }
    let highest = stages.map(|s| s.concurrency).max().unwrap_or(1);
    (
        highest,
        "the highest level recorded: no stage queued with KV cache to spare".to_string(),
    )
}

/// A recorded stage, as the fit needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedStage {
    /// How the recording names it (`#3 c=16`).
    pub label: String,
    pub concurrency: u32,
    pub duration_s: f64,
    /// Mean prompt tokens per request as the server counted them (`usage`).
    pub prompt_tokens: f64,
    /// Mean output tokens per request.
    pub output_tokens: f64,
    pub client: ClientStats,
    /// The server's signals of the stage: its one engine's (role
    /// `aggregate`, or the only role), or, disaggregated, the decode
    /// engine's, whose tokens the client reads (`None` when the stage was not
    /// judged, or a signal could not be read).
    pub server: Option<RoleSignals>,
    /// A disaggregated server's prefill engine's signals (role `prefill`).
    pub prefill: Option<RoleSignals>,
}

/// One recorded sweep (one results directory).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRun {
    pub name: String,
    pub stages: Vec<RecordedStage>,
}

impl RecordedRun {
    /// Whether it recorded a disaggregated server (the signals of a prefill
    /// and a decode role).
    pub fn is_disaggregated(&self) -> bool {
        self.stages
            .iter()
            .any(|s| s.prefill.is_some() && s.server.is_some())
    }
}

/// What the fit holds fixed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitSettings {
    /// The limits of the engine the client reads its tokens from (the
    /// aggregate one, or the decode engine).
    pub limits: Limits,
    /// Disaggregated: the prefill engine's limits. The fit then simulates a
    /// prefill engine in front of the decode engine and fits both.
    pub prefill: Option<Limits>,
    /// The noise of the fitted model (`jitter`, `drift`, `drift_time`; not
    /// fitted). Its costs are ignored.
    pub noise: TimeModel,
    /// Seed of every simulated sweep.
    pub seed: u64,
    /// Most evaluations of the cost (each one simulated sweep per run).
    pub max_evaluations: usize,
}

/// A figure compared: its name, recorded and simulated values.
#[derive(Debug, Clone, PartialEq)]
pub struct Compared {
    pub figure: &'static str,
    /// The role of a disaggregated server the figure is of (`prefill` or
    /// `decode`); empty for the client's figures and a single engine's.
    pub role: &'static str,
    pub recorded: f64,
    pub simulated: f64,
}

impl Compared {
    /// `simulated / recorded - 1` (NaN when nothing was recorded).
    pub fn relative_error(&self) -> f64 {
        if self.recorded > 0.0 {
            self.simulated / self.recorded - 1.0
        } else {
            f64::NAN
        }
    }
}

/// The residuals of one stage under the fitted model.
#[derive(Debug, Clone, PartialEq)]
pub struct StageResidual {
    pub run: String,
    pub label: String,
    pub figures: Vec<Compared>,
}

impl std::fmt::Display for StageResidual {
    /// `output tok/s 2180 (+1%), TTFT p50 0.61 (-7%), waiting p50 0 (recorded 0), ...`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, c) in self.figures.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let sep = if c.role.is_empty() {
                sep.to_string()
            } else {
                format!("{sep}{} ", c.role)
            };
            match c.relative_error() {
                e if e.is_finite() => write!(
                    f,
                    "{sep}{} {:.4} ({:+.0}%)",
                    c.figure,
                    c.simulated,
                    100.0 * e
                )?,
                _ => write!(f, "{sep}{} {:.4} (recorded 0)", c.figure, c.simulated)?,
            }
        }
        Ok(())
    }
}

/// The result of a fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// The time model of the aggregate engine, or the decode engine.
    pub time: TimeModel,
    /// Disaggregated: the prefill engine's.
    pub prefill: Option<TimeModel>,
    /// Root mean square of the weighted log-ratios (0 = perfect).
    pub rms: f64,
    pub residuals: Vec<StageResidual>,
    /// Parameters held, and why.
    pub notes: Vec<Note>,
    pub evaluations: usize,
}

/// A note on a fit: what was held or inferred, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub text: String,
    /// The setting that would give the value instead, if any.
    pub set_by: Option<Setting>,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<String> for Note {
    fn from(text: String) -> Self {
        Note { text, set_by: None }
    }
}

/// A value a note says was held or inferred, which the caller can give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// [`GivenServer::max_num_seqs`].
    MaxNumSeqs,
    /// The KV transfer times of [`FitRequest::held`].
    KvTransfer,
}

/// Why a fit could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error(
        "no usable stage: the fit needs measured closed-loop stages (concurrency, requests completed, \
         output tokens/s)"
    )]
    NoStages,
    #[error(
        "stage {label} of {run}: requests of {prompt} + {output} tokens do not fit the KV cache \
         ({capacity} tokens): is the server's KV cache given right?"
    )]
    DoesNotFit {
        run: String,
        label: String,
        prompt: u32,
        output: u32,
        capacity: u64,
    },
}

/// What a sweep is simulated against: the engine the client reads its
/// tokens from (the aggregate one, or the decode engine) and,
/// disaggregated, the prefill engine in front of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Serving {
    pub server: EngineSpec,
    pub prefill: Option<EngineSpec>,
}

impl Serving {
    /// The engines `profile` serves with.
    pub fn of(profile: &ServerProfile) -> Serving {
        if profile.disaggregated {
            Serving {
                server: profile.engine(Role::Decode),
                prefill: Some(profile.engine(Role::Prefill)),
            }
        } else {
            Serving {
                server: profile.engine,
                prefill: None,
            }
        }
    }

    /// The sweep of `stages` on the virtual clock, the engines seeded from
    /// `seed` (each its own).
    fn sweep(&self, seed: u64, stages: &[SweepStage]) -> Vec<StageFigures> {
        match self.prefill {
            None => sweep::run(&self.server.config(seed), stages),
            Some(prefill) => sweep::run_disaggregated(
                &prefill.config(seed),
                &self.server.config(seed.wrapping_add(1)),
                stages,
            ),
        }
    }
}

/// The time models of a candidate: [`Serving`]'s engines'.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Models {
    server: TimeModel,
    prefill: Option<TimeModel>,
}

impl Models {
    fn serving(&self, settings: &FitSettings) -> Serving {
        Serving {
            server: EngineSpec {
                limits: settings.limits,
                time: self.server,
            },
            prefill: settings
                .prefill
                .zip(self.prefill)
                .map(|(limits, time)| EngineSpec { limits, time }),
        }
    }

    /// Every model's prompt cost ten times, its request overhead halved:
    /// the start of the search that explains TTFT by the prefill.
    fn heavy(self) -> Models {
        let heavy = |t: TimeModel| TimeModel {
            prefill_per_token: t.prefill_per_token * 10.0,
            request_overhead: t.request_overhead / 2.0,
            ..t
        };
        Models {
            server: heavy(self.server),
            prefill: self.prefill.map(heavy),
        }
    }
}

/// A held-out recorded stage beside what a fitted model predicts for it.
#[derive(Debug, Clone)]
pub struct Prediction {
    pub recorded: RecordedStage,
    pub predicted: StageFigures,
}

/// What `serving` predicts for each stage of `run` (a run the model was
/// not fitted to), on the virtual clock with `seed`.
pub fn predict(run: &RecordedRun, serving: &Serving, seed: u64) -> Vec<Prediction> {
    let simulated = serving.sweep(seed, &sweep_stages(run));
    run.stages
        .iter()
        .cloned()
        .zip(simulated)
        .map(|(recorded, predicted)| Prediction {
            recorded,
            predicted,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::guess::least_squares;
    use super::search::nelder_mead;
    use super::*;

    #[test]
    fn least_squares_solves_a_line_and_skips_empty_columns() {
        let rows: Vec<([f64; 3], f64)> = (1..=4)
            .map(|c| ([1.0, f64::from(c), 0.0], 2.0 + 0.5 * f64::from(c)))
            .collect();
        let x = least_squares(&rows).unwrap();
        assert!((x[0] - 2.0).abs() < 1e-9 && (x[1] - 0.5).abs() < 1e-9 && x[2] == 0.0);
        assert_eq!(least_squares(&rows[..1]), None);
    }

    #[test]
    fn max_num_seqs_is_where_requests_queued_with_kv_to_spare() {
        let stage = |concurrency: u32, server: Option<(f64, f64, f64)>| RecordedStage {
            label: format!("c={concurrency}"),
            concurrency,
            duration_s: 10.0,
            prompt_tokens: 100.0,
            output_tokens: 100.0,
            client: ClientStats::default(),
            server: server.map(|(waiting, kv, running)| RoleSignals {
                role: "aggregate".into(),
                waiting_requests_p50: waiting,
                kv_cache_usage_max: kv,
                extra: vec![("running_requests_p50".into(), running)],
                ..RoleSignals::default()
            }),
            prefill: None,
        };
        let run = |stages| RecordedRun {
            name: "r".into(),
            stages,
        };
        // Not judged, or never queued: the highest level.
        let calm = run(vec![stage(4, None), stage(32, Some((0.0, 0.5, 32.0)))]);
        assert_eq!(max_num_seqs(std::slice::from_ref(&calm)).0, 32);
        // Queued with the KV cache full: the cache held them back, not the limit.
        let kv_bound = run(vec![stage(64, Some((20.0, 1.0, 40.0)))]);
        assert_eq!(max_num_seqs(&[calm.clone(), kv_bound]).0, 64);
        // Queued with cache to spare: the limit is what ran.
        let limited = run(vec![stage(24, Some((8.0, 0.6, 16.0)))]);
        let (n, why) = max_num_seqs(&[calm, limited]);
        assert_eq!(n, 16, "{why}");
    }

    #[test]
    fn a_prefill_queue_on_the_token_budget_is_no_max_num_seqs() {
        let stage = |prompt_tokens: f64, running: f64| RecordedStage {
            label: "c=16".into(),
            concurrency: 16,
            duration_s: 10.0,
            prompt_tokens,
            output_tokens: 32.0,
            client: ClientStats::default(),
            server: None,
            prefill: Some(RoleSignals {
                role: "prefill".into(),
                waiting_requests_p50: 5.0,
                kv_cache_usage_max: 0.3,
                extra: vec![("running_requests_p50".into(), running)],
                ..RoleSignals::default()
            }),
        };
        let run = |stages| RecordedRun {
            name: "r".into(),
            stages: vec![stages],
        };
        // Two 1024-token prompts fill a 2048-token step: the budget queues them.
        assert_eq!(prefill_max_num_seqs(&[run(stage(1024.0, 2.0))], 2048).0, 16);
        // Four 64-token prompts leave room: the limit queues them.
        assert_eq!(prefill_max_num_seqs(&[run(stage(64.0, 4.0))], 2048).0, 4);
    }

    #[test]
    fn nelder_mead_finds_the_minimum_of_a_bowl() {
        let mut f = |x: &[f64]| (x[0] - 1.0).powi(2) + 3.0 * (x[1] + 2.0).powi(2);
        let x = nelder_mead(&mut f, &[0.0, 0.0], 0.5, 500);
        assert!(
            (x[0] - 1.0).abs() < 1e-3 && (x[1] + 2.0).abs() < 1e-3,
            "{x:?}"
        );
    }
}
