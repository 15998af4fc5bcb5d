//! Hostile components: each is contained, reported as
//! `policy <name>: <what happened> at stage <n>` (or refused at load with a
//! message naming the problem), and the host keeps working afterwards.

use std::time::{Duration, Instant};

use nyann_guests::assembled::Assembled;
use nyann_model::observation::{RoleSignals, StageObservation};
use nyann_model::scenario::{Param, StopCondition, Value};
use nyann_policy_host::{CallFailure, HostConfig, Interface, PolicyError, PolicyHost};

use crate::common;

fn mode(m: &str) -> Vec<Param> {
    vec![Param {
        name: "mode".into(),
        value: Value::Text(m.into()),
    }]
}

fn stage(index: u32) -> StageObservation {
    StageObservation {
        index,
        name: format!("#{index}"),
        ..Default::default()
    }
}

/// The built-in and the hostile policy in its harmless mode still answer.
async fn assert_host_healthy() {
    let builtin = common::builtin();
    let params = builtin
        .check_params(&StopCondition {
            params: vec![
                Param {
                    name: "waiting_requests_p50".into(),
                    value: Value::Number(1.0),
                },
                Param {
                    name: "ttft_p99".into(),
                    value: Value::Text("1s".into()),
                },
            ],
            location: None,
            param_locations: Vec::new(),
            search: None,
        })
        .unwrap();
    let busy = StageObservation {
        roles: vec![RoleSignals {
            role: "aggregate".into(),
            waiting_requests_p50: 5.0,
            ttft_p99_seconds: 3.0,
            ..Default::default()
        }],
        ..stage(9)
    };
    assert!(builtin.judge(&params, &busy, &[]).await.unwrap().congested);
    let hostile = common::guest("hostile-policy");
    let verdict = hostile.judge(&mode("ok"), &stage(9), &[]).await.unwrap();
    assert_eq!(verdict.reasons, vec!["hostile says congested"]);
}

async fn judge_err(m: &str, index: u32) -> PolicyError {
    let hostile = common::guest("hostile-policy");
    hostile
        .judge(&mode(m), &stage(index), &[])
        .await
        .unwrap_err()
}

#[tokio::test]
async fn infinite_loop_runs_out_of_fuel() {
    let err = judge_err("loop", 7).await;
    assert_eq!(err.failure(), Some(&CallFailure::Fuel(500_000_000)));
    assert_eq!(
        err.to_string(),
        "policy hostile: used up its fuel budget of 500,000,000 instructions and was stopped at stage 7"
    );
    assert_host_healthy().await;
}

/// The wall-clock backstop still stops guest code when the fuel would last
/// (here: practically forever), and says how long the call really ran.
#[tokio::test]
async fn wall_clock_backstop_stops_a_call_fuel_cannot() {
    let host = common::host_with(HostConfig {
        judge_fuel: u64::MAX / 4,
        call_timeout: Duration::from_millis(200),
        ..HostConfig::default()
    });
    let hostile = host
        .load_file(&common::guest_wasm("hostile-policy"))
        .unwrap();
    let start = Instant::now();
    let err = hostile
        .judge(&mode("loop"), &stage(3), &[])
        .await
        .unwrap_err();
    let elapsed = start.elapsed();
    let Some(CallFailure::Deadline {
        limit,
        elapsed: recorded,
    }) = err.failure()
    else {
        panic!("{err:?}");
    };
    assert_eq!(*limit, Duration::from_millis(200));
    // Never before the limit (the deadline is armed one tick late); the
    // upper bound only guards against "never stopped".
    assert!(*recorded >= Duration::from_millis(200), "{recorded:?}");
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(
            "policy hostile: ran past its 200 ms wall-clock limit and was stopped after "
        ),
        "{text}"
    );
}

