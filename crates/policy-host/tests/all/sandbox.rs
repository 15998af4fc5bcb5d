//! Hostile components: each is contained, reported as
//! `policy <name>: <what happened> at stage <n>` (or refused at load with a
//! message naming the problem), and the host keeps working afterwards.

use std::time::{Duration, Instant};

use nyann_model::observation::{RoleSignals, StageObservation};
use nyann_model::scenario::{Param, StopCondition, Value};
use nyann_policy_host::{CallFailure, PolicyError};

use crate::common;

fn mode(m: &str) -> Vec<Param> {
    vec![Param {
        name: "mode".into(),
        value: Value::Text(m.into()),
    }]
}

fn stage(index: u32) -> StageObservation {
    StageObservation {
        index,
        name: format!("#{index}"),
        ..Default::default()
    }
}

/// The built-in and the hostile policy in its harmless mode still answer.
async fn assert_host_healthy() {
    let builtin = common::builtin();
    let params = builtin
        .check_params(&StopCondition {
            params: vec![
                Param {
                    name: "waiting_requests_p50".into(),
                    value: Value::Number(1.0),
                },
                Param {
                    name: "ttft_p99".into(),
                    value: Value::Text("1s".into()),
                },
            ],
            location: None,
        })
        .unwrap();
    let busy = StageObservation {
        roles: vec![RoleSignals {
            role: "aggregate".into(),
            waiting_requests_p50: 5.0,
            ttft_p99_seconds: 3.0,
            ..Default::default()
        }],
        ..stage(9)
    };
    assert!(builtin.judge(&params, &busy, &[]).await.unwrap().congested);
    let hostile = common::guest("hostile-policy");
    let verdict = hostile.judge(&mode("ok"), &stage(9), &[]).await.unwrap();
    assert_eq!(verdict.reasons, vec!["hostile says congested"]);
}

async fn judge_err(m: &str, index: u32) -> PolicyError {
    let hostile = common::guest("hostile-policy");
    hostile
        .judge(&mode(m), &stage(index), &[])
        .await
        .unwrap_err()
}

#[tokio::test]
async fn infinite_loop_is_stopped_at_the_deadline() {
    let hostile = common::guest("hostile-policy");
    let start = Instant::now();
    let err = hostile
        .judge(&mode("loop"), &stage(7), &[])
        .await
        .unwrap_err();
    let elapsed = start.elapsed();
    assert_eq!(
        err.failure(),
        Some(&CallFailure::Deadline(Duration::from_millis(100)))
    );
    assert_eq!(
        err.to_string(),
        "policy hostile: ran past its 100 ms time limit and was stopped at stage 7"
    );
    // Never before the limit (the deadline is armed one tick late); the
    // upper bound only guards against "never stopped".
    assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    assert_host_healthy().await;
}

