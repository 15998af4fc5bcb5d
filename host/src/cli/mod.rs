//! The command line: one file per command, each with its clap `Args` and a
//! `run` that returns the process exit code.

mod demo;
mod generate;
mod policy;
mod scenario;
mod sim;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "nyann-bench",
    version,
    about = "Load generator for LLM inference servers that stops a sweep when the server is congested",
    long_about = None,
)]
pub struct Cli {
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a scenario against an OpenAI-compatible server.
    Generate(generate::Args),
    /// Run a short congestion-stopped sweep against the built-in simulator.
    Demo(demo::Args),
    /// Serve a simulated vLLM engine (OpenAI API and /metrics).
    Sim(sim::Args),
    /// Compile a scenario file and print its IR as JSON.
    Scenario(scenario::Args),
    /// Inspect, check and scaffold congestion policies.
    #[command(subcommand)]
    Policy(policy::Command),
}

impl Command {
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            Command::Generate(args) => generate::run(args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Sim(args) => sim::run(args).await,
            Command::Scenario(args) => scenario::run(args).await,
            Command::Policy(command) => policy::run(command).await,
        }
    }
}

/// Logs go to stderr (stdout carries results). `-v` raises the level; RUST_LOG wins.
pub fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Clap's own consistency checks (unique argument ids across flattened
    /// structs, valid defaults, ...) for every command.
    #[test]
    fn command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
