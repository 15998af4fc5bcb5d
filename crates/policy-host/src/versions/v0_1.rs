//! `nyann:policy@0.1`: the first line, frozen (`wit/0.1`). The host adapts
//! the model to it: the counts, the integer kind and the sweep added in 0.2
//! are left out (a 0.1 policy never describes an integer parameter, so it
//! never receives one).

use nyann_model::observation::{
    ClientStats, ParamKind, PolicyInfo, RoleSignals, StageObservation, Verdict,
};
use nyann_model::scenario::{Param, Value};
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use crate::sandbox::{HostState, LogLevel};

wasmtime::component::bindgen!({
    path: "../../wit/0.1",
    world: "congestion-policy",
    // `log` may trap: a call that logs without end is stopped.
    imports: { default: trappable },
});

version_glue!();

impl From<&Value> for wit::Value {
    fn from(v: &Value) -> Self {
        match v {
            Value::Number(n) => wit::Value::Number(*n),
            // Unreachable in practice (see the module doc); the nearest value.
            Value::Integer(i) => wit::Value::Number(*i as f64),
            Value::Text(t) => wit::Value::Text(t.clone()),
            Value::Flag(b) => wit::Value::Flag(*b),
        }
    }
}

impl From<wit::Value> for Value {
    fn from(v: wit::Value) -> Self {
        match v {
            wit::Value::Number(n) => Value::Number(n),
            wit::Value::Text(t) => Value::Text(t),
            wit::Value::Flag(b) => Value::Flag(b),
        }
    }
}

impl From<wit::ParamKind> for ParamKind {
    fn from(k: wit::ParamKind) -> Self {
        match k {
            wit::ParamKind::Number => ParamKind::Number,
            wit::ParamKind::Fraction => ParamKind::Fraction,
            wit::ParamKind::Duration => ParamKind::Duration,
            wit::ParamKind::Text => ParamKind::Text,
            wit::ParamKind::Flag => ParamKind::Flag,
        }
    }
}

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
        }
    }
}

impl From<&StageObservation> for wit::StageObservation {
    fn from(s: &StageObservation) -> Self {
        wit::StageObservation {
            index: s.index,
            name: s.name.clone(),
            concurrency: s.concurrency,
            rate: s.rate,
            start_unix_seconds: s.start_unix_seconds,
            end_unix_seconds: s.end_unix_seconds,
            roles: s.roles.iter().map(wit::RoleSignals::from).collect(),
            client: (&s.client).into(),
            signal_errors: s.signal_errors.clone(),
        }
    }
}

/// Policies before 0.3 do not say; the host assumes they may read them.
fn server_signals(_: &wit::PolicyInfo) -> bool {
    true
}

/// Policies before 0.3 do not say which rule fired.
impl From<wit::Verdict> for Verdict {
    fn from(v: wit::Verdict) -> Self {
        Verdict {
            congested: v.congested,
            reasons: v.reasons,
            fired: Vec::new(),
        }
    }
}
