//! Interface versions side by side: a component built against the frozen
//! 0.1 WIT (with wit-bindgen, no SDK) and 0.2 components load and run on the
//! same host; the host adapts what 0.1 lacks.

use std::time::Duration;

use nyann_guests::assembled::Assembled;
use nyann_model::SweepRef;
use nyann_model::observation::{ClientStats, StageObservation};
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
