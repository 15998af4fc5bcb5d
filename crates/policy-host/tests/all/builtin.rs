//! describe/validate/judge round trips through the real embedded built-in
//! component, on the Go tool's cases.

use crate::common::{self, stop};

use nyann_model::observation::{ParamKind, RoleSignals, StageObservation};
use nyann_model::scenario::Value;
use nyann_policy_host::PolicyError;

fn role(name: &str, waiting: f64, ttft: f64, kv: f64, preemptions: f64) -> RoleSignals {
    RoleSignals {
        role: name.into(),
        waiting_requests_p50: waiting,
        ttft_p99_seconds: ttft,
        kv_cache_usage_max: kv,
        preemptions,
        extra: vec![],
    }
}

fn stage(index: u32, roles: Vec<RoleSignals>) -> StageObservation {
    StageObservation {
        index,
        name: format!("#{index}"),
        roles,
        ..Default::default()
    }
}

#[test]
fn describe_lists_the_four_parameters() {
    let policy = common::builtin();
    let info = policy.info();
    assert_eq!(info.name, "builtin");
    let names: Vec<_> = info
        .params
        .iter()
        .map(|p| (p.name.as_str(), p.kind, p.required, p.default.clone()))
        .collect();
    assert_eq!(
        names,
        vec![
            ("waiting_requests_p50", ParamKind::Number, true, None),
            ("ttft_p99", ParamKind::Duration, true, None),
            (
                "kv_cache_usage",
                ParamKind::Fraction,
                false,
                Some(Value::Number(0.95))
            ),
            (
                "preemptions",
                ParamKind::Number,
                false,
                Some(Value::Number(1.0))
            ),
        ]
    );
}

#[test]
fn check_params_fills_defaults_and_converts_durations() {
    let policy = common::builtin();
    let params = policy
        .check_params(&stop(&[
            ("waiting_requests_p50", Value::Number(32.0)),
            ("ttft_p99", Value::Text("2s".into())),
        ]))
        .unwrap();
    let values: Vec<_> = params
        .iter()
        .map(|p| (p.name.as_str(), p.value.clone()))
        .collect();
    assert_eq!(
        values,
        vec![
            ("waiting_requests_p50", Value::Number(32.0)),
            ("ttft_p99", Value::Number(2.0)),
            ("kv_cache_usage", Value::Number(0.95)),
            ("preemptions", Value::Number(1.0)),
        ]
    );
}

#[test]
fn check_params_errors_point_at_the_scenario_line() {
    let policy = common::builtin();
    let err = policy
        .check_params(&stop(&[
            ("waiting_requests_p50", Value::Number(32.0)),
            ("ttft", Value::Text("2s".into())),
        ]))
        .unwrap_err();
    assert!(matches!(err, PolicyError::Params { .. }));
    assert!(
        err.to_string()
            .starts_with("sweep.star:4:13: until_congested(...): unknown parameter `ttft`"),
        "{err}"
    );

    let err = policy
        .check_params(&stop(&[("waiting_requests_p50", Value::Number(32.0))]))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("missing required parameter `ttft_p99`"),
        "{err}"
    );

    // Refused by the policy's own validate(), inside the component.
    let err = policy
        .check_params(&stop(&[
            ("waiting_requests_p50", Value::Number(0.0)),
            ("ttft_p99", Value::Text("2s".into())),
        ]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "sweep.star:4:13: until_congested(...): waiting_requests_p50 must be > 0 (got 0) (policy builtin)"
    );
    let err = policy
        .check_params(&stop(&[
            ("waiting_requests_p50", Value::Number(8.0)),
            ("ttft_p99", Value::Text("750ms".into())),
            ("kv_cache_usage", Value::Number(0.0)),
        ]))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("kv_cache_usage must be in (0, 1] (got 0)"),
        "{err}"
    );
}

