//! The SLO on the client's records: each record judged against its stage's
//! goals when it is made ([`judge`]), and the counts a stage's statistics
//! keep of those judgments ([`SloCounts`]). The definitions (TPOT, what
//! counts as missed) are in [`nyann_model::slo`].

use nyann_model::{Answered, Slo, SloStats, tpot_seconds};
use serde::{Deserialize, Serialize};

use crate::record::{RequestRecord, Status};

/// Fills in `record`'s TPOT (when it was answered with two tokens or more)
/// and, under `slo`, which goals it missed and whether it met them all. A
/// request cancelled by an interrupt is not judged: the user stopped it,
/// not the server.
pub fn judge(record: &mut RequestRecord, slo: Option<&Slo>) {
    let answered = (record.status == Status::Ok).then(|| Answered {
        ttft_s: record.ttft_s,
        e2e_s: record.e2e_s.unwrap_or(0.0),
        output_tokens: record.output_tokens,
    });
    record.tpot_s = answered
        .as_ref()
        .and_then(|a| tpot_seconds(a.ttft_s, a.e2e_s, a.output_tokens));
    let Some(slo) = slo else { return };
    if record.status == Status::Cancelled {
        return;
    }
    record.slo_missed = slo.missed(answered.as_ref());
    record.slo_met = Some(record.slo_missed.is_empty());
}

/// A stage's judged records, counted, and the goals they were judged by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SloCounts {
    /// The goals (`None` until the stage's are known).
    goals: Option<Slo>,
    /// Counts of stages with different goals were merged (run totals of a
    /// scenario whose stages have different SLOs): no goodput is figured.
    #[serde(default)]
    mixed: bool,
    requests: u64,
    met: u64,
    /// Requests that missed each goal, in the order of [`Objective::ALL`](nyann_model::Objective::ALL).
    missed: [u64; 3],
}

impl SloCounts {
    /// The goals the records are judged by.
    pub(crate) fn judged_by(&mut self, goals: Slo) {
        match self.goals {
            None => self.goals = Some(goals),
            Some(known) if known != goals => self.mixed = true,
            Some(_) => {}
        }
    }

    pub(crate) fn add(&mut self, record: &RequestRecord) {
        let Some(met) = record.slo_met else { return };
        self.requests += 1;
        self.met += u64::from(met);
        for objective in &record.slo_missed {
            self.missed[objective.index()] += 1;
        }
    }

    /// Another stage's (or worker's) counts, added; saturating (a worker's
    /// counts come over the network).
    pub(crate) fn merge(&mut self, other: &SloCounts) {
        if let Some(goals) = other.goals {
            self.judged_by(goals);
        }
        self.mixed |= other.mixed;
        self.requests = self.requests.saturating_add(other.requests);
        self.met = self.met.saturating_add(other.met);
        for (mine, theirs) in self.missed.iter_mut().zip(other.missed) {
            *mine = mine.saturating_add(theirs);
        }
    }

    /// The stage's figures over `duration_s` seconds; `None` without goals
    /// (or with several).
    pub(crate) fn finish(&self, duration_s: f64) -> Option<SloStats> {
        let goals = self.goals.filter(|_| !self.mixed)?;
        Some(SloStats::of(
            goals,
            self.requests,
            self.met.min(self.requests),
            self.missed,
            duration_s,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_model::Objective;

    fn goals() -> Slo {
        Slo {
            ttft_s: Some(0.5),
            tpot_s: Some(0.05),
            e2e_s: None,
        }
    }

    fn ok(ttft: f64, e2e: f64, tokens: u64) -> RequestRecord {
        RequestRecord {
            ttft_s: Some(ttft),
            e2e_s: Some(e2e),
            output_tokens: Some(tokens),
            ..RequestRecord::sample(Status::Ok)
        }
    }

    fn judged(mut record: RequestRecord) -> RequestRecord {
        judge(&mut record, Some(&goals()));
        record
    }

    #[test]
    fn each_record_says_its_tpot_and_the_goals_it_missed() {
        let met = judged(ok(0.1, 1.1, 21));
        assert_eq!(met.tpot_s, Some(0.05));
        assert_eq!((met.slo_met, met.slo_missed.clone()), (Some(true), vec![]));
        let slow = judged(ok(0.6, 3.6, 21));
        assert_eq!(slow.slo_met, Some(false));
        assert_eq!(slow.slo_missed, vec![Objective::Ttft, Objective::Tpot]);
        // One output token: no TPOT, judged on TTFT alone.
        let one = judged(ok(0.2, 5.0, 1));
        assert_eq!((one.tpot_s, one.slo_met), (None, Some(true)));
        // Without an SLO the TPOT is still recorded, and nothing is judged.
        let mut plain = ok(0.6, 3.6, 21);
        judge(&mut plain, None);
        assert_eq!((plain.tpot_s.is_some(), plain.slo_met), (true, None));
    }

    #[test]
    fn errors_rejections_drops_and_late_requests_miss_every_goal() {
        for status in [
            Status::Failed,
            Status::Rejected,
            Status::Dropped,
            Status::Late,
        ] {
            let record = judged(RequestRecord::sample(status));
            assert_eq!(record.slo_met, Some(false), "{status:?}");
            assert_eq!(record.slo_missed, vec![Objective::Ttft, Objective::Tpot]);
        }
        // Even a failure that had started answering fast.
        let cut = judged(RequestRecord {
            status: Status::Failed,
            ..ok(0.1, 0.2, 3)
        });
        assert_eq!(cut.slo_met, Some(false));
        let cancelled = judged(RequestRecord::sample(Status::Cancelled));
        assert_eq!(cancelled.slo_met, None);
    }

    #[test]
    fn counts_make_goodput_and_keep_apart_stages_with_other_goals() {
        let mut counts = SloCounts::default();
        counts.judged_by(goals());
        for record in [
            ok(0.1, 1.1, 21),
            ok(0.1, 1.1, 21),
            ok(0.6, 1.1, 21),
            RequestRecord::sample(Status::Rejected),
        ] {
            counts.add(&judged(record));
        }
        counts.add(&judged(RequestRecord::sample(Status::Cancelled)));
        let stats = counts.finish(2.0).unwrap();
        assert_eq!((stats.requests, stats.met), (4, 2));
        assert_eq!(stats.goodput_per_second, 1.0);
        assert_eq!(stats.attainment, 0.5);
        assert_eq!(
            stats.goals.iter().map(|g| g.missed).collect::<Vec<_>>(),
            vec![2, 1]
        );
        let mut other = SloCounts::default();
        other.judged_by(Slo {
            e2e_s: Some(1.0),
            ..Slo::default()
        });
        let mut total = counts;
        total.merge(&other);
        assert_eq!(total.finish(2.0), None);
        let mut same = counts;
        same.merge(&counts);
        assert_eq!(same.finish(4.0).unwrap().goodput_per_second, 1.0);
        assert_eq!(SloCounts::default().finish(1.0), None);
    }
}
