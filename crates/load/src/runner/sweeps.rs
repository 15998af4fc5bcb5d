//! Which steps a stop skips. A sweep is the stages of one
//! `until_congested(...)` call: a stop decided after one of its stages
//! skips the rest of that sweep only, and the steps after it (plain stages,
//! barriers, another sweep) run. A stop after a stage outside any sweep (a
//! hook of the caller's own) skips every later step.

use std::collections::BTreeMap;

use nyann_model::Step;

/// The stops decided so far.
#[derive(Debug, Default)]
pub(super) struct Stops {
    /// A stop outside any sweep: every later step is skipped.
    everything: Option<String>,
    /// Stopped sweeps, with the reason recorded on their skipped stages.
    sweeps: BTreeMap<u32, String>,
    /// Every stop, in order: (stage index, reason).
    pub(super) all: Vec<(usize, String)>,
}

impl Stops {
    /// Records a stop after stage `index` (of sweep `sweep`, if in one).
    pub(super) fn stop(&mut self, index: usize, sweep: Option<u32>, reason: String) {
        match sweep {
            Some(sweep) => {
                self.sweeps.insert(sweep, reason.clone());
            }
            None => self.everything = Some(reason.clone()),
        }
        self.all.push((index, reason));
    }

    /// Why `step` is skipped, if a stop skips it.
    pub(super) fn skips(&self, step: &Step) -> Option<&str> {
        if let Some(reason) = &self.everything {
            return Some(reason);
        }
        match step {
            Step::Stage(stage) => stage
                .sweep()
                .and_then(|sweep| self.sweeps.get(&sweep))
                .map(String::as_str),
            Step::Barrier { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_model::{Mode, Stage, StopCondition};

    fn stage(sweep: Option<u32>) -> Step {
        Step::Stage(Stage {
            concurrency: Some(1),
            stop: sweep.map(|_| StopCondition {
                params: Vec::new(),
                location: None,
                param_locations: Vec::new(),
                search: None,
            }),
            sweep: sweep.unwrap_or(0),
            ..Stage::new(1.0, Mode::Concurrent)
        })
    }

    #[test]
    fn a_sweep_stop_skips_that_sweep_only() {
        let mut stops = Stops::default();
        stops.stop(1, Some(0), "congested".into());
        assert_eq!(stops.skips(&stage(Some(0))), Some("congested"));
        assert_eq!(stops.skips(&stage(Some(1))), None);
        assert_eq!(stops.skips(&stage(None)), None);
        assert_eq!(stops.skips(&Step::Barrier { drain: true }), None);
        stops.stop(4, Some(1), "again".into());
        assert_eq!(stops.skips(&stage(Some(1))), Some("again"));
        assert_eq!(stops.all.len(), 2);
    }

    #[test]
    fn a_stop_outside_any_sweep_skips_everything_after() {
        let mut stops = Stops::default();
        stops.stop(0, None, "enough".into());
        for step in [stage(None), stage(Some(3)), Step::Barrier { drain: false }] {
            assert_eq!(stops.skips(&step), Some("enough"));
        }
    }
}