/// A sleeping policy used to block inside the host, out of the deadline's
/// reach: 10 s per check (reported as a 100 ms overrun). The clock is
/// virtual now and waiting traps at once.
#[tokio::test]
async fn sleeping_is_refused_at_once() {
    let start = Instant::now();
    let err = judge_err("sleep", 1).await;
    assert_eq!(
        err.failure(),
        Some(&CallFailure::Blocked(Duration::from_secs(10)))
    );
    assert_eq!(
        err.to_string(),
        "policy hostile: tried to wait 10 s (a sleep or a clock subscription) and was stopped: \
         policies run on a virtual clock and may not block at stage 1"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn clocks_read_the_stage_timeline() {
    let hostile = common::guest("hostile-policy");
    let observed = StageObservation {
        start_unix_seconds: 1_700_000_000.0,
        end_unix_seconds: 1_700_000_090.5,
        ..stage(2)
    };
    let verdict = hostile.judge(&mode("clock"), &observed, &[]).await.unwrap();
    // The wall clock is the stage's end; the monotonic clock does not move.
    assert_eq!(verdict.reasons, ["wall 1700000090.5 monotonic-elapsed 0"]);
}

#[tokio::test]
async fn randomness_is_seeded_by_the_stage() {
    let hostile = common::guest("hostile-policy");
    let random = |index| {
        let hostile = hostile.clone();
        async move {
            hostile
                .judge(&mode("random"), &stage(index), &[])
                .await
                .unwrap()
                .reasons
        }
    };
    assert_eq!(random(4).await, random(4).await);
    assert_ne!(random(4).await, random(5).await);
}

#[tokio::test]
async fn deep_recursion_reports_a_stack_overflow() {
    let err = judge_err("recurse", 3).await;
    assert_eq!(
        err.to_string(),
        "policy hostile: crashed (stack overflow: recursion too deep) at stage 3"
    );
    assert_host_healthy().await;
}

/// The cap covers every memory of the instance together: three memories of
/// 40 MiB each used to pass a 64 MiB cap (one per memory), and 32 of them
/// reached 2 GB.
#[tokio::test]
async fn the_memory_cap_covers_all_memories_together() {
    let err = judge_assembled(
        Assembled {
            extra_memories: 2,
            judge_grows_pages: 40 * 16,
            ..Assembled::default()
        },
        6,
    )
    .await
    .unwrap_err();
    assert_eq!(err.failure(), Some(&CallFailure::MemoryCap(64 << 20)));
    assert_eq!(
        err.to_string(),
        "policy assembled: hit its memory cap of 64 MiB and was stopped at stage 6"
    );
    // Growing within the cap is fine.
    let small = Assembled {
        extra_memories: 2,
        judge_grows_pages: 16,
        ..Assembled::default()
    };
    assert!(!judge_assembled(small, 6).await.unwrap().congested);
}

/// Load the assembled 0.2 component `spec` describes and judge stage `index`.
async fn judge_assembled(
    spec: Assembled,
    index: u32,
) -> Result<nyann_model::observation::Verdict, PolicyError> {
    let component = common::assembled("0.2", &spec, str::to_string);
    let policy = common::host()
        .load_bytes("assembled.wasm", &component)
        .unwrap();
    policy.judge(&[], &stage(index), &[]).await
}

/// Table elements count against the same cap as memory: 40 MiB of memory
/// and 32 MiB of table pass one by one, not together.
#[tokio::test]
async fn tables_and_memories_share_the_cap() {
    let judge = |spec| judge_assembled(spec, 8);
    let memory = Assembled {
        extra_memories: 1,
        judge_grows_pages: 40 * 16,
        ..Assembled::default()
    };
    let table = Assembled {
        judge_grows_table: 4 << 20,
        ..Assembled::default()
    };
    assert!(!judge(memory.clone()).await.unwrap().congested);
    assert!(!judge(table.clone()).await.unwrap().congested);
    let both = Assembled {
        judge_grows_table: table.judge_grows_table,
        ..memory
    };
    let err = judge(both).await.unwrap_err();
    assert_eq!(
        err.failure(),
        Some(&CallFailure::MemoryCap(64 << 20)),
        "{err}"
    );
    // A table alone past the cap (128 MiB of elements).
    let err = judge(Assembled {
        judge_grows_table: 16 << 20,
        ..Assembled::default()
    })
    .await
    .unwrap_err();
    assert_eq!(
        err.failure(),
        Some(&CallFailure::MemoryCap(64 << 20)),
        "{err}"
    );
}

/// A table that starts larger than the memory cap is refused at load
/// naming the cap (the instance pool, sized by that cap, would otherwise
/// refuse it as "not a valid component").
#[test]
fn a_table_that_starts_over_the_cap_is_refused_naming_it() {
    let spec = Assembled {
        initial_table: 16 << 20,
        ..Assembled::default()
    };
    let err = load_err(&common::assembled("0.2", &spec, str::to_string));
    assert_eq!(
        err,
        "cannot load policy test.wasm: declares linear memories and tables that start at \
         128.1 MiB together, over its memory cap of 64 MiB (for all its memories and tables)"
    );
    // Under the cap it loads.
    let spec = Assembled {
        initial_table: 1 << 20,
        ..Assembled::default()
    };
    common::host()
        .load_bytes(
            "table.wasm",
            &common::assembled("0.2", &spec, str::to_string),
        )
        .unwrap();
}

#[test]
fn many_memories_are_refused_at_load() {
    let spec = Assembled {
        extra_memories: 31,
        judge_grows_pages: 1000,
        ..Assembled::default()
    };
    let err = load_err(&common::assembled("0.2", &spec, str::to_string));
    assert_eq!(
        err,
        "cannot load policy test.wasm: defines 32 linear memories; policies may define at most 4 \
         (a policy built by a Rust, JavaScript or Python toolchain has one)"
    );
}

/// Loading is bounded before anything is compiled: the size (a 116 MB
/// component took 90 s and 1.3 GB to load), then the imports (a component
/// importing sockets was compiled and cached before being refused).
#[test]
fn oversized_files_are_refused_before_they_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.wasm");
    let file = std::fs::File::create(&path).unwrap();
    // Sparse: 200 MB that are never written nor read.
    file.set_len(200_000_000).unwrap();
    let start = Instant::now();
    let err = common::host().load_file(&path).unwrap_err();
    assert!(matches!(err, PolicyError::TooLarge { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot load policy {}: it is 190.7 MiB, over the 64 MiB limit for policy components",
            path.display()
        )
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    let small = common::host_with(HostConfig {
        max_component_bytes: 1000,
        ..HostConfig::default()
    });
    let err = small
        .load_bytes("builtin", nyann_policy_host::BUILTIN_WASM)
        .unwrap_err();
    assert!(matches!(err, PolicyError::TooLarge { .. }), "{err:?}");
}

#[test]
fn forbidden_imports_are_refused_before_compiling_or_caching() {
    let dir = tempfile::tempdir().unwrap();
    let host = nyann_policy_host::PolicyHost::new(HostConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..HostConfig::default()
    })
    .unwrap();
    let err = host
        .load_bytes(
            "net.wasm",
            &wat_component(
                Some("wasi:http/incoming-handler@0.2.3"),
                "nyann:policy/policy@0.2.0",
            ),
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("imports `wasi:http/incoming-handler@0.2.3`"),
        "{err}"
    );
    let cached: Vec<_> = std::fs::read_dir(dir.path())
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(cached.is_empty(), "nothing compiled nor cached: {cached:?}");
}

#[test]
fn compiling_is_bounded_in_time() {
    let host = common::host_with(HostConfig {
        compile_timeout: Duration::from_millis(1),
        ..HostConfig::default()
    });
    // 4 MiB of code: far more than a millisecond of compiling.
    let spec = Assembled {
        filler_bytes: 4 << 20,
        ..Assembled::default()
    };
    let err = host
        .load_bytes("big.wasm", &common::assembled("0.2", &spec, str::to_string))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot load policy big.wasm: compiling it took longer than 0.001 s; a policy this large \
         is not supported"
    );
}

/// Compiling costs time and memory per function and per byte of code (a
/// component of 900,000 empty functions took 2 minutes and 4 GB before the
/// timeout refused it): both are counted from the binary and a component
/// beyond the limits is refused before anything is compiled.
#[test]
fn code_beyond_the_limits_is_refused_before_compiling() {
    let host = common::host();
    let many = Assembled {
        empty_functions: 60_000,
        ..Assembled::default()
    };
    let err = host
        .load_bytes(
            "many.wasm",
            &common::assembled("0.2", &many, str::to_string),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot load policy many.wasm: defines 60004 functions; policies may define at most \
         30000 (compiling costs time and memory per function; a Rust policy has a few hundred, \
         a Python one about 13,000)"
    );
    let big = Assembled {
        filler_bytes: 17 << 20,
        ..Assembled::default()
    };
    let err = host
        .load_bytes("big.wasm", &common::assembled("0.2", &big, str::to_string))
        .unwrap_err();
    let err = err.to_string();
    assert!(
        err.starts_with("cannot load policy big.wasm: has ")
            && err.contains(" MiB of code; policies may have at most 16 MiB"),
        "{err}"
    );
    // Two straight-line functions of over 2 MiB: within the functions and the
    // bytes, but compiling one function costs more than in proportion to
    // its size (two of 7 MB took 18 s and 874 MB).
    let long = Assembled {
        filler_bytes: 4 << 20,
        filler_function_bytes: 2 << 20,
        ..Assembled::default()
    };
    let err = host
        .load_bytes(
            "long.wasm",
            &common::assembled("0.2", &long, str::to_string),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("cannot load policy long.wasm: has a function of ")
            && err.contains(" MiB of code; a policy's functions may have at most 1 MiB each"),
        "{err}"
    );
    // Within the limits, many functions load.
    let fine = Assembled {
        empty_functions: 1_000,
        ..Assembled::default()
    };
    host.load_bytes(
        "fine.wasm",
        &common::assembled("0.2", &fine, str::to_string),
    )
    .unwrap();
}

/// A component built for a pre-release of the interface is named as such
/// (wasmtime matches none of them), and one built for a newer patch that
/// imports a host function this host lacks says a newer nyann-bench is
/// needed (rather than a raw linker error).
#[test]
fn versions_this_host_cannot_run_are_named() {
    let host = common::host();
    let spec = Assembled::default();
    let prerelease = nyann_guests::assembled::component(
        &Interface::V0_2.wit().replace(
            "package nyann:policy@0.2.0;",
            "package nyann:policy@0.2.1-rc.1;",
        ),
        "0.2.1-rc.1",
        &spec,
    )
    .unwrap();
    let err = host
        .load_bytes("rc.wasm", &prerelease)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "cannot load policy rc.wasm: is built for nyann:policy@0.2.1-rc.1, a pre-release of the \
         interface; this host runs the released nyann:policy@0.1.x, nyann:policy@0.2.x, \
         nyann:policy@0.3.x, nyann:policy@0.4.x, nyann:policy@0.5.x (rebuild the policy against a \
         released WIT, e.g. the one `nyann-bench policy wit` prints)"
    );
    let newer_wit = Interface::V0_2
        .wit()
        .replace("package nyann:policy@0.2.0;", "package nyann:policy@0.2.1;")
        .replace("log: func(", "probe: func();\n    log: func(");
    let newer = nyann_guests::assembled::component(
        &newer_wit,
        "0.2.1",
        &Assembled {
            host_import: Some("probe".into()),
            ..Assembled::default()
        },
    )
    .unwrap();
    let err = host
        .load_bytes("newer.wasm", &newer)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "cannot load policy newer.wasm: imports `probe` from `nyann:policy/host@0.2.1`, which \
         this host's nyann:policy@0.2.0 does not have; it is built for nyann:policy@0.2.1, a \
         newer version of the line: a newer nyann-bench is needed"
    );
    // The released version of a line that imports a function the line does
    // not have (built against a changed WIT) is told the same way, not with
    // the linker's text.
    let changed = nyann_guests::assembled::component(
        &Interface::V0_5
            .wit()
            .replace("log: func(", "probe: func();\n    log: func("),
        "0.5.0",
        &Assembled {
            host_import: Some("probe".into()),
            ..Assembled::default()
        },
    )
    .unwrap();
    let err = host
        .load_bytes("changed.wasm", &changed)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "cannot load policy changed.wasm: imports `probe` from `nyann:policy/host@0.5.0`, which \
         this host's nyann:policy@0.5.0 does not have; nyann:policy@0.5.0 has no such function: \
         rebuild the policy against the released WIT (the one `nyann-bench policy wit` prints), \
         or use the nyann-bench it was built for"
    );
    // A 0.2.1 component that imports nothing new runs here.
    let compatible = nyann_guests::assembled::component(
        &Interface::V0_2
            .wit()
            .replace("package nyann:policy@0.2.0;", "package nyann:policy@0.2.1;"),
        "0.2.1",
        &spec,
    )
    .unwrap();
    host.load_bytes("compatible.wasm", &compatible).unwrap();
}

