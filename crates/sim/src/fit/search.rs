//! The search: Nelder-Mead over the logarithms of the costs, in turn
//! for each engine of a disaggregated server.

use crate::engine::TimeModel;

use super::guess::{first_guess, first_guess_disaggregated};
use super::objective::{compare, cost, sweep_stages};
use super::{Fit, FitError, FitSettings, Models, Note, RecordedRun, Setting};

/// A cost of the time model the search moves.
#[derive(Debug, Clone, Copy)]
pub(super) enum Cost {
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
pub(super) enum Whose {
    Server,
    Prefill,
    Both,
}

/// Costs below this (seconds) are 0 in the result.
pub(super) const NEGLIGIBLE: f64 = 1e-9;

/// The parameters searched together, as logarithms of seconds.
#[derive(Debug, Clone)]
pub(super) struct Searched {
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
                .to_string()
                .into(),
        );
    }
    let n = settings.noise;
    if disaggregated {
        notes.extend(disaggregated_notes(&n, varied));
    }
    notes.push(
        format!(
            "noise held (not fitted): jitter {}, drift {} over {} ms",
            n.jitter,
            n.drift,
            n.drift_time * 1e3
        )
        .into(),
    );

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
pub(super) fn disaggregated_notes(held: &TimeModel, varied: bool) -> [Note; 3] {
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
        )
        .into(),
        "request_overhead: one value for both engines, fitted to the client's TTFT (which \
         shows their sum; the engines' TTFT histograms, in buckets of 5 ms and more, cannot \
         split it); the decode engine's prefill_per_token is the prefill engine's (it computes \
         prompts only to recompute preempted sequences), the prefill engine's decode costs the \
         decode engine's (it never decodes)"
            .to_string()
            .into(),
        Note {
            text: format!(
                "KV transfer held (not fitted): {} us + {} us per prompt token (it adds to the \
             client's TTFT as the request overhead does, so a recording cannot tell them apart; \
             it is given)",
                held.kv_transfer * 1e6,
                held.kv_transfer_per_token * 1e6
            ),
            set_by: Some(Setting::KvTransfer),
        },
    ]
}

/// Minimise `f` from `start` with the Nelder-Mead simplex (initial steps of
/// `step` on each axis), within `max_evaluations` calls.
pub(super) fn nelder_mead(
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