#[tokio::test]
async fn memory_bomb_hits_the_cap() {
    let err = judge_err("grow", 2).await;
    assert_eq!(err.failure(), Some(&CallFailure::MemoryCap(64 << 20)));
    assert_eq!(
        err.to_string(),
        "policy hostile: hit its memory cap of 64 MiB and was stopped at stage 2"
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn panic_message_is_captured() {
    let err = judge_err("panic", 4).await;
    assert!(
        matches!(err.failure(), Some(CallFailure::Crashed { .. })),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("policy hostile: panicked (panicked at "),
        "{msg}"
    );
    assert!(msg.contains("judge exploded on purpose"), "{msg}");
    assert!(msg.ends_with(" at stage 4"), "{msg}");
    assert_host_healthy().await;
}

#[tokio::test]
async fn ten_megabyte_reason_is_refused() {
    let err = judge_err("huge-reason", 5).await;
    assert_eq!(
        err.to_string(),
        "policy hostile: returned an oversized output (reason 1 is 10485760 bytes; the limit is 1 KiB) at stage 5"
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn too_many_reasons_are_refused() {
    let err = judge_err("many-reasons", 5).await;
    assert_eq!(err.failure().map(CallFailure::kind), Some("output"));
    assert!(
        err.to_string().contains("10000 reasons; the limit is 32"),
        "{err}"
    );
}

#[tokio::test]
async fn stderr_flood_is_bounded() {
    let err = judge_err("stderr-flood", 6).await;
    assert_eq!(
        err.to_string(),
        "policy hostile: returned an oversized output (wrote more than 64 KiB to stderr) at stage 6"
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn log_flood_is_dropped_not_fatal() {
    let hostile = common::guest("hostile-policy");
    let verdict = hostile
        .judge(&mode("log-flood"), &stage(1), &[])
        .await
        .unwrap();
    assert!(!verdict.congested);
}

#[tokio::test]
async fn err_result_is_reported() {
    let err = judge_err("err", 8).await;
    assert_eq!(
        err.failure(),
        Some(&CallFailure::Rejected("no verdict today".into()))
    );
    assert_eq!(
        err.to_string(),
        "policy hostile: returned an error: no verdict today at stage 8"
    );
}

#[test]
fn validate_panic_and_loop_become_parameter_errors() {
    let hostile = common::guest("hostile-policy");
    let stop = |m: &str| StopCondition {
        params: mode(m),
        location: None,
    };
    let err = hostile.check_params(&stop("validate-panic")).unwrap_err();
    assert!(
        err.to_string().contains("the policy's validate() panicked"),
        "{err}"
    );
    assert!(
        err.to_string().contains("validate exploded on purpose"),
        "{err}"
    );
    let err = hostile.check_params(&stop("validate-loop")).unwrap_err();
    assert!(
        err.to_string().contains("ran past its 100 ms time limit"),
        "{err}"
    );
    assert_eq!(hostile.check_params(&stop("ok")).unwrap(), mode("ok"));
}

#[tokio::test]
async fn concurrent_calls_are_independent() {
    let hostile = common::guest("hostile-policy");
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        let h = hostile.clone();
        let m = if i % 2 == 0 { "loop" } else { "ok" };
        tasks.push(tokio::spawn(async move {
            h.judge(&mode(m), &stage(i), &[]).await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        if i % 2 == 0 {
            assert_eq!(
                r.unwrap_err().failure().map(CallFailure::kind),
                Some("deadline")
            );
        } else {
            assert!(r.unwrap().congested);
        }
    }
}

fn load_err(bytes: &[u8]) -> String {
    common::host()
        .load_bytes("test.wasm", bytes)
        .unwrap_err()
        .to_string()
}

/// A component exporting `export` (an instance with one dummy function)
/// and importing `import`, if any.
fn wat_component(import: Option<&str>, export: &str) -> Vec<u8> {
    let import = import
        .map(|i| format!("(import \"{i}\" (instance))"))
        .unwrap_or_default();
    wat::parse_str(format!(
        r#"(component
            {import}
            (core module $m (func (export "f")))
            (core instance $i (instantiate $m))
            (func $f (canon lift (core func $i "f")))
            (instance $p (export "describe" (func $f)))
            (export "{export}" (instance $p)))"#
    ))
    .unwrap()
}

#[tokio::test]
async fn disallowed_import_is_refused_at_load() {
    let err = load_err(&wat_component(
        Some("wasi:sockets/tcp@0.2.3"),
        "nyann:policy/policy@0.1.0",
    ));
    assert!(err.starts_with("cannot load policy test.wasm: imports `wasi:sockets/tcp@0.2.3`, which policies may not use"), "{err}");
    let err = load_err(&wat_component(
        Some("acme:net/http@1.0.0"),
        "nyann:policy/policy@0.1.0",
    ));
    assert!(err.contains("imports `acme:net/http@1.0.0`"), "{err}");
    assert_host_healthy().await;
}

#[tokio::test]
async fn other_interface_versions_are_refused_naming_the_supported_ones() {
    for version in ["0.2.0", "1.0.0"] {
        let err = load_err(&wat_component(
            None,
            &format!("nyann:policy/policy@{version}"),
        ));
        assert_eq!(
            err,
            format!(
                "cannot load policy test.wasm: is built for nyann:policy@{version}; this host supports \
                 nyann:policy@0.1.x (rebuild the policy against the WIT printed by `nyann-bench policy wit`)"
            )
        );
    }
    let err = load_err(&wat_component(None, "acme:other/thing@0.1.0"));
    assert!(
        err.contains("does not export nyann:policy/policy (it exports acme:other/thing@0.1.0)"),
        "{err}"
    );
    // The right name with the wrong function types fails the bindgen check.
    let err = load_err(&wat_component(None, "nyann:policy/policy@0.1.0"));
    assert!(
        err.contains("does not implement nyann:policy@0.1.x as this host knows it"),
        "{err}"
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn core_module_and_random_bytes_are_refused() {
    let err = load_err(&wat::parse_str("(module (func (export \"judge\")))").unwrap());
    assert!(
        err.contains("is a core WebAssembly module, not a component"),
        "{err}"
    );

    // Deterministic noise, alone and behind a valid component header.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    assert!(load_err(&noise).contains("is not a WebAssembly component (no \\0asm header)"));
    let mut headed = b"\0asm\x0d\x00\x01\x00".to_vec();
    headed.extend_from_slice(&noise);
    assert!(load_err(&headed).contains("is not a valid component"));
    assert!(load_err(b"").contains("not a WebAssembly component"));
    let missing = common::host()
        .load_file(std::path::Path::new("/nonexistent/policy.wasm"))
        .unwrap_err();
    assert!(
        missing
            .to_string()
            .starts_with("cannot load policy /nonexistent/policy.wasm: cannot read it")
    );
    assert_host_healthy().await;
}
