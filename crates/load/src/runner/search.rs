//! The capacity search after a sweep stops (`until_congested(...,
//! refine=N)`): the levels to try between the last one judged not congested
//! and the first judged congested, by bisection (halving downwards when no
//! level below the congested one was clean), until the bounds are the
//! resolution apart or the stages are spent.

use nyann_model::{Scenario, Stage, Step};

/// Stages the capacity searches of `scenario` may add: each sweep's
/// `refine` once.
pub(super) fn slots(scenario: &Scenario) -> usize {
    let mut seen: Vec<u32> = Vec::new();
    let mut total = 0;
    for step in &scenario.steps {
        let Step::Stage(stage) = step else { continue };
        let Some(search) = stage.stop.as_ref().and_then(|s| s.search) else {
            continue;
        };
        if !seen.contains(&stage.sweep) {
            seen.push(stage.sweep);
            total += search.stages as usize;
        }
    }
    total
}

/// A stage's level: its concurrency, else its rate.
pub fn level(stage: &Stage) -> Option<f64> {
    stage.concurrency.map(f64::from).or(stage.rate)
}

/// The highest of `levels` below `congested`: where a search's clean
/// bound starts.
pub fn highest_below(levels: impl IntoIterator<Item = f64>, congested: f64) -> Option<f64> {
    levels
        .into_iter()
        .filter(|&l| l < congested)
        .reduce(f64::max)
}

/// Where a search stands: the highest level judged not congested (if any)
/// and the lowest judged congested.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub clean: Option<f64>,
    pub congested: f64,
    /// Levels are streams (whole numbers), not requests per second.
    pub streams: bool,
    /// The search ends when the bounds are this close.
    pub resolution: f64,
    /// The lowest level worth trying (one stream; a fleet's workers each
    /// need one).
    pub floor: f64,
}

impl Bounds {
    /// The bounds of a search whose congested stage is at `congested`,
    /// `clean` the highest level below it judged not congested.
    pub fn new(
        clean: Option<f64>,
        congested: f64,
        streams: bool,
        resolution: Option<f64>,
    ) -> Bounds {
        let resolution = resolution.unwrap_or(if streams { 1.0 } else { congested * 0.05 });
        Bounds {
            clean,
            congested,
            streams,
            resolution,
            floor: if streams { 1.0 } else { 0.0 },
        }
    }

    /// The next level to try, or `None` when the search is done.
    pub fn next(&self) -> Option<f64> {
        let whole = |x: f64| if self.streams { x.floor() } else { x };
        let level = match self.clean {
            // Nothing clean yet: halve, down to the floor.
            None => whole(self.congested / 2.0).max(self.floor),
            Some(clean) if self.congested - clean <= self.resolution => return None,
            Some(clean) => whole((clean + self.congested) / 2.0),
        };
        let above_clean = self.clean.is_none_or(|clean| level > clean);
        (level >= self.floor && level > 0.0 && level < self.congested && above_clean)
            .then_some(level)
    }

    /// `level` was judged: congested or not.
    pub fn judged(&mut self, level: f64, congested: bool) {
        if congested {
            self.congested = level;
        } else {
            self.clean = Some(level);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a search whose server congests from `knee` up.
    fn search(clean: Option<f64>, congested: f64, knee: f64, stages: u32) -> (Vec<f64>, Bounds) {
        let mut bounds = Bounds::new(clean, congested, true, None);
        let mut tried = Vec::new();
        for _ in 0..stages {
            let Some(level) = bounds.next() else { break };
            tried.push(level);
            bounds.judged(level, level >= knee);
        }
        (tried, bounds)
    }

    #[test]
    fn bisection_between_the_clean_and_the_congested_level() {
        let (tried, bounds) = search(Some(8.0), 32.0, 23.0, 4);
        assert_eq!(tried, [20.0, 26.0, 23.0, 21.0]);
        assert_eq!((bounds.clean, bounds.congested), (Some(21.0), 23.0));
        // One more stage reaches adjacent levels, and the search ends.
        let (tried, bounds) = search(Some(8.0), 32.0, 23.0, 10);
        assert_eq!(tried, [20.0, 26.0, 23.0, 21.0, 22.0]);
        assert_eq!((bounds.clean, bounds.congested), (Some(22.0), 23.0));
    }

    #[test]
    fn a_congested_first_stage_searches_down_by_halving() {
        let (tried, bounds) = search(None, 128.0, 23.0, 4);
        assert_eq!(tried, [64.0, 32.0, 16.0, 24.0]);
        assert_eq!((bounds.clean, bounds.congested), (Some(16.0), 24.0));
        // Congested even at one stream: nothing lower to try.
        let (tried, bounds) = search(None, 4.0, 0.5, 8);
        assert_eq!(tried, [2.0, 1.0]);
        assert_eq!((bounds.clean, bounds.congested), (None, 1.0));
    }

    #[test]
    fn rates_are_bisected_to_the_resolution() {
        let mut bounds = Bounds::new(Some(10.0), 40.0, false, None);
        let mut tried = Vec::new();
        while let Some(level) = bounds.next() {
            tried.push(level);
            bounds.judged(level, level >= 31.0);
        }
        // Until 2 req/s apart (5% of 40).
        assert_eq!(tried, [25.0, 32.5, 28.75, 30.625]);
        assert!(bounds.congested - bounds.clean.unwrap() <= 2.0);
        assert!(bounds.clean.unwrap() < 31.0 && bounds.congested >= 31.0);
    }
}
