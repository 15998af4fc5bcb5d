//! Before any request: does the scenario fit this host? A request in flight
//! holds one connection (one open file) and about [`STREAM_BYTES`] of
//! memory, so the scenario's peak number of requests in flight is checked
//! against the open-file limit and the memory available, and refused with
//! the numbers and the fixes rather than run into `EMFILE` storms or the
//! OOM killer.
//!
//! The peak of a stage: its concurrency (closed loop), its `max_inflight`
//! (open loop), else an estimate for an open loop: rate × (1 s + 30 ms per
//! output token), a slow server's latency.

use nyann_model::{Mode, Scenario, Step};

/// Memory per request in flight: its task, connection (socket and 4 KiB
/// read buffer), request and record. Measured with `bench/load.sh` (isl and
/// osl 32): peak RSS 16 MiB at c=64 and 50 MiB at c=4096, ~9 KiB per added
/// stream, 12.6 KiB per stream all included; rounded up for longer prompts.
pub const STREAM_BYTES: u64 = 16 * 1024;
/// Open files the client keeps for itself besides connections (standard
/// streams, the runtime, `requests.jsonl`, metrics and scrape clients).
pub const RESERVED_FILES: u64 = 64;
/// Memory the client needs whatever the load (runtime, buffers, histograms).
const BASE_BYTES: u64 = 64 << 20;
/// Open-loop latency estimate: first token, then per output token.
const EXPECTED_FIRST_TOKEN_S: f64 = 1.0;
const EXPECTED_PER_TOKEN_S: f64 = 0.03;

/// The stage with the most requests in flight, and how many.
#[derive(Debug, Clone, PartialEq)]
pub struct Peak {
    pub connections: u64,
    /// `stage #3 c=4096`.
    pub stage: String,
    /// How the number was found, when it is an estimate.
    pub estimate: Option<String>,
}

/// The scenario's largest number of requests in flight at once.
pub fn peak(scenario: &Scenario) -> Option<Peak> {
    let mut best: Option<Peak> = None;
    for (index, step) in scenario.steps.iter().enumerate() {
        let Step::Stage(stage) = step else { continue };
        let (connections, estimate) = match stage.mode {
            Mode::Concurrent | Mode::ConversationPool => {
                (u64::from(stage.concurrency.unwrap_or(1)), None)
            }
            Mode::Constant | Mode::Poisson if stage.max_inflight > 0 => {
                (u64::from(stage.max_inflight), None)
            }
            Mode::Constant | Mode::Poisson => {
                let rate = stage.rate.unwrap_or(0.0);
                let osl = stage.workload.as_ref().unwrap_or(&scenario.workload).osl;
                let latency = EXPECTED_FIRST_TOKEN_S + EXPECTED_PER_TOKEN_S * f64::from(osl);
                let estimate = format!(
                    "estimated: {rate}/s x {latency:.1} s (1 s + 30 ms x {osl} output tokens); \
                     max_inflight= caps it"
                );
                ((rate * latency).ceil() as u64, Some(estimate))
            }
        };
        if best.as_ref().is_none_or(|b| connections > b.connections) {
            best = Some(Peak {
                connections,
                stage: format!("stage {}", stage.label(index)),
                estimate,
            });
        }
    }
    best
}

/// What this process may use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// The soft open-file limit, and the hard one.
    pub open_files: Option<(u64, u64)>,
    /// Bytes of memory available, and what limits them (for the message).
    pub memory: Option<(u64, &'static str)>,
}

impl Limits {
    /// The limits of this process now (call after raising the open-file
    /// limit to its hard maximum).
    pub fn of_this_process() -> Limits {
        Limits {
            open_files: rlimit::getrlimit(rlimit::Resource::NOFILE).ok(),
            memory: available_memory(),
        }
    }
}

