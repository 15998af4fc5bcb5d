//! The simulator as a stand-alone process without building the whole
//! `nyann-bench` binary (handy for benchmarks of the simulator itself):
//! `cargo run -p nyann-sim --features clap --release --example serve -- --profile fast`.
//! The binary's `nyann-bench sim` has every other setting.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use nyann_sim::{Profile, SimConfig};

#[derive(Parser)]
struct Cli {
    #[arg(long, value_enum, default_value_t = Profile::Default)]
    profile: Profile,
    /// Port of the OpenAI endpoint (0 = ephemeral).
    #[arg(long, default_value_t = 0)]
    port: u16,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Multiplies every simulated duration.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let sim = nyann_sim::start(SimConfig {
        profile: cli.profile,
        port: cli.port,
        seed: cli.seed,
        time_scale: cli.time_scale,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    println!("endpoint {}", sim.base_url());
    for (role, addr) in sim.metrics_endpoints() {
        println!("metrics {role} http://{addr}/metrics");
    }
    tokio::signal::ctrl_c().await.unwrap();
    sim.shutdown().await;
}