#[tokio::test]
async fn go_case_disaggregated_is_congested_with_two_reasons() {
    let policy = common::builtin();
    let params = policy
        .check_params(&stop(&[
            ("waiting_requests_p50", Value::Number(32.0)),
            ("ttft_p99", Value::Text("2s".into())),
            ("kv_cache_usage", Value::Number(0.95)),
            ("preemptions", Value::Number(2.0)),
        ]))
        .unwrap();
    let s = stage(
        3,
        vec![
            role("prefill", 40.0, 0.0, 0.0, 0.0),
            role("decode", 0.0, 2.5, 0.98, 3.0),
        ],
    );
    let verdict = policy.judge(&params, &s, &[]).await.unwrap();
    assert!(verdict.congested);
    assert_eq!(
        verdict.reasons,
        vec![
            "queueing: waiting p50 40 on prefill (threshold 32), TTFT p99 2.5s on decode (threshold 2s)",
            "KV cache on decode: usage 98.0% (threshold 95.0%), preemptions 3 (threshold 2)",
        ]
    );
}

#[tokio::test]
async fn go_case_low_signals_are_not_congested() {
    let policy = common::builtin();
    let params = policy
        .check_params(&stop(&[
            ("waiting_requests_p50", Value::Number(10.0)),
            ("ttft_p99", Value::Text("1s".into())),
            ("kv_cache_usage", Value::Number(0.95)),
            ("preemptions", Value::Number(1.0)),
        ]))
        .unwrap();
    let s = stage(0, vec![role("aggregate", 0.1, 0.1, 0.1, 0.1)]);
    let verdict = policy.judge(&params, &s, &[]).await.unwrap();
    assert!(!verdict.congested);
    assert!(verdict.reasons.is_empty());
}

#[tokio::test]
async fn go_case_kv_and_preemptions_on_different_roles_are_not_congested() {
    let policy = common::builtin();
    let params = policy
        .check_params(&stop(&[
            ("waiting_requests_p50", Value::Number(32.0)),
            ("ttft_p99", Value::Number(2.0)),
        ]))
        .unwrap();
    let s = stage(
        1,
        vec![
            role("prefill", 0.0, 0.0, 0.0, 10.0),
            role("decode", 0.0, 0.0, 0.99, 0.0),
        ],
    );
    assert!(!policy.judge(&params, &s, &[]).await.unwrap().congested);
}

#[test]
fn thresholds_are_inclusive_through_the_component() {
    let policy = common::builtin();
    let params = policy
        .check_params(&stop(&[
            ("waiting_requests_p50", Value::Number(32.0)),
            ("ttft_p99", Value::Text("2s".into())),
        ]))
        .unwrap();
    let equal = stage(0, vec![role("aggregate", 32.0, 2.0, 0.95, 1.0)]);
    let verdict = policy.judge_blocking(&params, &equal, &[]).unwrap();
    assert_eq!(verdict.reasons.len(), 2, "{:?}", verdict.reasons);
    let below = stage(0, vec![role("aggregate", 31.9, 1.99, 0.949, 0.9)]);
    assert!(
        !policy
            .judge_blocking(&params, &below, &[])
            .unwrap()
            .congested
    );
}

/// The binary embeds the committed `policies/builtin/builtin.wasm`; it must
/// be exactly what `policies/builtin` builds (paths are remapped and the
/// toolchain is pinned, so the build is the same bytes on any machine).
#[test]
fn embedded_component_is_built_from_policies_builtin() {
    let built = nyann_guests::repository_guest(nyann_guests::BUILTIN_PACKAGE)
        .unwrap_or_else(|e| panic!("{e}"));
    let built = std::fs::read(&built).unwrap();
    let embedded = nyann_policy_host::BUILTIN_WASM;
    let first_difference = built.iter().zip(embedded).position(|(a, b)| a != b);
    assert!(
        built == embedded,
        "{} ({} bytes) is not what policies/builtin builds ({} bytes, first difference at byte {}): regenerate it with `{}` and commit it",
        nyann_guests::BUILTIN_COMMITTED,
        embedded.len(),
        built.len(),
        first_difference.unwrap_or(built.len().min(embedded.len())),
        nyann_guests::REGENERATE_BUILTIN,
    );
}
