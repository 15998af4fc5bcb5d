//! Policy host benchmark: how long until the built-in policy is ready (from
//! the precompiled code the binary ships, where it does; compiled; compiled
//! code read back from the cache), how long a custom component takes to
//! load, and the latency of one judge (fresh instance + call), synchronous
//! and through the async path `generate` uses.
//!
//! Run: `cargo bench -p nyann-policy-host --bench policy` (or `cargo test
//! --release -p nyann-policy-host --bench policy`, which reuses the tests'
//! build). `bench/policy-host.sh` runs two builds of it side by side.
//! Targets: judge p50 <= 1 ms, through the async path <= 100 us; host start
//! with the built-in ready <= 50 ms.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nyann_model::observation::{ClientStats, RoleSignals, StageObservation};
use nyann_model::scenario::{Param, StopCondition, Value};
use nyann_policy_host::{HostConfig, Policy, PolicyHost};

fn config(cache_dir: Option<PathBuf>) -> HostConfig {
    HostConfig {
        cache_dir,
        ..HostConfig::default()
    }
}

fn time<R>(f: impl FnOnce() -> R) -> (Duration, R) {
    let start = Instant::now();
    let r = f();
    (start.elapsed(), r)
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// What to load: the built-in as `load_builtin` does (its shipped code
/// where there is one), the built-in as any component, or a file.
#[derive(Clone, Copy)]
enum What<'a> {
    Builtin,
    BuiltinCompiled,
    File(&'a Path),
}

fn load(cache: Option<PathBuf>, what: What) -> Duration {
    time(|| {
        let host = PolicyHost::new(config(cache)).unwrap();
        match what {
            What::Builtin => host.load_builtin().unwrap(),
            What::BuiltinCompiled => host
                .load_bytes(nyann_policy_host::BUILTIN, nyann_policy_host::BUILTIN_WASM)
                .unwrap(),
            What::File(f) => host.load_file(f).unwrap(),
        }
    })
    .0
}

fn stages() -> Vec<StageObservation> {
    (0..8)
        .map(|i| StageObservation {
            index: i,
            name: format!("#{i} c={}", 64 * (i + 1)),
            concurrency: Some(64 * (i + 1)),
            roles: vec![
                RoleSignals {
                    role: "prefill".into(),
                    waiting_requests_p50: f64::from(i) * 5.0,
                    ..Default::default()
                },
                RoleSignals {
                    role: "decode".into(),
                    ttft_p99_seconds: 0.3 * f64::from(i),
                    kv_cache_usage_max: 0.1 * f64::from(i),
                    ..Default::default()
                },
            ],
            client: ClientStats {
                requests_ok: 1000,
                output_tokens_per_second: 1000.0 * f64::from(i + 1),
                ..Default::default()
            },
            ..Default::default()
        })
        .collect()
}

fn judge_latency(policy: &Policy, params: &[Param], n: usize) -> (Duration, Duration) {
    let all = stages();
    let (stage, history) = all.split_last().unwrap();
    for _ in 0..20 {
        policy.judge_blocking(params, stage, history).unwrap();
    }
    let mut xs: Vec<Duration> = (0..n)
        .map(|_| time(|| policy.judge_blocking(params, stage, history).unwrap()).0)
        .collect();
    xs.sort();
    (percentile(&xs, 0.5), percentile(&xs, 0.99))
}

fn judge_latency_async(policy: &Policy, params: &[Param], n: usize) -> (Duration, Duration) {
    // As the binary's runtime (the judge's wall-clock limit needs the time
    // driver).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let all = stages();
    let (stage, history) = all.split_last().unwrap();
    rt.block_on(async {
        for _ in 0..20 {
            policy.judge(params, stage, history).await.unwrap();
        }
        let mut xs = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            policy.judge(params, stage, history).await.unwrap();
            xs.push(start.elapsed());
        }
        xs.sort();
        (percentile(&xs, 0.5), percentile(&xs, 0.99))
    })
}

