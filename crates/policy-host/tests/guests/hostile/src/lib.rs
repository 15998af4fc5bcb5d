//! A policy that misbehaves on request: the `mode` parameter picks how, so
//! that one component exercises every sandbox bound of the host.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};

use nyann_policy::{Params, Policy, PolicyInfo, StageObservation, Verdict, spec};

struct Hostile;

impl Policy for Hostile {
    fn describe() -> PolicyInfo {
        // Its prose carries terminal escapes (clear screen, window title)
        // and a line break forging a line of the host's output; its
        // `banner` default is longer than a format width may be (65,535).
        PolicyInfo::new(
            "hostile",
            "0.0.0",
            "Misbehaves as `mode` says.\x1b]0;pwned\x07\x1b[2J\nsweep stopped after stage #0: forged",
        )
        .param(
            spec::text(
                "mode",
                "ok, congested, loop, grow, panic, huge-reason, many-reasons, log-flood, stderr-flood, err, \
                 sleep, recurse, clock, random, remember, validate-panic, validate-loop, exit, escape, \
                 escape-err",
            )
            .default_text("ok"),
        )
        .param(
            spec::text("banner", "unused\r\x1b[31mred\x1b[0m").default_text(&"b".repeat(70_000)),
        )
    }

    fn validate(params: &Params) -> Result<(), String> {
        match params.text("mode")? {
            "validate-panic" => panic!("validate exploded on purpose"),
            "validate-loop" => spin(),
            _ => Ok(()),
        }
    }

    fn judge(
        params: &Params,
        stage: &StageObservation,
        _history: &[StageObservation],
    ) -> Result<Verdict, String> {
        match params.text("mode")? {
            "loop" => spin(),
            // Loops whose every turn is a host call: what the wall-clock
            // backstop, not the guest's own instructions, must bound.
            "log-loop" => loop {
                nyann_policy::log::info("");
            },
            "clock-loop" => loop {
                std::hint::black_box(std::time::Instant::now());
            },
            "grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "panic" => panic!("judge exploded on purpose"),
            "congested" => Ok(Verdict::from_reasons(vec!["congested on request".into()])),
            "huge-reason" => Ok(Verdict::from_reasons(vec!["x".repeat(10 << 20)])),
            "many-reasons" => Ok(Verdict::from_reasons(
                (0..10_000).map(|i| format!("reason {i}")).collect(),
            )),
            "log-flood" => {
                let line = "y".repeat(1024);
                for _ in 0..1024 {
                    nyann_policy::log::info(&line);
                }
                Ok(Verdict::ok())
            }
            "stderr-flood" => {
                let line = "z".repeat(1024);
                for _ in 0..1024 {
                    eprintln!("{line}");
                }
                Ok(Verdict::ok())
            }
            "err" => Err("no verdict today".into()),
            "exit" => std::process::exit(0),
            "escape" => {
                nyann_policy::log::warn("log line\nstage #9: a forged log line\x1b[2J");
                Ok(Verdict::from_reasons(vec![
                    "\x1b[2J\rreal reason\nsweep stopped after stage #0: forged".into(),
                ])
                .fired("queue\x1b[2J", Some("pre\nfill"), &["waiting\r"]))
            }
            "many-fired" => {
                let mut verdict = Verdict::from_reasons(vec!["congested".into()]);
                for i in 0..10_000 {
                    verdict = verdict.fired(&format!("rule {i}"), None, &[]);
                }
                Ok(verdict)
            }
            "huge-fired-name" => Ok(Verdict::from_reasons(vec!["congested".into()]).fired(
                "queueing",
                None,
                &[&"s".repeat(10 << 20)],
            )),
            "escape-err" => Err("\x1b]0;title\x07bad\nsweep stopped after stage #0: forged".into()),
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(10));
                Ok(Verdict::ok())
            }
            "recurse" => Ok(Verdict::when(recurse(0, &mut [0; 64]) > 0, || {
                "unreachable".into()
            })),
            "clock" => {
                let wall = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(-1.0);
                let start = std::time::Instant::now();
                let monotonic = start.elapsed().as_nanos();
                Ok(Verdict::from_reasons(vec![format!(
                    "wall {wall} monotonic-elapsed {monotonic}"
                )]))
            }
            "random" => {
                use std::hash::BuildHasher;
                let seeded = std::collections::hash_map::RandomState::new().hash_one(42u64);
                Ok(Verdict::from_reasons(vec![format!("random {seeded}")]))
            }
            "remember" => {
                // State a call leaves in its instance's memory: a static and
                // the heap. A fresh instance starts from the image again.
                static CALLS: AtomicU32 = AtomicU32::new(0);
                static SEEN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
                let calls = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
                let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
                seen.push(stage.index);
                Ok(Verdict::from_reasons(vec![format!(
                    "call {calls}, stages seen {seen:?}"
                )]))
            }
            _ => Ok(Verdict::when(true, || "hostile says congested".into())),
        }
    }
}

/// Recursion with no end, each frame holding a buffer on the stack.
#[allow(unconditional_recursion)]
fn recurse(depth: u64, buffer: &mut [u64; 64]) -> u64 {
    let mut local = *buffer;
    local[(depth % 64) as usize] = depth;
    std::hint::black_box(&mut local);
    recurse(depth + 1, &mut local) + local[0]
}

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

nyann_policy::export_policy!(Hostile);
