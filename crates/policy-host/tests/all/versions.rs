//! Interface versions side by side: a component built against the frozen
//! 0.1 WIT (with wit-bindgen, no SDK), the built-in as it was built for
//! 0.1, 0.2, 0.3 and 0.4 (committed fixtures) and 0.5 components load and
//! run on the same host; the host adapts what the older lines lack.

use std::time::Duration;

use nyann_guests::assembled::Assembled;
use nyann_model::SweepRef;
use nyann_model::observation::{ClientStats, RoleSignals, StageObservation};
use nyann_model::scenario::Value;
use nyann_policy_host::{CallFailure, Interface};

use crate::common::{self, stop};

/// A stage with everything 0.2 added: it reaches a 0.1 policy without them.
fn stage(index: u32, failed: u64) -> StageObservation {
    StageObservation {
        index,
        name: format!("#{index} c=8"),
        sweep: SweepRef {
            index: 0,
            name: "sweep.star:4:13".into(),
        },
        client: ClientStats {
            requests_ok: 100,
            requests_failed: failed,
            dropped: 7,
            requests_rejected: 3,
            requests_late: 1,
            ..ClientStats::default()
        },
        ..StageObservation::default()
    }
}

#[tokio::test]
async fn a_0_1_component_loads_and_runs_unchanged() {
    let legacy = common::guest("legacy-v01-policy");
    assert_eq!(legacy.interface(), Interface::V0_1);
    assert_eq!(legacy.name(), "legacy");
    let params = legacy
        .check_params(&stop(&[("max_failed", Value::Number(5.0))]))
        .unwrap();
    let history = [stage(0, 0)];
    let verdict = legacy
        .judge(&params, &stage(1, 12), &history)
        .await
        .unwrap();
    assert!(verdict.congested);
    assert_eq!(
        verdict.reasons,
        ["stage 1 \"#1 c=8\" ok 100 failed 12 history 1"]
    );
    let err = legacy
        .check_params(&stop(&[("max_failed", Value::Number(-1.0))]))
        .unwrap_err();
    assert!(
        err.to_string().contains("max_failed must be >= 0 (got -1)"),
        "{err}"
    );
}

/// A line before 0.4 does not know capacity-search stages: it is shown a
/// search stage as one more stage of the sweep, after the stages of lower
/// level only (a 0.1 policy that counts its `history` says 2, not 4).
#[tokio::test]
async fn an_older_line_sees_a_search_stage_after_the_levels_below_it() {
    let legacy = common::guest("legacy-v01-policy");
    let params = legacy
        .check_params(&stop(&[("max_failed", Value::Number(5.0))]))
        .unwrap();
    let at = |index: u32, concurrency: u32, refines: Option<u32>| StageObservation {
        concurrency: Some(concurrency),
        refines,
        ..stage(index, 0)
    };
    // The sweep 8, 16, 32 (congested), then the search stage 24.
    let history = [
        at(0, 8, None),
        at(1, 16, None),
        at(2, 32, None),
        at(3, 24, Some(2)),
    ];
    let searched = StageObservation {
        client: stage(4, 12).client,
        ..at(4, 20, Some(2))
    };
    let verdict = legacy.judge(&params, &searched, &history).await.unwrap();
    assert_eq!(
        verdict.reasons,
        ["stage 4 \"#4 c=8\" ok 100 failed 12 history 2"]
    );
    // A sweep stage sees its whole history, as before.
    let swept = StageObservation {
        refines: None,
        ..searched
    };
    let verdict = legacy.judge(&params, &swept, &history).await.unwrap();
    assert_eq!(
        verdict.reasons,
        ["stage 4 \"#4 c=8\" ok 100 failed 12 history 4"]
    );
}

#[tokio::test]
async fn the_sandbox_applies_to_0_1_components_too() {
    let legacy = common::guest("legacy-v01-policy");
    let params = legacy
        .check_params(&stop(&[("sleep_seconds", Value::Text("10s".into()))]))
        .unwrap();
    let err = legacy.judge(&params, &stage(0, 0), &[]).await.unwrap_err();
    assert_eq!(
        err.failure(),
        Some(&CallFailure::Blocked(Duration::from_secs(10)))
    );
}