/// Refuses a peak that does not fit `limits`, saying what to do.
pub fn check(peak: &Peak, limits: &Limits) -> Result<(), String> {
    let Peak {
        connections,
        stage,
        estimate,
    } = peak;
    let needs = match estimate {
        Some(how) => format!("{stage} needs about {connections} connections ({how})"),
        None => format!("{stage} needs up to {connections} connections"),
    };
    if let Some((soft, hard)) = limits.open_files
        && connections.saturating_add(RESERVED_FILES) > soft
    {
        let wanted = connections.saturating_add(RESERVED_FILES);
        let raise = if wanted <= hard {
            format!("`ulimit -n {wanted}` in the shell that starts nyann-bench")
        } else {
            format!(
                "`ulimit -n {wanted}` after raising the hard limit ({hard}) as root or in \
                 /etc/security/limits.conf"
            )
        };
        return Err(format!(
            "{needs}, one open file each, but the open-file limit is {soft} \
             ({RESERVED_FILES} of them kept for the client's own files): raise it ({raise}), \
             lower the concurrency, or split the load over several nyann-bench processes \
             (workers)"
        ));
    }
    if let Some((available, source)) = limits.memory {
        let wanted = connections
            .saturating_mul(STREAM_BYTES)
            .saturating_add(BASE_BYTES);
        if wanted > available {
            return Err(format!(
                "{needs}, about {} of memory at {} KiB each, but only {} are available \
                 ({source}): lower the concurrency, or split the load over several \
                 nyann-bench processes (workers) on hosts with more memory",
                mib(wanted),
                STREAM_BYTES / 1024,
                mib(available),
            ));
        }
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// The memory this process may still take: the least of the system's
/// available memory, its cgroup's room and its address-space limit.
fn available_memory() -> Option<(u64, &'static str)> {
    let mut known: Vec<(u64, &'static str)> = Vec::new();
    if let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo")
        && let Some(kib) = field_kib(&meminfo, "MemAvailable:")
    {
        known.push((kib << 10, "MemAvailable in /proc/meminfo"));
    }
    if let Some(room) = cgroup_room() {
        known.push((room, "the cgroup's memory.max"));
    }
    if let Ok((soft, _)) = rlimit::getrlimit(rlimit::Resource::AS)
        && soft != rlimit::INFINITY
    {
        let used = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| field_kib(&status, "VmSize:"))
            .unwrap_or(0)
            << 10;
        known.push((
            soft.saturating_sub(used),
            "the address-space limit, ulimit -v",
        ));
    }
    known.into_iter().min_by_key(|(bytes, _)| *bytes)
}

/// `memory.max - memory.current` of this process's cgroup (v2), if limited.
fn cgroup_room() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let max: u64 = read("memory.max")?.trim().parse().ok()?; // "max": no limit
    let current: u64 = read("memory.current")?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// The number of a `Name:   123 kB` line.
fn field_kib(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use nyann_model::{Stage, Workload};

    use super::*;

    fn scenario(stages: Vec<Stage>) -> Scenario {
        Scenario {
            target: None,
            model: None,
            workload: Workload {
                osl: 100,
                ..Workload::default()
            },
            steps: stages.into_iter().map(Step::Stage).collect(),
        }
    }

    fn closed(c: u32) -> Stage {
        Stage {
            concurrency: Some(c),
            ..Stage::new(10.0, Mode::Concurrent)
        }
    }

    fn open(rate: f64, max_inflight: u32) -> Stage {
        Stage {
            rate: Some(rate),
            max_inflight,
            ..Stage::new(10.0, Mode::Poisson)
        }
    }

    #[test]
    fn the_peak_is_the_largest_stage() {
        let p = peak(&scenario(vec![closed(64), closed(4096), closed(8)])).unwrap();
        assert_eq!((p.connections, p.stage.as_str()), (4096, "stage #1 c=4096"));
        assert_eq!(p.estimate, None);
        let p = peak(&scenario(vec![closed(64), open(1000.0, 300)])).unwrap();
        assert_eq!(p.connections, 300);
        // 50/s x (1 s + 100 x 30 ms) = 200.
        let p = peak(&scenario(vec![closed(64), open(50.0, 0)])).unwrap();
        assert_eq!(p.connections, 200);
        assert!(p.estimate.unwrap().contains("max_inflight"));
    }

    #[test]
    fn refusals_give_the_numbers_and_the_fixes() {
        let peak = Peak {
            connections: 1000,
            stage: "stage #0 c=1000".into(),
            estimate: None,
        };
        let roomy = Limits {
            open_files: Some((4096, 4096)),
            memory: Some((1 << 30, "MemAvailable in /proc/meminfo")),
        };
        assert_eq!(check(&peak, &roomy), Ok(()));

        let few_files = Limits {
            open_files: Some((256, 256)),
            ..roomy.clone()
        };
        let err = check(&peak, &few_files).unwrap_err();
        for needle in [
            "stage #0 c=1000 needs up to 1000 connections",
            "open-file limit is 256",
            "raising the hard limit (256)",
            "ulimit -n 1064",
            "several nyann-bench processes",
        ] {
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
        let soft_only = Limits {
            open_files: Some((256, 65536)),
            ..roomy.clone()
        };
        let err = check(&peak, &soft_only).unwrap_err();
        assert!(err.contains("(`ulimit -n 1064` in the shell"), "{err}");

        let little_memory = Limits {
            memory: Some((70 << 20, "the address-space limit, ulimit -v")),
            ..roomy
        };
        let err = check(&peak, &little_memory).unwrap_err();
        assert!(
            err.contains("about 79 MiB of memory at 16 KiB each")
                && err.contains("only 70 MiB are available (the address-space limit, ulimit -v)"),
            "{err}"
        );
    }
}