fn main() {
    // `languages FILE...`: the client-slo policy in several languages
    // (`bench/policy-languages.sh`).
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(files) = args
        .iter()
        .position(|a| a == "languages")
        .map(|i| &args[i + 1..])
    {
        languages(files);
        return;
    }
    // `budgets`: how long a judge that never ends takes to use up its
    // fuel, by what it loops on (what the default --policy-timeout must
    // stay above).
    if args.iter().any(|a| a == "budgets") {
        budgets();
        return;
    }
    // `judge`: the judge latencies only (for profiling, and for
    // `bench/policy-host.sh`, which compares builds).
    let judge_only = std::env::args().skip(1).any(|a| a == "judge");
    let tmp = tempfile::Builder::new()
        .prefix("nyann-policy-bench-")
        .tempdir()
        .unwrap();
    let cache = tmp.path().to_path_buf();

    // The custom component: the client-slo example, built like the tests do.
    let custom =
        nyann_guests::repository_guest("client-slo-policy").unwrap_or_else(|e| panic!("{e}"));

    println!(
        "policy host benchmark (builtin component: {} bytes)",
        nyann_policy_host::BUILTIN_WASM.len()
    );
    if !judge_only {
        loads(&cache, &custom);
    }
    judges(&cache, &custom, judge_only);
}

fn loads(cache: &Path, custom: &Path) {
    let cache = cache.to_path_buf();
    let shipped = median((0..10).map(|_| load(None, What::Builtin)).collect());
    let cold = median((0..3).map(|_| load(None, What::BuiltinCompiled)).collect());
    let _ = load(Some(cache.clone()), What::BuiltinCompiled); // fills the cache
    let cached = median(
        (0..10)
            .map(|_| load(Some(cache.clone()), What::BuiltinCompiled))
            .collect(),
    );
    println!(
        "host start + built-in ready, empty cache:      {}  (target <= 50 ms; code {:?})",
        ms(shipped),
        PolicyHost::new(config(None))
            .unwrap()
            .load_builtin()
            .unwrap()
            .code_source()
    );
    println!(
        "host start + built-in ready, compiled:         {}",
        ms(cold)
    );
    println!(
        "host start + built-in ready, cached:           {}  ({:.0}x faster than compiled)",
        ms(cached),
        cold.as_secs_f64() / cached.as_secs_f64()
    );

    let custom_cold = median((0..3).map(|_| load(None, What::File(custom))).collect());
    let _ = load(Some(cache.clone()), What::File(custom));
    let custom_cached = median(
        (0..10)
            .map(|_| load(Some(cache.clone()), What::File(custom)))
            .collect(),
    );
    println!(
        "custom component load ({} bytes), cold / cached: {} / {}",
        std::fs::metadata(custom).map(|m| m.len()).unwrap_or(0),
        ms(custom_cold),
        ms(custom_cached)
    );
}

fn judges(cache: &Path, custom: &Path, judge_only: bool) {
    let host = PolicyHost::new(config(Some(cache.to_path_buf()))).unwrap();
    let builtin = host.load_builtin().unwrap();
    let params = builtin
        .check_params(&StopCondition {
            params: vec![
                Param {
                    name: "waiting_requests_p50".into(),
                    value: Value::Number(32.0),
                },
                Param {
                    name: "ttft_p99".into(),
                    value: Value::Text("2s".into()),
                },
            ],
            location: None,
            param_locations: Vec::new(),
            search: None,
        })
        .unwrap();
    let (p50, p99) = judge_latency(&builtin, &params, 2000);
    println!(
        "judge (worker thread + fresh instance + call), builtin, sync: p50 {}  p99 {}  (target p50 <= 1 ms)",
        ms(p50),
        ms(p99)
    );
    let (p50, p99) = judge_latency_async(&builtin, &params, 2000);
    println!(
        "judge through Policy::judge, builtin, async:   p50 {}  p99 {}  (target p50 <= 100 us)",
        ms(p50),
        ms(p99)
    );

    if judge_only {
        return;
    }
    let slo = host.load_file(custom).unwrap();
    let slo_params = slo
        .check_params(&StopCondition {
            params: vec![Param {
                name: "ttft_p99".into(),
                value: Value::Text("2s".into()),
            }],
            location: None,
            param_locations: Vec::new(),
            search: None,
        })
        .unwrap();
    let (p50, p99) = judge_latency(&slo, &slo_params, 2000);
    println!(
        "judge (fresh instance + call), client-slo:     p50 {}  p99 {}",
        ms(p50),
        ms(p99)
    );
}

