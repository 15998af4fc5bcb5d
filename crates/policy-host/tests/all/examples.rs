//! The example policies (`examples/policies/*`) built as real components
//! and judged on crafted histories.

use nyann_model::observation::{ClientStats, StageObservation};
use nyann_model::scenario::Value;

use crate::common::{self, stop};

fn stage(index: u32, tps: f64, ttft: f64, ok: u64, failed: u64) -> StageObservation {
    StageObservation {
        index,
        name: format!("c={}", 8 << index),
        concurrency: Some(8 << index),
        client: ClientStats {
            requests_ok: ok,
            requests_failed: failed,
            output_tokens_per_second: tps,
            ttft_p99_seconds: ttft,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn throughput_knee_stops_when_throughput_flattens_and_ttft_climbs() {
    let policy = common::guest("throughput-knee-policy");
    assert_eq!(policy.name(), "throughput-knee");
    let params = policy
        .check_params(&stop(&[("max_ttft_growth_pct", Value::Number(40.0))]))
        .unwrap();
    let sweep = [
        stage(0, 1000.0, 0.20, 100, 0),
        stage(1, 1900.0, 0.25, 100, 0),
        stage(2, 3500.0, 0.30, 100, 0),
        stage(3, 3600.0, 0.90, 100, 0),
    ];
    let mut verdicts = Vec::new();
    for i in 0..sweep.len() {
        verdicts.push(policy.judge(&params, &sweep[i], &sweep[..i]).await.unwrap());
    }
    assert_eq!(
        verdicts.iter().map(|v| v.congested).collect::<Vec<_>>(),
        [false, false, false, true]
    );
    assert!(
        verdicts[3].reasons[0]
            .starts_with("throughput knee: output 3600 tok/s is +2.9% over c=32 (min 5%)"),
        "{:?}",
        verdicts[3].reasons
    );
}

#[tokio::test]
async fn client_slo_uses_client_stats_and_history() {
    let policy = common::guest("client-slo-policy");
    assert_eq!(policy.name(), "client-slo");
    let params = policy
        .check_params(&stop(&[
            ("ttft_p99", Value::Text("500ms".into())),
            ("consecutive", Value::Number(2.0)),
        ]))
        .unwrap();
    assert_eq!(params[0].value, Value::Number(0.5));
    let sweep = [
        stage(0, 0.0, 0.2, 100, 0),
        stage(1, 0.0, 0.7, 100, 0), // breaks the TTFT limit once: not yet
        stage(2, 0.0, 0.3, 95, 5),  // 5% errors: breaks it again, two in a row
    ];
    let mut verdicts = Vec::new();
    for i in 0..sweep.len() {
        verdicts.push(policy.judge(&params, &sweep[i], &sweep[..i]).await.unwrap());
    }
    assert_eq!(
        verdicts.iter().map(|v| v.congested).collect::<Vec<_>>(),
        [false, false, true]
    );
    assert_eq!(
        verdicts[2].reasons,
        vec!["client SLO broken 2 stages in a row: error rate 5.0% (5 of 100) > 1.0%"]
    );

    let err = policy.check_params(&stop(&[
        ("ttft_p99", Value::Text("1s".into())),
        ("consecutive", Value::Number(0.5)),
    ]));
    // An integer parameter: the host refuses fractions before the policy.
    assert!(
        err.unwrap_err().to_string().ends_with(
            "parameter `consecutive` must be a whole number, got 0.5 (policy client-slo)"
        )
    );
    let err = policy.check_params(&stop(&[
        ("ttft_p99", Value::Text("1s".into())),
        ("consecutive", Value::Number(0.0)),
    ]));
    assert!(
        err.unwrap_err()
            .to_string()
            .contains("consecutive must be from 1 to 100 (got 0)")
    );
}

/// `goodput-floor` reads the SLO counts the host gives a 0.5 component:
/// the attainment and each goal's misses reach it as the model has them.
#[tokio::test]
async fn goodput_floor_judges_the_slo_counts_of_the_newest_line() {
    let policy = common::guest("goodput-floor-policy");
    assert_eq!(policy.interface(), nyann_policy_host::Interface::V0_5);
    assert!(!policy.info().server_signals);
    let params = policy.check_params(&stop(&[])).unwrap();
    assert_eq!(params[0].value, Value::Number(0.9));
    let goals = nyann_model::Slo::parse("ttft=500ms,tpot=50ms").unwrap();
    let with = |met: u64, missed: [u64; 3]| StageObservation {
        client: ClientStats {
            slo: Some(nyann_model::SloStats::of(goals, 200, met, missed, 10.0)),
            ..Default::default()
        },
        ..stage(0, 0.0, 0.1, 200, 0)
    };
    let calm = policy.judge(&params, &with(196, [4, 0, 0]), &[]).await;
    assert!(!calm.unwrap().congested);
    let verdict = policy
        .judge(&params, &with(120, [70, 20, 0]), &[])
        .await
        .unwrap();
    assert!(verdict.congested);
    assert_eq!(
        verdict.reasons,
        [
            "SLO ttft≤500ms, tpot≤50ms met by 60.0% of 200 requests (95%: 53.1-66.5%), under the \
          floor of 90% with 95% confidence; ttft missed by 35.0%, tpot missed by 10.0%; goodput \
          12.00 req/s"
        ]
    );
    // A stage without an SLO: the call fails, saying how to give one.
    let err = policy
        .judge(&params, &stage(0, 0.0, 0.1, 200, 0), &[])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("slo(ttft=\"500ms\""), "{err}");
    let err = policy.check_params(&stop(&[("floor", Value::Number(1.5))]));
    assert!(err.is_err(), "a floor above 1 is refused");
}