/// The describe/validate calls at load get ten times the judge's budget, so
/// a policy that needs more at load than per stage is not refused (a 100 ms
/// wall-clock describe once failed under a cold cargo build).
#[test]
fn calls_at_load_get_a_larger_budget() {
    let host = common::host_with(HostConfig {
        judge_fuel: 10_000_000,
        ..HostConfig::default()
    });
    let hostile = host
        .load_file(&common::guest_wasm("hostile-policy"))
        .unwrap();
    let err = hostile
        .check_params(&StopCondition {
            params: mode("validate-loop"),
            location: None,
            param_locations: Vec::new(),
            search: None,
        })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("validate() used up its fuel budget of 100,000,000 instructions"),
        "{err}"
    );
    let err = judge_with(&hostile, "loop");
    assert_eq!(err.failure(), Some(&CallFailure::Fuel(10_000_000)));
}

fn judge_with(policy: &nyann_policy_host::Policy, m: &str) -> PolicyError {
    policy.judge_blocking(&mode(m), &stage(0), &[]).unwrap_err()
}

/// A component of the right interface version whose types differ from the
/// WIT is refused at load, naming the function, the type and the field.
#[test]
fn a_component_of_another_shape_is_refused_at_load() {
    let spec = Assembled::default();
    let extra_field = common::assembled("0.2", &spec, |wit| {
        wit.replace(
            "        params: list<param-spec>,\n    }",
            "        params: list<param-spec>,\n        license: string,\n    }",
        )
    });
    assert_eq!(
        load_err(&extra_field),
        "cannot load policy test.wasm: its `describe` does not match nyann:policy@0.2: result → \
         record `policy-info`: expected 4 fields (name, version, summary, params), found 5 \
         (name, version, summary, params, license)"
    );
    let missing_count = common::assembled("0.2", &spec, |wit| {
        wit.replace("        requests-late: u64,\n", "")
    });
    let err = load_err(&missing_count);
    assert!(
        err.starts_with(
            "cannot load policy test.wasm: its `judge` does not match nyann:policy@0.2: parameter \
             `stage` → record `stage-observation` field `client` → record `client-stats`: expected \
             13 fields ("
        ),
        "{err}"
    );
    let retyped = common::assembled("0.2", &spec, |wit| {
        wit.replace("        congested: bool,", "        congested: u8,")
    });
    assert!(
        load_err(&retyped).ends_with(
            "its `judge` does not match nyann:policy@0.2: result → result ok → record `verdict` \
             field `congested` → expected bool, found u8"
        ),
        "{}",
        load_err(&retyped)
    );
}