/// The built-in policy's component as its source built it for an older
/// line, kept so that each adapter always runs a real component of its line
/// as that line's SDK and toolchain built it: `tests/fixtures/builtin-0.1.wasm`
/// (`policies/builtin/builtin.wasm` as committed at 20efdab) and
/// `builtin-0.2.wasm` (at 5624f13), `builtin-0.3.wasm` (at 76e0ba0) and
/// `builtin-0.4.wasm` (at 8402031).
fn old_builtin(line: &str) -> nyann_policy_host::Policy {
    let file = format!("builtin-{line}.wasm");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(&file);
    let bytes = std::fs::read(path).unwrap();
    common::host().load_bytes(&file, &bytes).unwrap()
}

#[tokio::test]
async fn the_0_1_built_in_judges_as_the_newest_one_without_naming_rules() {
    let old = old_builtin("0.1");
    assert_eq!(old.interface(), Interface::V0_1);
    judges_as_the_newest(&old, false).await;
}

#[tokio::test]
async fn the_0_2_built_in_judges_as_the_newest_one_without_naming_rules() {
    let old = old_builtin("0.2");
    assert_eq!(old.interface(), Interface::V0_2);
    judges_as_the_newest(&old, false).await;
}

#[tokio::test]
async fn the_0_3_built_in_judges_as_the_newest_one() {
    let old = old_builtin("0.3");
    assert_eq!(old.interface(), Interface::V0_3);
    judges_as_the_newest(&old, true).await;
}

/// The 0.4 built-in is shown a stage with an SLO (which its line has no
/// record for) and judges it as the newest does.
#[tokio::test]
async fn the_0_4_built_in_judges_as_the_newest_one() {
    let old = old_builtin("0.4");
    assert_eq!(old.interface(), Interface::V0_4);
    judges_as_the_newest(&old, true).await;
}

/// `old` (an older line's built-in) gives the newest built-in's verdict and
/// reasons on a congested stage, and the rules that fired if its line can
/// say them (0.3 on).
async fn judges_as_the_newest(old: &nyann_policy_host::Policy, names_rules: bool) {
    let new = common::builtin();
    assert_eq!(new.interface(), Interface::NEWEST);
    assert!(old.info().server_signals && new.info().server_signals);
    let stop = stop(&[
        ("waiting_requests_p50", Value::Number(8.0)),
        ("ttft_p99", Value::Text("1s".into())),
    ]);
    let stage = StageObservation {
        roles: vec![RoleSignals {
            role: "aggregate".into(),
            waiting_requests_p50: 20.0,
            ttft_p99_seconds: 2.0,
            kv_cache_usage_max: 0.99,
            preemptions: 5.0,
            extra: Vec::new(),
        }],
        ..stage(3, 0)
    };
    // What the newest line added: a 0.4 policy is judged without it.
    let mut stage = stage;
    stage.client.slo = Some(nyann_model::SloStats::of(
        nyann_model::Slo::parse("ttft=500ms,tpot=50ms").unwrap(),
        100,
        80,
        [20, 5, 0],
        10.0,
    ));
    let old_verdict = old
        .judge(&old.check_params(&stop).unwrap(), &stage, &[])
        .await
        .unwrap();
    let new_verdict = new
        .judge(&new.check_params(&stop).unwrap(), &stage, &[])
        .await
        .unwrap();
    assert!(old_verdict.congested && new_verdict.congested);
    assert_eq!(old_verdict.reasons, new_verdict.reasons);
    if names_rules {
        assert_eq!(old_verdict.fired, new_verdict.fired);
    } else {
        assert!(old_verdict.fired.is_empty(), "lines before 0.3 do not say");
    }
    let fired: Vec<_> = new_verdict
        .fired
        .iter()
        .map(|f| (f.rule.as_str(), f.role.as_deref(), f.signals.join(",")))
        .collect();
    assert_eq!(
        fired,
        [
            (
                "queueing",
                Some("aggregate"),
                "waiting_requests_p50,ttft_p99_seconds".to_string()
            ),
            (
                "kv-cache",
                Some("aggregate"),
                "kv_cache_usage_max,preemptions".to_string()
            ),
        ]
    );
}

#[tokio::test]
async fn assembled_0_1_and_0_2_components_both_run() {
    for (line, interface) in [("0.1", Interface::V0_1), ("0.2", Interface::V0_2)] {
        let bytes = common::assembled(line, &Assembled::default(), str::to_string);
        let policy = common::host().load_bytes(line, &bytes).unwrap();
        assert_eq!(policy.interface(), interface);
        let verdict = policy.judge(&[], &stage(2, 50), &[]).await.unwrap();
        assert!(!verdict.congested, "{line}");
    }
}

#[test]
fn the_built_in_implements_the_newest_line() {
    assert_eq!(common::builtin().interface(), Interface::NEWEST);
}
