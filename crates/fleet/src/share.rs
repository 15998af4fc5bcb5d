//! How the load is divided between `n` workers, like the Go tool but with
//! `max_requests` divided too: counts (concurrency, `max_inflight`,
//! conversation pool sizes, `max_requests`) are `total / n`, plus one for
//! the first `total % n` workers; rates are `total / n`. Each worker gets a
//! seed derived from the leader's and a disjoint range of request and
//! conversation ids, so the whole run is reproducible from one seed.

use nyann_model::{Scenario, Stage, Step};

/// Ids of worker `i` start at `i << ID_BITS`.
const ID_BITS: u32 = 40;

/// A stage that cannot be divided between the workers.
#[derive(Debug, thiserror::Error)]
#[error(
    "step {index}: {what} {total} cannot be divided between {workers} workers (each needs at \
     least 1): raise it to at least {workers} or use fewer workers"
)]
pub struct ShareError {
    pub index: usize,
    pub what: &'static str,
    pub total: u64,
    pub workers: usize,
}

/// Worker `index`'s part of `total`.
pub fn count_share(total: u64, workers: usize, index: usize) -> u64 {
    let n = workers as u64;
    total / n + u64::from((index as u64) < total % n)
}

/// Worker `index`'s scenario: every stage's load divided by `workers`.
/// A stage keeps the fleet's label as its name, so that every label a
/// worker prints or records (stage lines, skip and stop reasons) names the
/// fleet's stage (`#2 c=16`), not the worker's share of it (`#2 c=6`).
pub fn scenario_share(
    scenario: &Scenario,
    workers: usize,
    index: usize,
) -> Result<Scenario, ShareError> {
    let mut share = scenario.clone();
    for (step_index, step) in share.steps.iter_mut().enumerate() {
        let Step::Stage(stage) = step else { continue };
        stage.name = Some(stage.label(step_index));
        // A count of 0 means "unlimited"/"unused": it stays 0 everywhere;
        // a positive count must leave each worker at least 1.
        let divide = |what: &'static str, total: u64| -> Result<u64, ShareError> {
            if total == 0 {
                return Ok(0);
            }
            if total < workers as u64 {
                return Err(ShareError {
                    index: step_index,
                    what,
                    total,
                    workers,
                });
            }
            Ok(count_share(total, workers, index))
        };
        if let Some(c) = stage.concurrency {
            stage.concurrency = Some(divide("concurrency", u64::from(c))? as u32);
        }
        stage.max_inflight = divide("max_inflight", u64::from(stage.max_inflight))? as u32;
        stage.conversation_pool_size = divide(
            "conversation_pool_size",
            u64::from(stage.conversation_pool_size),
        )? as u32;
        stage.max_requests = divide("max_requests", stage.max_requests)?;
        if let Some(rate) = stage.rate {
            stage.rate = Some(rate / workers as f64);
        }
    }
    Ok(share)
}

/// Worker `me`'s share of a capacity-search stage shaped like `like` at the
/// fleet's `level`, divided between `workers` (`me` among them) like the
/// steps are: a count by position, a rate evenly. `None` when `me` does not
/// take part.
pub fn search_share(like: &Stage, level: f64, workers: &[usize], me: usize) -> Option<Stage> {
    let position = workers.iter().position(|&w| w == me)?;
    let mut stage = like.clone();
    if stage.concurrency.is_some() {
        let streams = count_share(level as u64, workers.len(), position);
        stage.concurrency = Some(u32::try_from(streams).unwrap_or(u32::MAX));
    } else {
        stage.rate = Some(level / workers.len() as f64);
    }
    Some(stage)
}

