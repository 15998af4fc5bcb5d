//! A policy that misbehaves on request: the `mode` parameter picks how, so
//! that one component exercises every sandbox bound of the host.

use nyann_policy::{Params, Policy, PolicyInfo, StageObservation, Verdict, spec};

struct Hostile;

impl Policy for Hostile {
    fn describe() -> PolicyInfo {
        PolicyInfo::new("hostile", "0.0.0", "Misbehaves as `mode` says.").param(
            spec::text(
                "mode",
                "ok, loop, grow, panic, huge-reason, many-reasons, log-flood, stderr-flood, err",
            )
            .default_text("ok"),
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
        _stage: &StageObservation,
        _history: &[StageObservation],
    ) -> Result<Verdict, String> {
        match params.text("mode")? {
            "loop" => spin(),
            "grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "panic" => panic!("judge exploded on purpose"),
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
            _ => Ok(Verdict::when(true, || "hostile says congested".into())),
        }
    }
}

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

nyann_policy::export_policy!(Hostile);