#[tokio::test]
async fn memory_bomb_hits_the_cap() {
    let err = judge_err("grow", 2).await;
    assert_eq!(err.failure(), Some(&CallFailure::MemoryCap(64 << 20)));
    assert_eq!(
        err.to_string(),
        "policy hostile: hit its memory cap of 64 MiB and was stopped at stage 2"
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn panic_message_is_captured() {
    let err = judge_err("panic", 4).await;
    assert!(
        matches!(err.failure(), Some(CallFailure::Crashed { .. })),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with("policy hostile: panicked (panicked at "),
        "{msg}"
    );
    assert!(msg.contains("judge exploded on purpose"), "{msg}");
    assert!(msg.ends_with(" at stage 4"), "{msg}");
    // Rust's hint names a variable of the host's that changes nothing here.
    assert!(!msg.contains("RUST_BACKTRACE"), "{msg}");
    assert_host_healthy().await;
}

#[tokio::test]
async fn ten_megabyte_reason_is_refused() {
    let err = judge_err("huge-reason", 5).await;
    assert_eq!(
        err.to_string(),
        "policy hostile: returned an oversized output (reason 1 is 10485760 bytes; the limit is 1 KiB) at stage 5"
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn too_many_reasons_are_refused() {
    let err = judge_err("many-reasons", 5).await;
    assert_eq!(err.failure().map(CallFailure::kind), Some("output"));
    assert!(
        err.to_string().contains("10000 reasons; the limit is 32"),
        "{err}"
    );
}

#[tokio::test]
async fn fired_rules_are_bounded_like_reasons() {
    let err = judge_err("many-fired", 5).await;
    assert_eq!(err.failure().map(CallFailure::kind), Some("output"));
    assert!(
        err.to_string()
            .contains("10000 fired rules; the limit is 32"),
        "{err}"
    );
    let err = judge_err("huge-fired-name", 5).await;
    assert!(
        err.to_string()
            .contains("a name in fired rule 1 is 10485760 bytes; the limit is 1 KiB"),
        "{err}"
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn stderr_flood_is_bounded() {
    let err = judge_err("stderr-flood", 6).await;
    assert_eq!(
        err.to_string(),
        "policy hostile: returned an oversized output (wrote more than 64 KiB to stderr) at stage 6"
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn log_flood_is_dropped_not_fatal() {
    let hostile = common::guest("hostile-policy");
    let verdict = hostile
        .judge(&mode("log-flood"), &stage(1), &[])
        .await
        .unwrap();
    assert!(!verdict.congested);
}

/// A loop of log calls: each costs the guest almost no fuel, so it ran for
/// 17 s on the default fuel (and kept every empty line: millions) before
/// the fuel or the wall clock stopped it. Past 10,000 calls it is stopped,
/// and the lines kept stay within the log budget.
#[tokio::test]
async fn a_loop_of_log_calls_is_stopped_promptly() {
    let hostile = common::guest("hostile-policy");
    let (result, output) = hostile
        .judge_with_output(&mode("log-loop"), &stage(1), &[])
        .await;
    let err = result.unwrap_err();
    assert_eq!(
        err.failure(),
        Some(&CallFailure::OversizedOutput(
            "called log more than 10,000 times".into()
        )),
        "{err}"
    );
    let most = HostConfig::default().max_log_bytes / 32;
    assert!(
        !output.log.is_empty() && output.log.len() <= most,
        "{} log lines kept, at most {most} expected",
        output.log.len()
    );
}

#[tokio::test]
async fn err_result_is_reported() {
    let err = judge_err("err", 8).await;
    assert_eq!(
        err.failure(),
        Some(&CallFailure::Rejected("no verdict today".into()))
    );
    assert_eq!(
        err.to_string(),
        "policy hostile: returned an error: no verdict today at stage 8"
    );
}

#[tokio::test]
async fn calling_exit_is_named_not_a_backtrace() {
    let err = judge_err("exit", 3).await;
    assert_eq!(err.failure(), Some(&CallFailure::Exited(0)));
    assert_eq!(
        err.to_string(),
        "policy hostile: called exit (status 0) instead of returning a result: a policy's \
         functions must return (exit ends only the call) at stage 3"
    );
    assert_host_healthy().await;
}

/// Everything a policy says reaches terminals and logs: control characters
/// are escaped (a reason, an error, its description), so it can neither
/// clear the screen nor forge a line of the host's output.
#[tokio::test]
async fn control_characters_in_what_a_policy_says_are_escaped() {
    let hostile = common::guest("hostile-policy");
    let verdict = hostile
        .judge(&mode("escape"), &stage(2), &[])
        .await
        .unwrap();
    assert_eq!(
        verdict.reasons,
        ["\\u{1b}[2J\\rreal reason\\nsweep stopped after stage #0: forged"]
    );
    let err = judge_err("escape-err", 4).await.to_string();
    assert_eq!(
        err,
        "policy hostile: returned an error: \\u{1b}]0;title\\u{7}bad\\nsweep stopped after \
         stage #0: forged at stage 4"
    );
    let info = hostile.info();
    assert_eq!(
        info.summary,
        "Misbehaves as `mode` says.\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\nsweep stopped after stage #0: forged"
    );
    let banner = info.params.iter().find(|p| p.name == "banner").unwrap();
    assert_eq!(banner.doc, "unused\\r\\u{1b}[31mred\\u{1b}[0m");
    let fired = &verdict.fired[0];
    assert_eq!(
        (
            fired.rule.as_str(),
            fired.role.as_deref(),
            &fired.signals[..]
        ),
        (
            "queue\\u{1b}[2J",
            Some("pre\\nfill"),
            &["waiting\\r".to_string()][..]
        )
    );
    for text in verdict
        .reasons
        .iter()
        .chain([&err, &info.summary, &banner.doc, &fired.rule])
    {
        assert!(!text.chars().any(char::is_control), "{text:?}");
    }
}

#[test]
fn printable_escapes_controls_and_bidi_overrides_only() {
    use nyann_policy_host::printable;
    assert_eq!(printable("plain text, é ✓"), "plain text, é ✓");
    assert_eq!(printable("a\tb\u{9b}c\u{202e}d"), "a\\tb\\u{9b}c\\u{202e}d");
    // Escaping twice changes nothing more.
    let once = printable("x\ny\x1b").into_owned();
    assert_eq!(printable(&once), once);
}

#[test]
fn validate_panic_and_loop_become_parameter_errors() {
    let hostile = common::guest("hostile-policy");
    let stop = |m: &str| StopCondition {
        params: mode(m),
        location: None,
        param_locations: Vec::new(),
        search: None,
    };
    let err = hostile.check_params(&stop("validate-panic")).unwrap_err();
    assert!(
        err.to_string().contains("the policy's validate() panicked"),
        "{err}"
    );
    assert!(
        err.to_string().contains("validate exploded on purpose"),
        "{err}"
    );
    let err = hostile.check_params(&stop("validate-loop")).unwrap_err();
    assert!(
        err.to_string()
            .contains("validate() used up its fuel budget of 5,000,000,000 instructions"),
        "{err}"
    );
    let checked = hostile.check_params(&stop("ok")).unwrap();
    assert_eq!(checked[0], mode("ok")[0]);
    // `banner`'s default filled in: 70,000 bytes, more than a format width.
    assert!(
        matches!(&checked[1].value, Value::Text(t) if t.len() == 70_000),
        "{}",
        checked[1].name
    );
}

/// Instances live in reused slots of a pool: a call finds none of the
/// memory the calls before it wrote (statics, heap), on either path.
#[tokio::test]
async fn a_call_starts_from_the_components_image_again() {
    let hostile = common::guest("hostile-policy");
    for i in 0..4u32 {
        let verdict = if i % 2 == 0 {
            hostile.judge(&mode("remember"), &stage(i), &[]).await
        } else {
            hostile.judge_blocking(&mode("remember"), &stage(i), &[])
        };
        assert_eq!(
            verdict.unwrap().reasons,
            [format!("call 1, stages seen [{i}]")]
        );
    }
}

/// More calls at once than the host's instance pool has slots (16): the
/// calls past it wait for a slot, and each ends as its own work says (here:
/// out of fuel), none for want of a slot.
#[tokio::test]
async fn more_calls_at_once_than_slots_each_end_on_their_own() {
    // A tenth of the default fuel: each loop still runs for tens of ms,
    // long after the last of the calls has started.
    let host = PolicyHost::new(HostConfig {
        judge_fuel: 50_000_000,
        cache_dir: None,
        ..HostConfig::default()
    })
    .unwrap();
    let hostile = host
        .load_file(&common::guest_wasm("hostile-policy"))
        .unwrap();
    let calls: Vec<_> = (0..24u32)
        .map(|i| {
            let h = hostile.clone();
            tokio::spawn(async move { h.judge(&mode("loop"), &stage(i), &[]).await })
        })
        .collect();
    for call in calls {
        let err = call.await.unwrap().unwrap_err();
        assert_eq!(err.failure().map(CallFailure::kind), Some("fuel"), "{err}");
    }
}

#[tokio::test]
async fn concurrent_calls_are_independent() {
    let hostile = common::guest("hostile-policy");
    let mut tasks = Vec::new();
    for i in 0..8u32 {
        let h = hostile.clone();
        let m = if i % 2 == 0 { "loop" } else { "ok" };
        tasks.push(tokio::spawn(async move {
            h.judge(&mode(m), &stage(i), &[]).await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        if i % 2 == 0 {
            assert_eq!(
                r.unwrap_err().failure().map(CallFailure::kind),
                Some("fuel")
            );
        } else {
            assert!(r.unwrap().congested);
        }
    }
}

fn load_err(bytes: &[u8]) -> String {
    common::host()
        .load_bytes("test.wasm", bytes)
        .unwrap_err()
        .to_string()
}

/// A component exporting `export` (an instance with one dummy function)
/// and importing `import`, if any.
fn wat_component(import: Option<&str>, export: &str) -> Vec<u8> {
    let import = import
        .map(|i| format!("(import \"{i}\" (instance))"))
        .unwrap_or_default();
    wat::parse_str(format!(
        r#"(component
            {import}
            (core module $m (func (export "f")))
            (core instance $i (instantiate $m))
            (func $f (canon lift (core func $i "f")))
            (instance $p (export "describe" (func $f)))
            (export "{export}" (instance $p)))"#
    ))
    .unwrap()
}

#[tokio::test]
async fn disallowed_import_is_refused_at_load() {
    // A server interface, and the client interfaces of another WASI
    // release: refused, not linked as traps.
    for import in ["wasi:http/incoming-handler@0.2.3", "wasi:sockets/tcp@0.3.0"] {
        let err = load_err(&wat_component(Some(import), "nyann:policy/policy@0.1.0"));
        assert!(
            err.starts_with(&format!(
                "cannot load policy test.wasm: imports `{import}`, which policies may not use"
            )),
            "{err}"
        );
        // Built by no known toolchain: the Rust advice.
        assert!(
            err.ends_with(
                "build it with `cargo build --release --target wasm32-wasip2` and the \
                 nyann-policy SDK (`nyann-bench policy new`), and drop the dependency that \
                 imports it"
            ),
            "{err}"
        );
    }
    let err = load_err(&wat_component(
        Some("acme:net/http@1.0.0"),
        "nyann:policy/policy@0.1.0",
    ));
    assert!(err.contains("imports `acme:net/http@1.0.0`"), "{err}");
    assert_host_healthy().await;
}

#[tokio::test]
async fn other_interface_versions_are_refused_naming_the_supported_ones() {
    for version in ["0.6.0", "1.0.0"] {
        let err = load_err(&wat_component(
            None,
            &format!("nyann:policy/policy@{version}"),
        ));
        assert_eq!(
            err,
            format!(
                "cannot load policy test.wasm: is built for nyann:policy@{version}; this host supports \
                 nyann:policy@0.1.x, nyann:policy@0.2.x, nyann:policy@0.3.x, nyann:policy@0.4.x, \
                 nyann:policy@0.5.x (a newer nyann-bench is needed, or rebuild the policy against the WIT printed by `nyann-bench policy wit`)"
            )
        );
    }
    let err = load_err(&wat_component(None, "acme:other/thing@0.1.0"));
    assert!(
        err.contains("does not export nyann:policy/policy (it exports acme:other/thing@0.1.0)"),
        "{err}"
    );
    // The right name with the wrong function types fails the shape check.
    let err = load_err(&wat_component(None, "nyann:policy/policy@0.1.0"));
    assert_eq!(
        err,
        "cannot load policy test.wasm: its `describe` does not match nyann:policy@0.1: expected 1 \
         result(s), found 0"
    );
    assert_host_healthy().await;
}

#[tokio::test]
async fn core_module_and_random_bytes_are_refused() {
    let err = load_err(&wat::parse_str("(module (func (export \"judge\")))").unwrap());
    assert!(
        err.contains("is a core WebAssembly module, not a component"),
        "{err}"
    );

    // Deterministic noise, alone and behind a valid component header.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    assert!(load_err(&noise).contains("is not a WebAssembly component (no \\0asm header)"));
    let mut headed = b"\0asm\x0d\x00\x01\x00".to_vec();
    headed.extend_from_slice(&noise);
    assert!(load_err(&headed).contains("is not a valid component"));
    assert!(load_err(b"").contains("not a WebAssembly component"));
    let missing = common::host()
        .load_file(std::path::Path::new("/nonexistent/policy.wasm"))
        .unwrap_err();
    assert!(
        missing
            .to_string()
            .starts_with("cannot load policy /nonexistent/policy.wasm: cannot read it")
    );
    assert_host_healthy().await;
}

/// The network clients of interpreter runtimes (componentize-py's
/// wasi:sockets, StarlingMonkey's wasi:http) load, linked as functions that
/// fail when called: the policy runs, and a call into one fails naming the
/// interface, recorded as `forbidden`. Nothing else changes: the same
/// component without the import answers the same.
#[tokio::test]
async fn runtime_network_imports_load_and_fail_when_called() {
    let wit = format!(
        "{}\npackage wasi:sockets@0.2.9 {{\n    interface tcp {{\n        start-connect: func();\n    }}\n}}\n",
        Interface::V0_5.wit().replace(
            "    import host;",
            "    import host;\n    import wasi:sockets/tcp@0.2.9;"
        )
    );
    let component = nyann_guests::assembled::component(
        &wit,
        "0.5.0",
        &Assembled {
            host_import: Some("start-connect".into()),
            import_interface: Some("wasi:sockets/tcp@0.2.9".into()),
            ..Assembled::default()
        },
    )
    .unwrap();
    let policy = common::host().load_bytes("net.wasm", &component).unwrap();
    assert_eq!(policy.name(), "assembled");
    let err = policy.judge(&[], &stage(4), &[]).await.unwrap_err();
    assert_eq!(
        err.failure(),
        Some(&CallFailure::Forbidden {
            interface: "wasi:sockets/tcp".into(),
            function: "start-connect".into(),
        })
    );
    assert_eq!(err.failure().map(CallFailure::kind), Some("forbidden"));
    assert!(
        err.to_string().starts_with(
            "policy assembled: called wasi:sockets/tcp, which policies may not use (`start-connect`"
        ),
        "{err}"
    );
    assert_host_healthy().await;
}
