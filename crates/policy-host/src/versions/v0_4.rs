//! `nyann:policy@0.4`: frozen (`wit/0.4`). The host adapts the model to
//! it: the SLO counts, added in 0.5, are left out.

use nyann_model::observation::{
    ClientStats, FiredRule, ParamKind, PolicyInfo, RoleSignals, StageObservation, Verdict,
};
use nyann_model::scenario::{Param, Value};
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use crate::sandbox::{HostState, LogLevel};

wasmtime::component::bindgen!({
    path: "../../wit/0.4",
    world: "congestion-policy",
    // `log` may trap: a call that logs without end is stopped.
    imports: { default: trappable },
});

version_glue!();

integer_values!();

impl From<&ClientStats> for wit::ClientStats {
    fn from(c: &ClientStats) -> Self {
        wit::ClientStats {
            requests_ok: c.requests_ok,
            requests_failed: c.requests_failed,
            requests_per_second: c.requests_per_second,
            output_tokens_per_second: c.output_tokens_per_second,
            ttft_p50_seconds: c.ttft_p50_seconds,
            ttft_p99_seconds: c.ttft_p99_seconds,
            itl_p50_seconds: c.itl_p50_seconds,
            itl_p99_seconds: c.itl_p99_seconds,
            e2e_p50_seconds: c.e2e_p50_seconds,
            e2e_p99_seconds: c.e2e_p99_seconds,
            dropped: c.dropped,
            requests_rejected: c.requests_rejected,
            requests_late: c.requests_late,
            eval: c.eval.map(|e| wit::EvalCounts {
                answered: e.answered,
                correct: e.correct,
                unanswerable: e.unanswerable,
            }),
        }
    }
}

impl From<&StageObservation> for wit::StageObservation {
    fn from(s: &StageObservation) -> Self {
        wit::StageObservation {
            index: s.index,
            name: s.name.clone(),
            sweep: wit::Sweep {
                index: s.sweep.index,
                name: s.sweep.name.clone(),
            },
            concurrency: s.concurrency,
            rate: s.rate,
            start_unix_seconds: s.start_unix_seconds,
            end_unix_seconds: s.end_unix_seconds,
            roles: s.roles.iter().map(wit::RoleSignals::from).collect(),
            client: (&s.client).into(),
            signal_errors: s.signal_errors.clone(),
            refines: s.refines,
        }
    }
}

fired_rules!();
