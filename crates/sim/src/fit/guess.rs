//! Where the search starts: the step costs read by least squares from
//! the stages without a queue.

use crate::engine::TimeModel;

use super::{Models, RecordedRun, RecordedStage};

/// A first guess from the stages without a queue: their step time (ITL,
/// or without it the time per token of a stream) fitted by least squares to
/// `overhead + per_seq * c + per_context * c * context` (the context term
/// only when the stages' contexts differ), and what TTFT adds at the
/// lightest load.
pub(super) fn first_guess(runs: &[RecordedRun], noise: TimeModel, context: bool) -> TimeModel {
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
pub(super) fn first_guess_disaggregated(
    runs: &[RecordedRun],
    noise: TimeModel,
    context: bool,
) -> Models {
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
pub(super) fn least_squares(rows: &[([f64; 3], f64)]) -> Option<[f64; 3]> {
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
