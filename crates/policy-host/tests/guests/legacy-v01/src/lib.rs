//! A congestion policy for `nyann:policy@0.1`, written against the frozen
//! WIT (`wit/0.1`) with wit-bindgen and no SDK: what a third-party 0.1
//! component looks like. Congested when more than `max_failed` requests
//! failed; the reason echoes what the host passed, so the tests can check
//! the 0.2-to-0.1 adaptation. With `sleep_seconds`, `judge` first sleeps
//! that long: the sandbox (virtual clock included) applies to every line.

wit_bindgen::generate!({
    path: "../../../../../wit/0.1",
    world: "congestion-policy",
});

use exports::nyann::policy::policy::Guest;
use nyann::policy::types::{
    Param, ParamKind, ParamSpec, PolicyInfo, StageObservation, Value, Verdict,
};

struct Legacy;

fn number(params: &[Param], name: &str) -> Result<f64, String> {
    match params.iter().find(|p| p.name == name).map(|p| &p.value) {
        Some(Value::Number(n)) => Ok(*n),
        other => Err(format!("{name} must be a number, got {other:?}")),
    }
}

impl Guest for Legacy {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: "legacy".into(),
            version: "0.1.0".into(),
            summary: "Congested when more than max_failed requests failed (a 0.1 component)."
                .into(),
            params: vec![
                ParamSpec {
                    name: "max_failed".into(),
                    kind: ParamKind::Number,
                    required: false,
                    default: Some(Value::Number(10.0)),
                    doc: "failed requests per stage".into(),
                },
                ParamSpec {
                    name: "sleep_seconds".into(),
                    kind: ParamKind::Duration,
                    required: false,
                    default: Some(Value::Number(0.0)),
                    doc: "sleep this long in judge first".into(),
                },
            ],
        }
    }

    fn validate(params: Vec<Param>) -> Result<(), String> {
        let limit = number(&params, "max_failed")?;
        if limit < 0.0 {
            return Err(format!("max_failed must be >= 0 (got {limit})"));
        }
        Ok(())
    }

    fn judge(
        params: Vec<Param>,
        stage: StageObservation,
        history: Vec<StageObservation>,
    ) -> Result<Verdict, String> {
        let limit = number(&params, "max_failed")?;
        let sleep = number(&params, "sleep_seconds")?;
        if sleep > 0.0 {
            std::thread::sleep(std::time::Duration::from_secs_f64(sleep));
        }
        let failed = stage.client.requests_failed as f64;
        let seen = format!(
            "stage {} {:?} ok {} failed {} history {}",
            stage.index,
            stage.name,
            stage.client.requests_ok,
            stage.client.requests_failed,
            history.len()
        );
        Ok(Verdict {
            congested: failed > limit,
            reasons: vec![seen],
        })
    }
}

export!(Legacy);
