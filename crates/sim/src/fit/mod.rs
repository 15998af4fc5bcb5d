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

mod recorded;

use nyann_model::{ClientStats, RoleSignals};

use crate::engine::TimeModel;
use crate::profile::{EngineSpec, Limits, Role, ServerProfile};
use crate::sweep::{self, StageFigures, SweepStage};

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
    pub notes: Vec<String>,
    pub evaluations: usize,
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
         ({capacity} tokens): give the server's --kv-blocks / --block-size, or its /metrics text"
    )]
    DoesNotFit {
        run: String,
        label: String,
        prompt: u32,
        output: u32,
        capacity: u64,
    },
}

/// How much each figure counts, and the floor added to both sides of its
/// log-ratio (so that near-zero values compare by difference).
#[derive(Clone, Copy)]
struct Weighting {
    figure: &'static str,
    weight: f64,
    floor: f64,
}

/// The client's figures, then the server's (a single engine's).
const WEIGHTS: [Weighting; 8] = [
    Weighting {
        figure: "output tok/s",
        weight: 2.0,
        floor: 1.0,
    },
    Weighting {
        figure: "TTFT p50",
        weight: 1.0,
        floor: 0.002,
    },
    Weighting {
        figure: "TTFT p99",
        weight: 0.1,
        floor: 0.002,
    },
    Weighting {
        figure: "ITL p50",
        weight: 1.0,
        floor: 0.0002,
    },
    Weighting {
        figure: "E2E p50",
        weight: 0.5,
        floor: 0.002,
    },
    Weighting {
        figure: "waiting p50",
        weight: 1.0,
        floor: 1.0,
    },
    Weighting {
        figure: "server TTFT p99",
        weight: 0.1,
        floor: 0.002,
    },
    Weighting {
        figure: "preemptions",
        weight: 0.25,
        floor: 5.0,
    },
];

/// The client's figures in [`WEIGHTS`].
const CLIENT_FIGURES: usize = 5;

/// The figures of each role of a disaggregated server. Each engine's TTFT
/// p50 tells where the client's TTFT goes; its p99, read in a histogram's
/// buckets from a few slow requests, varies with the seed by half and more
/// between two runs of the same engines, and would pull the fit off the
/// costs that made it.
const ROLE_WEIGHTS: [Weighting; 3] = [
    WEIGHTS[5],
    WEIGHTS[7],
    Weighting {
        figure: "server TTFT p50",
        weight: 0.5,
        floor: 0.002,
    },
];

fn measured(v: f64) -> Option<f64> {
    (v.is_finite() && v > 0.0).then_some(v)
}

fn counted(v: f64) -> Option<f64> {
    v.is_finite().then_some(v.max(0.0))
}

/// The figures of a stage in [`WEIGHTS`] order; `None` when not measured.
fn figures(client: &ClientStats, server: Option<&RoleSignals>) -> [Option<f64>; 8] {
    [
        measured(client.output_tokens_per_second),
        measured(client.ttft_p50_seconds),
        measured(client.ttft_p99_seconds),
        measured(client.itl_p50_seconds),
        measured(client.e2e_p50_seconds),
        server.and_then(|s| counted(s.waiting_requests_p50)),
        server.and_then(|s| measured(s.ttft_p99_seconds)),
        server.and_then(|s| counted(s.preemptions)),
    ]
}

/// A role's figures in [`ROLE_WEIGHTS`] order.
fn role_figures(signals: Option<&RoleSignals>) -> [Option<f64>; 3] {
    [
        signals.and_then(|s| counted(s.waiting_requests_p50)),
        signals.and_then(|s| counted(s.preemptions)),
        signals
            .and_then(|s| s.extra("ttft_p50_seconds"))
            .and_then(measured),
    ]
}