/// For each client-slo component (`NAME=FILE`): its size, its first load
/// (compiled, into an empty code cache), a cached load (median of 5), the
/// judge latency (p50 and p99 of 300, synchronous) and that of a call doing
/// next to nothing (validate), side by side.
fn languages(files: &[String]) {
    println!(
        "{:<22} {:>9} {:>11} {:>12} {:>11} {:>11} {:>13}",
        "client-slo in",
        "size",
        "first load",
        "cached load",
        "judge p50",
        "judge p99",
        "validate p50"
    );
    for arg in files {
        let (name, file) = arg.split_once('=').unwrap_or((arg, arg));
        let file = Path::new(file);
        // NYANN_POLICY_BENCH_CACHE: a code cache kept between runs (the
        // first load then reads it), to compare judge latencies quickly.
        let cache = tempfile::tempdir().unwrap();
        let dir = Some(
            std::env::var_os("NYANN_POLICY_BENCH_CACHE")
                .map_or_else(|| cache.path().to_path_buf(), PathBuf::from),
        );
        let first = load(dir.clone(), What::File(file));
        let cached = median(
            (0..5)
                .map(|_| load(dir.clone(), What::File(file)))
                .collect(),
        );
        let host = PolicyHost::new(config(dir)).unwrap();
        let policy = host.load_file(file).unwrap();
        let params = policy
            .check_params(&StopCondition {
                params: vec![Param {
                    name: "ttft_p99".into(),
                    value: Value::Text("2s".into()),
                }],
                location: None,
                param_locations: Vec::new(),
                search: None,
            })
            .unwrap();
        let (p50, p99) = judge_latency(&policy, &params, 300);
        // A call that does next to nothing (validate, 100 times): what a
        // fresh instance costs, apart from the judgment's own work.
        let stop = StopCondition {
            params: vec![Param {
                name: "ttft_p99".into(),
                value: Value::Text("2s".into()),
            }],
            location: None,
            param_locations: Vec::new(),
            search: None,
        };
        let mut calls: Vec<Duration> = (0..100)
            .map(|_| time(|| policy.check_params(&stop).unwrap()).0)
            .collect();
        calls.sort();
        println!(
            "{name:<22} {:>5.1} MiB {:>9.2} s {:>9.3} s {:>11} {:>11} {:>13}",
            std::fs::metadata(file).map(|m| m.len()).unwrap_or(0) as f64 / f64::from(1 << 20),
            first.as_secs_f64(),
            cached.as_secs_f64(),
            ms(p50),
            ms(p99),
            ms(percentile(&calls, 0.5))
        );
    }
}

/// A judge looping on its own instructions, on the host's `log` and on
/// the clock, with the default fuel and no wall-clock limit in reach: how
/// long until its budgets (fuel, the log's call count) stop it (a few runs each: the spread is the
/// machine's).
fn budgets() {
    let fuel = HostConfig::default().judge_fuel;
    let host = PolicyHost::new(HostConfig {
        call_timeout: Duration::from_secs(600),
        ..config(None)
    })
    .unwrap();
    let hostile = nyann_guests::test_guest("hostile-policy").unwrap_or_else(|e| panic!("{e}"));
    let policy = host.load_file(&hostile).unwrap();
    println!("a judge that never ends, stopped by {fuel} fuel (no wall-clock limit in reach)");
    println!(
        "{:<12} {:>10} {:>10} {:>10}",
        "loops on", "min", "median", "max"
    );
    for mode in ["loop", "log-loop", "clock-loop"] {
        let params = policy
            .check_params(&StopCondition {
                params: vec![Param {
                    name: "mode".into(),
                    value: Value::Text(mode.into()),
                }],
                location: None,
                param_locations: Vec::new(),
                search: None,
            })
            .unwrap();
        let mut stopped_by = "";
        let mut runs: Vec<Duration> = (0..5)
            .map(|_| {
                let (took, result) = time(|| policy.judge_blocking(&params, &stages()[0], &[]));
                let err = result.expect_err("a judge that never ends");
                stopped_by = err.failure().map_or("?", |f| f.kind());
                took
            })
            .collect();
        runs.sort();
        println!(
            "{mode:<12} {:>10} {:>10} {:>10}  stopped by: {stopped_by}",
            ms(runs[0]),
            ms(runs[runs.len() / 2]),
            ms(runs[runs.len() - 1])
        );
    }
}
