//! Goodput in the stage table: the column (requests/s that met every goal
//! of the stage's SLO, and the share of requests that did) and its note.

use nyann_check::{RunResult, StageResult};
use nyann_model::Slo;

pub(crate) const HEADER: &str = "goodput";

/// The distinct SLOs of the run's stages, in order (empty: no stage had one).
pub(crate) fn slos(result: &RunResult) -> Vec<Slo> {
    let mut slos: Vec<Slo> = Vec::new();
    for stage in &result.stages {
        if let Some(slo) = stage.client.as_ref().and_then(|c| c.slo.as_ref())
            && !slos.contains(&slo.slo)
        {
            slos.push(slo.slo);
        }
    }
    slos
}

/// `12.3/s 91%`: goodput and attainment; `-` for a stage without either.
pub(crate) fn cell(stage: &StageResult) -> String {
    match stage.client.as_ref().and_then(|c| c.slo.as_ref()) {
        Some(s) => format!("{:.1}/s {:.0}%", s.goodput_per_second, 100.0 * s.attainment),
        None => "-".into(),
    }
}

/// What the column means, naming the SLO when the stages share one.
pub(crate) fn note(slos: &[Slo]) -> Option<String> {
    let goals = match slos {
        [] => return None,
        [one] => format!("SLO {one}"),
        _ => "its stage's SLO".into(),
    };
    Some(format!(
        "goodput: requests/s that met every goal of {goals}, and the share of the stage's \
         requests that did (failed, rejected, dropped and late ones missed); each goal's misses: \
         client.slo in stages.json, slo_met and slo_missed in requests.jsonl"
    ))
}
