//! The SLO side of a sweep's conclusion: a capacity said under the SLO its
//! policy judged by ("capacity under SLO ttft≤500ms, tpot≤50ms (93% met)"),
//! and the level at which the most requests per second met their SLO,
//! which need not be the level of the highest throughput.

use nyann_load::StageStatus;
use serde::{Deserialize, Serialize};

use crate::record::{CongestionRecord, StageResult};

/// The SLO a capacity search's verdicts were given by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UnderSlo {
    /// The goals, `ttft≤500ms, tpot≤50ms`.
    pub slo: String,
    /// The share of the clean level's requests that met them; absent when
    /// no level was clean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attainment: Option<f64>,
}

/// The level of a sweep with the most goodput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MostGoodput {
    /// Position in the scenario's steps (as in `stages.json`).
    pub stage: usize,
    pub label: String,
    #[serde(flatten)]
    pub level: crate::conclusion::Level,
    /// The goals, `ttft≤500ms, tpot≤50ms`.
    pub slo: String,
    /// Requests per second that met every goal.
    pub goodput_per_second: f64,
    /// The share of its requests that met every goal.
    pub attainment: f64,
    /// Its throughput, for comparison.
    pub requests_per_second: f64,
}

/// Whether `record`'s verdict rests on the SLO: a rule it fired names an
/// SLO figure (`slo.attainment`, as `goodput-floor` does).
fn judged_by_slo(record: &CongestionRecord) -> bool {
    record.verdict.as_ref().is_some_and(|v| {
        v.fired
            .iter()
            .any(|rule| rule.signals.iter().any(|s| s.starts_with("slo.")))
    })
}

/// The SLO a capacity between `clean` and `congested` (stage indexes) was
/// found under: when the congested bound's verdict rests on its SLO.
pub(crate) fn under_slo(
    stages: &[StageResult],
    clean: Option<usize>,
    congested: usize,
) -> Option<UnderSlo> {
    let at = |index: usize| stages.iter().find(|s| s.index == index);
    let bound = at(congested)?;
    if !CongestionRecord::of(bound).is_some_and(judged_by_slo) {
        return None;
    }
    let slo = bound.client.as_ref()?.slo.as_ref()?;
    let attainment = clean
        .and_then(|index| at(index)?.client.as_ref()?.slo.as_ref())
        .map(|s| s.attainment);
    Some(UnderSlo {
        slo: slo.slo.to_string(),
        attainment,
    })
}

/// The measured stage of sweep `sweep` whose requests met their SLO most
/// often per second; `None` when its stages have no SLO.
pub(crate) fn most_goodput(stages: &[StageResult], sweep: u32) -> Option<MostGoodput> {
    stages
        .iter()
        .filter(|s| s.status == StageStatus::Measured)
        .filter(|s| CongestionRecord::of(s).is_some_and(|r| r.sweep.index == sweep))
        .filter_map(|s| Some((s, s.client.as_ref()?)))
        .filter_map(|(s, client)| Some((s, client, client.slo.as_ref()?)))
        .max_by(|a, b| a.2.goodput_per_second.total_cmp(&b.2.goodput_per_second))
        .map(|(stage, client, slo)| MostGoodput {
            stage: stage.index,
            label: stage.label.clone(),
            level: crate::conclusion::Level {
                concurrency: stage.concurrency,
                rate: stage.rate,
            },
            slo: slo.slo.to_string(),
            goodput_per_second: slo.goodput_per_second,
            attainment: slo.attainment,
            requests_per_second: client.requests_per_second,
        })
}

impl UnderSlo {
    /// `under SLO ttft≤500ms, tpot≤50ms (93% met)`.
    pub fn words(&self) -> String {
        match self.attainment {
            Some(a) => format!("under SLO {} ({} met)", self.slo, percent(a)),
            None => format!("under SLO {}", self.slo),
        }
    }
}

impl MostGoodput {
    /// `#1 c=8 (concurrency=8): 9.5 req/s met ttft≤500ms, tpot≤50ms (96% of 9.9 req/s)`.
    pub fn words(&self) -> String {
        format!(
            "{} ({}): {:.1} req/s met {} ({} of {:.1} req/s)",
            self.label,
            self.level,
            self.goodput_per_second,
            self.slo,
            percent(self.attainment),
            self.requests_per_second
        )
    }
}

/// A share as a whole percentage, never rounded up to 100% (99.6% is `99%`).
fn percent(share: f64) -> String {
    // The epsilon keeps 0.29 (28.999...% in floating point) at 29%.
    let p = (share * 100.0 + 1e-9).floor();
    format!("{p:.0}%")
}
