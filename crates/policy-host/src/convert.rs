//! Conversions between the shared model types (`nyann_model`) and the
//! bindgen types of `wit/policy.wit`, which mirror each other field by field.

use nyann_model::observation::{
    ClientStats, ParamKind, ParamSpec, PolicyInfo, RoleSignals, StageObservation, Verdict,
};
use nyann_model::scenario::{Param, Value};

use crate::sandbox::wit;

pub(crate) fn value_to_wit(v: &Value) -> wit::Value {
    match v {
        Value::Number(n) => wit::Value::Number(*n),
        Value::Text(t) => wit::Value::Text(t.clone()),
        Value::Flag(b) => wit::Value::Flag(*b),
    }
}

pub(crate) fn value_from_wit(v: wit::Value) -> Value {
    match v {
        wit::Value::Number(n) => Value::Number(n),
        wit::Value::Text(t) => Value::Text(t),
        wit::Value::Flag(b) => Value::Flag(b),
    }
}

pub(crate) fn params_to_wit(params: &[Param]) -> Vec<wit::Param> {
    params
        .iter()
        .map(|p| wit::Param {
            name: p.name.clone(),
            value: value_to_wit(&p.value),
        })
        .collect()
}

fn kind_from_wit(k: wit::ParamKind) -> ParamKind {
    match k {
        wit::ParamKind::Number => ParamKind::Number,
        wit::ParamKind::Fraction => ParamKind::Fraction,
        wit::ParamKind::Duration => ParamKind::Duration,
        wit::ParamKind::Text => ParamKind::Text,
        wit::ParamKind::Flag => ParamKind::Flag,
    }
}

pub(crate) fn info_from_wit(info: wit::PolicyInfo) -> PolicyInfo {
    PolicyInfo {
        name: info.name,
        version: info.version,
        summary: info.summary,
        params: info
            .params
            .into_iter()
            .map(|s| ParamSpec {
                name: s.name,
                kind: kind_from_wit(s.kind),
                required: s.required,
                default: s.default.map(value_from_wit),
                doc: s.doc,
            })
            .collect(),
    }
}

fn role_to_wit(r: &RoleSignals) -> wit::RoleSignals {
    wit::RoleSignals {
        role: r.role.clone(),
        waiting_requests_p50: r.waiting_requests_p50,
        ttft_p99_seconds: r.ttft_p99_seconds,
        kv_cache_usage_max: r.kv_cache_usage_max,
        preemptions: r.preemptions,
        extra: r.extra.clone(),
    }
}

fn client_to_wit(c: &ClientStats) -> wit::ClientStats {
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

pub(crate) fn stage_to_wit(s: &StageObservation) -> wit::StageObservation {
    wit::StageObservation {
        index: s.index,
        name: s.name.clone(),
        concurrency: s.concurrency,
        rate: s.rate,
        start_unix_seconds: s.start_unix_seconds,
        end_unix_seconds: s.end_unix_seconds,
        roles: s.roles.iter().map(role_to_wit).collect(),
        client: client_to_wit(&s.client),
        signal_errors: s.signal_errors.clone(),
    }
}

pub(crate) fn verdict_from_wit(v: wit::Verdict) -> Verdict {
    Verdict {
        congested: v.congested,
        reasons: v.reasons,
    }
}
