//! The simulator as a stand-alone process without building the whole
//! `nyann-bench` binary (handy for benchmarks of the simulator itself):
//! `cargo run -p nyann-sim --release --example serve -- --profile fast --port 0`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    sim: nyann_sim::SimArgs,
}

#[tokio::main]
async fn main() {
    let sim = nyann_sim::start(Cli::parse().sim).await.unwrap();
    println!("endpoint {}", sim.base_url());
    for (role, addr) in sim.metrics_endpoints() {
        println!("metrics {role} http://{addr}/metrics");
    }
    tokio::signal::ctrl_c().await.unwrap();
    sim.shutdown().await;
}
