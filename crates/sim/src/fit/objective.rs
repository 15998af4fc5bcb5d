//! What the fit minimises: the weighted squared log-ratios of the
//! simulated and the recorded figures of every stage.

use nyann_model::{ClientStats, RoleSignals};

use crate::sweep::{StageFigures, SweepStage};

use super::{Compared, FitSettings, Models, RecordedRun, RecordedStage, StageResidual};

/// How much each figure counts, and the floor added to both sides of its
/// log-ratio (so that near-zero values compare by difference).
#[derive(Clone, Copy)]
pub(super) struct Weighting {
    figure: &'static str,
    weight: f64,
    floor: f64,
}

/// The client's figures, then the server's (a single engine's).
pub(super) const WEIGHTS: [Weighting; 8] = [
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
pub(super) const CLIENT_FIGURES: usize = 5;

/// The figures of each role of a disaggregated server. Each engine's TTFT
/// p50 tells where the client's TTFT goes; its p99, read in a histogram's
/// buckets from a few slow requests, varies with the seed by half and more
/// between two runs of the same engines, and would pull the fit off the
/// costs that made it.
pub(super) const ROLE_WEIGHTS: [Weighting; 3] = [
    WEIGHTS[5],
    WEIGHTS[7],
    Weighting {
        figure: "server TTFT p50",
        weight: 0.5,
        floor: 0.002,
    },
];

pub(super) fn measured(v: f64) -> Option<f64> {
    (v.is_finite() && v > 0.0).then_some(v)
}

pub(super) fn counted(v: f64) -> Option<f64> {
    v.is_finite().then_some(v.max(0.0))
}

/// The figures of a stage in [`WEIGHTS`] order; `None` when not measured.
pub(super) fn figures(client: &ClientStats, server: Option<&RoleSignals>) -> [Option<f64>; 8] {
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
pub(super) fn role_figures(signals: Option<&RoleSignals>) -> [Option<f64>; 3] {
    [
        signals.and_then(|s| counted(s.waiting_requests_p50)),
        signals.and_then(|s| counted(s.preemptions)),
        signals
            .and_then(|s| s.extra("ttft_p50_seconds"))
            .and_then(measured),
    ]
}

/// The sweep that reproduces a recorded run.
pub(super) fn sweep_stages(run: &RecordedRun) -> Vec<SweepStage> {
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

/// Simulate every run under `models` and compare with the recordings.
pub(super) fn compare(
    runs: &[RecordedRun],
    settings: &FitSettings,
    models: Models,
) -> Vec<StageResidual> {
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
pub(super) fn compared(rec: &RecordedStage, sim: &StageFigures) -> Vec<Compared> {
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
pub(super) fn cost(residuals: &[StageResidual]) -> (f64, f64) {
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