/// The sweep that reproduces a recorded run.
fn sweep_stages(run: &RecordedRun) -> Vec<SweepStage> {
    run.stages
        .iter()
        .map(|s| SweepStage {
            concurrency: s.concurrency,
            duration_s: s.duration_s,
            prompt_tokens: s.prompt_tokens.round().max(1.0) as u32,
            output_tokens: s.output_tokens.round().max(1.0) as u32,
        })
        .collect()
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
struct Models {
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

/// A cost of the time model the search moves.
#[derive(Debug, Clone, Copy)]
enum Cost {
    StepOverhead,
    PrefillPerToken,
    DecodePerSeq,
    RequestOverhead,
    DecodePerContextToken,
}

impl Cost {
    fn of(self, t: &mut TimeModel) -> &mut f64 {
        match self {
            Cost::StepOverhead => &mut t.step_overhead,
            Cost::PrefillPerToken => &mut t.prefill_per_token,
            Cost::DecodePerSeq => &mut t.decode_per_seq,
            Cost::RequestOverhead => &mut t.request_overhead,
            Cost::DecodePerContextToken => &mut t.decode_per_context_token,
        }
    }
}

/// Whose model a searched cost sets: the server's (aggregate or decode),
/// the prefill engine's, or both (a cost one engine cannot show is held at
/// the other's).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Whose {
    Server,
    Prefill,
    Both,
}

/// Costs below this (seconds) are 0 in the result.
const NEGLIGIBLE: f64 = 1e-9;

/// The parameters searched together, as logarithms of seconds.
#[derive(Debug, Clone)]
struct Searched {
    costs: Vec<(Cost, Whose)>,
}

impl Searched {
    /// A single engine: every cost, the context's only when `context`.
    fn engine(context: bool) -> Searched {
        let mut costs = vec![
            (Cost::StepOverhead, Whose::Server),
            (Cost::PrefillPerToken, Whose::Server),
            (Cost::DecodePerSeq, Whose::Server),
            (Cost::RequestOverhead, Whose::Server),
        ];
        if context {
            costs.push((Cost::DecodePerContextToken, Whose::Server));
        }
        Searched { costs }
    }

    /// A disaggregated server, one engine after the other: the prefill
    /// engine's step costs with the request overhead of both, then the
    /// decode engine's step costs. The decode engine's prompt cost (it
    /// computes prompts only to recompute preempted sequences) is the
    /// prefill engine's; the prefill engine's decode costs (its one token
    /// ends the prefill: it never decodes) are the decode engine's.
    fn disaggregated(context: bool) -> [Searched; 2] {
        let prefill = Searched {
            costs: vec![
                (Cost::StepOverhead, Whose::Prefill),
                (Cost::PrefillPerToken, Whose::Both),
                (Cost::RequestOverhead, Whose::Both),
            ],
        };
        let mut decode = vec![
            (Cost::StepOverhead, Whose::Server),
            (Cost::DecodePerSeq, Whose::Both),
        ];
        if context {
            decode.push((Cost::DecodePerContextToken, Whose::Both));
        }
        [prefill, Searched { costs: decode }]
    }

    /// The models at point `x`, the costs not searched here from `base`.
    fn model(&self, x: &[f64], base: Models) -> Models {
        let cost = |v: f64| {
            let s = v.exp();
            if s < NEGLIGIBLE { 0.0 } else { s }
        };
        let mut m = base;
        for (&(c, whose), &v) in self.costs.iter().zip(x) {
            if whose != Whose::Prefill {
                *c.of(&mut m.server) = cost(v);
            }
            if whose != Whose::Server
                && let Some(p) = &mut m.prefill
            {
                *c.of(p) = cost(v);
            }
        }
        m
    }

    fn point(&self, m: &Models) -> Vec<f64> {
        let log = |v: f64| v.max(NEGLIGIBLE).ln();
        let mut m = *m;
        self.costs
            .iter()
            .map(|&(c, whose)| match (whose, &mut m.prefill) {
                (Whose::Prefill, Some(p)) => log(*c.of(p)),
                _ => log(*c.of(&mut m.server)),
            })
            .collect()
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

/// Simulate every run under `models` and compare with the recordings.
fn compare(runs: &[RecordedRun], settings: &FitSettings, models: Models) -> Vec<StageResidual> {
    let serving = models.serving(settings);
    let mut out = Vec::new();
    for run in runs {
        let simulated = serving.sweep(settings.seed, &sweep_stages(run));
        for (rec, sim) in run.stages.iter().zip(&simulated) {
            out.push(StageResidual {
                run: run.name.clone(),
                label: rec.label.clone(),
                figures: compared(rec, sim),
            });
        }
    }
    out
}

/// The figures of `rec` and `sim` side by side: the client's, and the
/// server's (a disaggregated sweep's by role, decode then prefill).
fn compared(rec: &RecordedStage, sim: &StageFigures) -> Vec<Compared> {
    let pair = |w: &Weighting, role: &'static str, r: Option<f64>, s: Option<f64>| {
        Some(Compared {
            figure: w.figure,
            role,
            recorded: r?,
            simulated: s.unwrap_or(0.0),
        })
    };
    let recorded = figures(&rec.client, rec.server.as_ref());
    let simulated = figures(&sim.client, Some(&sim.server));
    // One engine: every figure of WEIGHTS. Disaggregated: the client's,
    // then each role's own.
    let shared = if sim.prefill.is_some() {
        CLIENT_FIGURES
    } else {
        WEIGHTS.len()
    };
    let engine = WEIGHTS[..shared]
        .iter()
        .zip(recorded.into_iter().zip(simulated))
        .filter_map(|(w, (r, s))| pair(w, "", r, s));
    let roles = sim.prefill.iter().flat_map(|sim_prefill| {
        [
            ("decode", rec.server.as_ref(), &sim.server),
            ("prefill", rec.prefill.as_ref(), sim_prefill),
        ]
        .into_iter()
        .flat_map(move |(role, r, s)| {
            ROLE_WEIGHTS
                .iter()
                .zip(role_figures(r).into_iter().zip(role_figures(Some(s))))
                .filter_map(move |(w, (r, s))| pair(w, role, r, s))
        })
    });
    engine.chain(roles).collect()
}

/// The weighted sum of squared log-ratios of every compared figure, and the
/// total weight.
fn cost(residuals: &[StageResidual]) -> (f64, f64) {
    let (mut sum, mut weights) = (0.0, 0.0);
    for stage in residuals {
        for c in &stage.figures {
            let Some(w) = WEIGHTS
                .iter()
                .chain(&ROLE_WEIGHTS)
                .find(|w| w.figure == c.figure)
            else {
                continue;
            };
            let r = ((c.simulated + w.floor) / (c.recorded + w.floor)).ln();
            sum += w.weight * r * r;
            weights += w.weight;
        }
    }
    (sum, weights)
}

/// A first guess from the stages without a queue: their step time (ITL,
/// or without it the time per token of a stream) fitted by least squares to
/// `overhead + per_seq * c + per_context * c * context` (the context term
/// only when the stages' contexts differ), and what TTFT adds at the
/// lightest load.
fn first_guess(runs: &[RecordedRun], noise: TimeModel, context: bool) -> TimeModel {
    let mut light: Vec<(f64, f64, f64, &RecordedStage)> = runs
        .iter()
        .flat_map(|r| &r.stages)
        .filter(|s| {
            s.server
                .as_ref()
                .is_none_or(|v| v.waiting_requests_p50 < 0.5)
        })
        .map(|s| {
            let c = f64::from(s.concurrency);
            let step = if s.client.itl_p50_seconds > 0.0 {
                s.client.itl_p50_seconds
            } else {
                c / s.client.output_tokens_per_second.max(1e-9)
            };
            (c, s.prompt_tokens + s.output_tokens / 2.0, step, s)
        })
        .collect();
    light.sort_by(|a, b| a.0.total_cmp(&b.0));
    let rows: Vec<([f64; 3], f64)> = light
        .iter()
        .map(|&(c, ctx, step, _)| ([1.0, c, if context { c * ctx } else { 0.0 }], step))
        .collect();
    let [overhead, per_seq, per_context] = least_squares(&rows).unwrap_or_else(|| {
        let step = light.first().map_or(0.003, |l| l.2);
        [0.8 * step, 0.2 * step, 0.0]
    });
    let overhead = overhead.max(1e-5);
    let per_seq = per_seq.max(overhead / 100.0);
    let per_context = per_context.max(per_seq / 1000.0);
    let request = light
        .first()
        .map(|&(_, _, step, s)| (s.client.ttft_p50_seconds - 2.0 * step).max(1e-5))
        .unwrap_or(1e-4);
    TimeModel {
        step_overhead: overhead,
        prefill_per_token: overhead / 640.0,
        decode_per_seq: per_seq,
        decode_per_context_token: per_context,
        request_overhead: request,
        ..noise
    }
}

/// A disaggregated server's first guess: the decode engine's step costs as
/// [`first_guess`] reads them from the ITL, and the client's TTFT at the
/// lightest load, less the KV transfer and a decode step, half the prefill
/// (at the decode engine's step overhead), half the two request overheads.
fn first_guess_disaggregated(runs: &[RecordedRun], noise: TimeModel, context: bool) -> Models {
    let server = first_guess(runs, noise, context);
    let lightest = runs
        .iter()
        .flat_map(|r| &r.stages)
        .min_by_key(|s| s.concurrency);
    let (ttft, prompt) = lightest.map_or((0.01, 100.0), |s| {
        (s.client.ttft_p50_seconds, s.prompt_tokens.max(1.0))
    });
    let step = server.step_overhead + server.decode_per_seq;
    let rest = (ttft - noise.kv_transfer_seconds(prompt as u32) - step).max(4e-5);
    let prefill_per_token =
        ((rest / 2.0 - server.step_overhead) / prompt).max(server.step_overhead / 640.0);
    let server = TimeModel {
        prefill_per_token,
        request_overhead: rest / 4.0,
        ..server
    };
    Models {
        server,
        prefill: Some(server),
    }
}

/// Least squares `x` of `a . x = y` over the rows; columns that are all
/// zero get 0. `None` with fewer rows than unknowns or a singular system.
fn least_squares(rows: &[([f64; 3], f64)]) -> Option<[f64; 3]> {
    let used: Vec<usize> = (0..3)
        .filter(|&j| rows.iter().any(|(a, _)| a[j] != 0.0))
        .collect();
    let n = used.len();
    if rows.len() < n || n == 0 {
        return None;
    }
    // Normal equations, solved by Gaussian elimination with pivoting.
    let mut m = vec![vec![0.0; n + 1]; n];
    for (a, y) in rows {
        for (i, &ji) in used.iter().enumerate() {
            for (k, &jk) in used.iter().enumerate() {
                m[i][k] += a[ji] * a[jk];
            }
            m[i][n] += a[ji] * y;
        }
    }
    for col in 0..n {
        let pivot = (col..n).max_by(|&r, &s| m[r][col].abs().total_cmp(&m[s][col].abs()))?;
        if m[pivot][col].abs() < 1e-300 {
            return None;
        }
        m.swap(col, pivot);
        let row = m[col].clone();
        for (r, other) in m.iter_mut().enumerate() {
            if r != col {
                let f = other[col] / row[col];
                for (v, p) in other.iter_mut().zip(&row).skip(col) {
                    *v -= f * p;
                }
            }
        }
    }
    let mut x = [0.0; 3];
    for (i, &j) in used.iter().enumerate() {
        x[j] = m[i][n] / m[i][i];
    }
    Some(x)
}

/// Fit the time model of `runs` under `settings`.
pub fn fit(runs: &[RecordedRun], settings: &FitSettings) -> Result<Fit, FitError> {
    let runs: Vec<RecordedRun> = runs
        .iter()
        .map(|r| RecordedRun {
            name: r.name.clone(),
            stages: r
                .stages
                .iter()
                .filter(|s| {
                    s.concurrency > 0
                        && s.duration_s > 0.0
                        && s.client.requests_ok > 0
                        && s.client.output_tokens_per_second > 0.0
                })
                .cloned()
                .collect(),
        })
        .filter(|r| !r.stages.is_empty())
        .collect();
    if runs.is_empty() {
        return Err(FitError::NoStages);
    }
    // A request must fit every engine (as the simulator's server checks).
    for limits in [Some(settings.limits), settings.prefill]
        .into_iter()
        .flatten()
    {
        let capacity = u64::from(limits.kv_blocks) * u64::from(limits.block_size);
        let limit = limits
            .max_model_len
            .map_or(capacity, |m| capacity.min(u64::from(m)));
        for run in &runs {
            for (rec, s) in run.stages.iter().zip(sweep_stages(run)) {
                let needed = u64::from(s.prompt_tokens) + u64::from(s.output_tokens);
                if needed > limit {
                    return Err(FitError::DoesNotFit {
                        run: run.name.clone(),
                        label: rec.label.clone(),
                        prompt: s.prompt_tokens,
                        output: s.output_tokens,
                        capacity: limit,
                    });
                }
            }
        }
    }
    let mut notes = Vec::new();
    let shapes: Vec<(u32, u32)> = runs
        .iter()
        .flat_map(sweep_stages)
        .map(|s| (s.prompt_tokens, s.output_tokens))
        .collect();
    let varied = shapes.iter().any(|s| {
        let (p, o) = shapes[0];
        // Context read per step differs by a tenth or more.
        (f64::from(s.0) + f64::from(s.1) / 2.0) > 1.1 * (f64::from(p) + f64::from(o) / 2.0)
            || (f64::from(p) + f64::from(o) / 2.0) > 1.1 * (f64::from(s.0) + f64::from(s.1) / 2.0)
    });
    let disaggregated = settings.prefill.is_some();
    let searched: Vec<Searched> = if disaggregated {
        Searched::disaggregated(varied).into()
    } else {
        vec![Searched::engine(varied)]
    };
    if !varied {
        notes.push(
            "decode_per_context_token held at 0: every stage had the same prompt and output \
             lengths, so its cost cannot be told from decode_per_seq (fit two runs with \
             different lengths to get it)"
                .into(),
        );
    }
    let n = settings.noise;
    if disaggregated {
        notes.extend(disaggregated_notes(&n, varied));
    }
    notes.push(format!(
        "noise held (not fitted): jitter {}, drift {} over {} ms",
        n.jitter,
        n.drift,
        n.drift_time * 1e3
    ));

    // What is not searched: the noise and the KV transfer; every cost is
    // set by a searched parameter, or held at 0 (the context's).
    let held = TimeModel {
        step_overhead: 0.0,
        prefill_per_token: 0.0,
        decode_per_seq: 0.0,
        decode_per_context_token: 0.0,
        request_overhead: 0.0,
        ..settings.noise
    };
    let base = Models {
        server: held,
        prefill: settings.prefill.map(|_| held),
    };
    // The models at the points of every searched group.
    let models = |xs: &[Vec<f64>]| {
        searched
            .iter()
            .zip(xs)
            .fold(base, |m, (group, x)| group.model(x, m))
    };
    let mut evaluations = 0;
    let mut objective = |xs: &[Vec<f64>]| {
        evaluations += 1;
        let (sum, weights) = cost(&compare(&runs, settings, models(xs)));
        if weights > 0.0 { sum / weights } else { 0.0 }
    };
    // Two starts, light and heavy prefill (TTFT at low load can be the
    // request overhead or the prefill, and the search does not cross from
    // one valley to the other), each searched three times from its best
    // point with a fresh, smaller simplex (which gets Nelder-Mead out of the
    // collapsed simplices it ends in); the better one wins. A disaggregated
    // server's engines are searched one after the other (the prefill
    // engine's costs, then the decode engine's, each time), each holding
    // the other's where it is.
    let budget = settings.max_evaluations.max(12) / 6 / searched.len();
    let guess = if disaggregated {
        first_guess_disaggregated(&runs, settings.noise, varied)
    } else {
        Models {
            server: first_guess(&runs, settings.noise, varied),
            prefill: None,
        }
    };
    let mut best = (Vec::new(), f64::INFINITY);
    for start in [guess, guess.heavy()] {
        let mut xs: Vec<Vec<f64>> = searched.iter().map(|g| g.point(&start)).collect();
        for step in [0.7, 0.3, 0.1] {
            for group in 0..xs.len() {
                let mut within = |x: &[f64]| {
                    let mut all = xs.clone();
                    all[group] = x.to_vec();
                    objective(&all)
                };
                xs[group] = nelder_mead(&mut within, &xs[group], step, budget);
            }
        }
        let value = objective(&xs);
        if value < best.1 {
            best = (xs, value);
        }
    }
    let fitted = models(&best.0);
    let residuals = compare(&runs, settings, fitted);
    let (sum, weights) = cost(&residuals);
    Ok(Fit {
        time: fitted.server,
        prefill: fitted.prefill,
        rms: if weights > 0.0 {
            (sum / weights).sqrt()
        } else {
            0.0
        },
        residuals,
        notes,
        evaluations,
    })
}

/// What a disaggregated fit takes from where, and what it holds.
fn disaggregated_notes(held: &TimeModel, varied: bool) -> [String; 3] {
    [
        format!(
            "disaggregated: the prefill engine's step_overhead and prefill_per_token fitted to \
             the prefill role's waiting and TTFT and the client's TTFT; the decode engine's \
             step_overhead, decode_per_seq{} to the ITL, E2E, output tok/s and the decode \
             role's waiting, TTFT and preemptions",
            if varied {
                " and decode_per_context_token"
            } else {
                ""
            }
        ),
        "request_overhead: one value for both engines, fitted to the client's TTFT (which \
         shows their sum; the engines' TTFT histograms, in buckets of 5 ms and more, cannot \
         split it); the decode engine's prefill_per_token is the prefill engine's (it computes \
         prompts only to recompute preempted sequences), the prefill engine's decode costs the \
         decode engine's (it never decodes)"
            .into(),
        format!(
            "KV transfer held (not fitted): {} us + {} us per prompt token (it adds to the \
             client's TTFT as the request overhead does, so a recording cannot tell them apart; \
             --kv-transfer-us and --kv-transfer-per-token-us set it)",
            held.kv_transfer * 1e6,
            held.kv_transfer_per_token * 1e6
        ),
    ]
}

/// Minimise `f` from `start` with the Nelder-Mead simplex (initial steps of
/// `step` on each axis), within `max_evaluations` calls.
fn nelder_mead(
    f: &mut impl FnMut(&[f64]) -> f64,
    start: &[f64],
    step: f64,
    max_evaluations: usize,
) -> Vec<f64> {
    let n = start.len();
    let mut simplex: Vec<(Vec<f64>, f64)> = Vec::with_capacity(n + 1);
    simplex.push((start.to_vec(), f(start)));
    for i in 0..n {
        let mut x = start.to_vec();
        x[i] += step;
        let v = f(&x);
        simplex.push((x, v));
    }
    let mut used = n + 1;
    let point = |a: &[f64], b: &[f64], t: f64| -> Vec<f64> {
        a.iter().zip(b).map(|(a, b)| a + t * (b - a)).collect()
    };
    while used < max_evaluations {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let spread = simplex[n].1 - simplex[0].1;
        if spread.abs() < 1e-7 {
            break;
        }
        let centroid: Vec<f64> = (0..n)
            .map(|i| simplex[..n].iter().map(|(x, _)| x[i]).sum::<f64>() / n as f64)
            .collect();
        let worst = simplex[n].clone();
        let reflected = point(&centroid, &worst.0, -1.0);
        let fr = f(&reflected);
        used += 1;
        if fr < simplex[0].1 {
            let expanded = point(&centroid, &worst.0, -2.0);
            let fe = f(&expanded);
            used += 1;
            simplex[n] = if fe < fr {
                (expanded, fe)
            } else {
                (reflected, fr)
            };
        } else if fr < simplex[n - 1].1 {
            simplex[n] = (reflected, fr);
        } else {
            let (toward, ft) = if fr < worst.1 {
                (reflected, fr)
            } else {
                (worst.0.clone(), worst.1)
            };
            let contracted = point(&centroid, &toward, 0.5);
            let fc = f(&contracted);
            used += 1;
            if fc < ft {
                simplex[n] = (contracted, fc);
            } else {
                // Shrink toward the best point.
                let best = simplex[0].0.clone();
                for entry in simplex.iter_mut().skip(1) {
                    let x = point(&best, &entry.0, 0.5);
                    let v = f(&x);
                    *entry = (x, v);
                }
                used += n;
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    simplex.swap_remove(0).0
}

#[cfg(test)]
mod tests {
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
