//! A policy that asserts on what it is shown: each judged stage must have
//! exactly `requests` finished requests (ok + failed) and, when the
//! `concurrency` parameter is given, that many streams; otherwise the call
//! fails with both figures. Never congested. Used by the scale-out tests:
//! with `max_requests` stages the fleet's count is exact, and one worker's
//! share would be a fraction of it.

use nyann_policy::{Params, Policy, PolicyInfo, StageObservation, Verdict, spec};

struct RequestCount;

impl Policy for RequestCount {
    fn describe() -> PolicyInfo {
        PolicyInfo::new(
            "request-count",
            "0.0.0",
            "Fails unless each stage it judges finished exactly `requests` requests.",
        )
        .param(spec::integer("requests", "requests every judged stage must have").required())
        .param(spec::integer(
            "concurrency",
            "streams every judged stage must have (unchecked when absent)",
        ))
    }

    fn validate(params: &Params) -> Result<(), String> {
        params.integer("requests").map(|_| ())
    }

    fn judge(
        params: &Params,
        stage: &StageObservation,
        _history: &[StageObservation],
    ) -> Result<Verdict, String> {
        let expected = params.integer("requests")?;
        let seen = stage.client.requests_ok + stage.client.requests_failed;
        if i64::try_from(seen) != Ok(expected) {
            return Err(format!(
                "{}: shown {seen} requests, expected {expected}",
                stage.name
            ));
        }
        if params.get("concurrency").is_some() {
            let expected = params.integer("concurrency")?;
            let seen = stage.concurrency.map(i64::from);
            if seen != Some(expected) {
                return Err(format!(
                    "{}: shown concurrency {seen:?}, expected {expected}",
                    stage.name
                ));
            }
        }
        Ok(Verdict::ok())
    }
}

nyann_policy::export_policy!(RequestCount);
