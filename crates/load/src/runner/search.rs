//! The capacity search after a sweep stops (`until_congested(...,
//! refine=N)`): the levels to try between the last one judged not congested
//! and the first judged congested, by bisection (halving downwards when no
//! level below the congested one was clean), until the bounds are the
//! resolution apart or the stages are spent. With `confirm=M` a level whose
//! verdict was a close call is judged again (up to M more stages) before
//! the search moves on, and its verdicts settle it ([`settle`]).

use nyann_model::{Scenario, Stage, Step};

/// Stages the capacity searches of `scenario` may add: each sweep's
/// `refine` once, and as many again per `confirm`.
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
            total += search.stages as usize * (1 + search.confirm as usize);
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

/// Verdicts this near a threshold (relative: the margin a judge gives,
/// see [`Vote::margin`]) are close calls: the level could be judged the
/// other way on another run.
pub const CLOSE_CALL: f64 = 0.10;

/// One verdict on a level.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Vote {
    pub congested: bool,
    /// How far the verdict was from flipping (relative; positive over
    /// the thresholds, negative under), when the judge can say.
    pub margin: Option<f64>,
}

impl Vote {
    /// Within [`CLOSE_CALL`] of flipping.
    pub fn close(&self) -> bool {
        self.margin.is_some_and(|m| m.abs() < CLOSE_CALL)
    }
}

/// The verdict of a level judged `votes.len()` times: the majority, and on
/// a tie the verdict farthest from its threshold (the clearer reading).
pub fn settle(votes: &[Vote]) -> bool {
    let congested = votes.iter().filter(|v| v.congested).count();
    let clean = votes.len() - congested;
    if congested != clean {
        return congested > clean;
    }
    votes
        .iter()
        .max_by(|a, b| {
            let far = |v: &Vote| v.margin.map_or(0.0, f64::abs);
            far(a).total_cmp(&far(b))
        })
        .is_some_and(|v| v.congested)
}

/// A capacity search under way: its bounds, the stages it has left, and
/// the level being confirmed.
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    pub bounds: Bounds,
    /// New levels it may still try (`refine=`).
    levels_left: u32,
    /// Most extra verdicts per close-call level (`confirm=`).
    confirm: u32,
    /// The level being judged again, and its verdicts so far.
    confirming: Option<(f64, Vec<Vote>)>,
}

impl Search {
    /// A search within `bounds` of `levels` new levels, each close call
    /// judged up to `confirm` more times.
    pub fn new(bounds: Bounds, levels: u32, confirm: u32) -> Search {
        Search {
            bounds,
            levels_left: levels,
            confirm,
            confirming: None,
        }
    }

    /// The next level to run: the close call being confirmed, else the
    /// bisection's, while levels are left; `None` when the search is done.
    pub fn next(&self) -> Option<f64> {
        match &self.confirming {
            Some((level, _)) => Some(*level),
            None if self.levels_left > 0 => self.bounds.next(),
            None => None,
        }
    }

    /// `level` (the one [`Search::next`] gave) was judged.
    pub fn judged(&mut self, level: f64, vote: Vote) {
        let mut votes = match self.confirming.take() {
            Some((confirming, votes)) if confirming == level => votes,
            _ => {
                self.levels_left = self.levels_left.saturating_sub(1);
                Vec::new()
            }
        };
        votes.push(vote);
        let extra = votes.len() - 1;
        if vote.close() && extra < self.confirm as usize {
            self.confirming = Some((level, votes));
        } else {
            self.bounds.judged(level, settle(&votes));
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

    /// With `confirm=1` a close call is judged once more before the search
    /// moves on; a tie goes to the clearer verdict; a clear verdict is not
    /// judged again.
    #[test]
    fn a_close_call_is_confirmed_before_the_search_moves_on() {
        let vote = |congested, margin| Vote {
            congested,
            margin: Some(margin),
        };
        let mut search = Search::new(Bounds::new(Some(8.0), 32.0, true, None), 4, 1);
        assert_eq!(search.next(), Some(20.0));
        // At the threshold exactly: congested, but a close call.
        search.judged(20.0, vote(true, 0.0));
        assert_eq!(search.next(), Some(20.0), "judged again");
        // Clean, 12% under: the clearer of a tie.
        search.judged(20.0, vote(false, -0.12));
        assert_eq!(search.bounds.clean, Some(20.0));
        assert_eq!(search.next(), Some(26.0));
        // A clear verdict moves on at once.
        search.judged(26.0, vote(true, 0.5));
        assert_eq!(search.next(), Some(23.0));
        // A second close call that stays close is settled after one more
        // (confirm=1), by the clearer of the two.
        search.judged(23.0, vote(false, -0.05));
        assert_eq!(search.next(), Some(23.0));
        search.judged(23.0, vote(true, 0.02));
        assert_eq!(search.bounds.clean, Some(23.0), "-5% is clearer than +2%");
        assert_eq!(search.bounds.congested, 26.0);
        // Four levels in all: the last one.
        assert_eq!(search.next(), Some(24.0));
        search.judged(24.0, vote(false, -0.5));
        assert_eq!(search.next(), None, "refine=4 levels spent");
        // Without confirm= a close call settles at once.
        let mut search = Search::new(Bounds::new(Some(8.0), 32.0, true, None), 4, 0);
        search.judged(20.0, vote(true, 0.0));
        assert_eq!(search.bounds.congested, 20.0);
    }

    #[test]
    fn a_majority_settles_a_level_and_a_tie_goes_to_the_clearer_verdict() {
        let vote = |congested, margin| Vote { congested, margin };
        assert!(settle(&[
            vote(true, Some(0.0)),
            vote(true, Some(-0.0)),
            vote(false, Some(-0.9))
        ]));
        assert!(!settle(&[vote(true, Some(0.01)), vote(false, Some(-0.02))]));
        assert!(settle(&[vote(true, Some(0.05)), vote(false, None)]));
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
