//! Fits the time model to the recorded sweep behind `--profile
//! vllm-cpu-ref` (see `nyann_sim::reference`) and prints the parameters,
//! the residual of every level and the profile file:
//! `cargo run -p nyann-sim --release --example fit-reference [MAX_EVALUATIONS]`.
//! About a minute on a quiet machine.

use nyann_sim::ServerProfile;
use nyann_sim::fit::{FitSettings, fit};
use nyann_sim::reference::recorded_run;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let evaluations = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let mut profile = ServerProfile::vllm_cpu_ref();
    let settings = FitSettings {
        limits: profile.engine.limits,
        prefill: None,
        noise: profile.engine.time,
        seed: 1,
        max_evaluations: evaluations,
    };
    let started = std::time::Instant::now();
    let fitted = fit(&[recorded_run()], &settings)?;
    println!(
        "{} evaluations in {:.0} s, rms log-ratio {:.3}",
        fitted.evaluations,
        started.elapsed().as_secs_f64(),
        fitted.rms
    );
    for stage in &fitted.residuals {
        println!("{}: {stage}", stage.label);
    }
    for note in &fitted.notes {
        println!("note: {note}");
    }
    profile.engine.time = fitted.time;
    print!("{}", profile.to_toml("fitted to nyann_sim::reference"));
    Ok(())
}