/// Worker `index`'s seed, derived from the leader's (splitmix64).
pub fn worker_seed(seed: u64, index: usize) -> u64 {
    let mut z = seed.wrapping_add((index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Worker `index`'s part of the eval datasets: a contiguous chunk of the
/// dataset shuffled with the leader's `seed`.
pub fn dataset_share(seed: u64, index: usize, workers: usize) -> nyann_load::DatasetShare {
    nyann_load::DatasetShare {
        seed,
        worker: index,
        workers,
    }
}

/// The first request and conversation id of worker `index`.
pub fn first_id(index: usize) -> u64 {
    (index as u64) << ID_BITS
}

/// The level (concurrency, rate) that `workers`' shares of step `index` add up to.
pub fn level_of(
    shares: &[Scenario],
    workers: &[usize],
    index: usize,
) -> (Option<u32>, Option<f64>) {
    let stages = workers
        .iter()
        .filter_map(|&w| match shares.get(w)?.steps.get(index)? {
            Step::Stage(stage) => Some(stage),
            Step::Barrier { .. } => None,
        });
    let mut concurrency = None;
    let mut rate = None;
    for stage in stages {
        if let Some(c) = stage.concurrency {
            concurrency = Some(concurrency.unwrap_or(0) + c);
        }
        if let Some(r) = stage.rate {
            rate = Some(rate.unwrap_or(0.0) + r);
        }
    }
    (concurrency, rate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_model::{Mode, Stage, Workload};

    fn scenario(stage: Stage) -> Scenario {
        Scenario {
            target: None,
            model: None,
            workload: Workload::default(),
            steps: vec![Step::Barrier { drain: false }, Step::Stage(stage)],
        }
    }

    fn stage_of(s: &Scenario) -> &Stage {
        match &s.steps[1] {
            Step::Stage(stage) => stage,
            Step::Barrier { .. } => unreachable!(),
        }
    }

    #[test]
    fn counts_add_up_and_the_first_workers_get_the_remainder() {
        for total in [3u64, 7, 10, 64, 1001] {
            for n in 1..=3usize.min(total as usize) {
                let parts: Vec<u64> = (0..n).map(|i| count_share(total, n, i)).collect();
                assert_eq!(parts.iter().sum::<u64>(), total);
                assert!(parts.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
            }
        }
        assert_eq!(
            (0..3).map(|i| count_share(10, 3, i)).collect::<Vec<_>>(),
            [4, 3, 3]
        );
    }

    #[test]
    fn a_stage_is_divided_and_rates_split_evenly() {
        let closed = scenario(Stage {
            concurrency: Some(10),
            max_requests: 100,
            ..Stage::new(5.0, Mode::Concurrent)
        });
        let parts: Vec<Scenario> = (0..3)
            .map(|i| scenario_share(&closed, 3, i).unwrap())
            .collect();
        let conc: Vec<u32> = parts
            .iter()
            .map(|s| stage_of(s).concurrency.unwrap())
            .collect();
        let max: Vec<u64> = parts.iter().map(|s| stage_of(s).max_requests).collect();
        assert_eq!(conc, [4, 3, 3]);
        assert_eq!(max, [34, 33, 33]);
        for part in &parts {
            assert_eq!(stage_of(part).label(1), "#1 c=10", "the fleet's label");
        }
        assert_eq!(parts[0].steps[0], Step::Barrier { drain: false });

        let open = scenario(Stage {
            rate: Some(30.0),
            max_inflight: 8,
            ..Stage::new(5.0, Mode::Poisson)
        });
        let part = scenario_share(&open, 4, 3).unwrap();
        assert_eq!(stage_of(&part).rate, Some(7.5));
        assert_eq!(stage_of(&part).max_inflight, 2);
        assert_eq!(stage_of(&part).max_requests, 0, "unlimited stays unlimited");
        assert_eq!(stage_of(&part).label(1), "#1 rate=30");
        let named = scenario(Stage {
            name: Some("chat".into()),
            ..stage_of(&closed).clone()
        });
        let part = scenario_share(&named, 3, 0).unwrap();
        assert_eq!(stage_of(&part).label(1), "chat", "a name is kept");
    }

    #[test]
    fn too_little_to_divide_is_refused_with_the_step() {
        let sc = scenario(Stage {
            concurrency: Some(2),
            ..Stage::new(5.0, Mode::Concurrent)
        });
        let err = scenario_share(&sc, 3, 0).unwrap_err().to_string();
        assert!(err.contains("step 1: concurrency 2"), "{err}");
        assert!(err.contains("at least 3"), "{err}");
    }

    #[test]
    fn seeds_and_ids_differ_per_worker_and_repeat_per_seed() {
        let seeds: Vec<u64> = (0..8).map(|i| worker_seed(42, i)).collect();
        let mut unique = seeds.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 8);
        assert_eq!(
            seeds,
            (0..8).map(|i| worker_seed(42, i)).collect::<Vec<_>>()
        );
        assert_ne!(worker_seed(43, 0), seeds[0]);
        assert!(first_id(1) > first_id(0) + (1 << 39));
    }
}
