//! The command line: one file per command, each with its clap `Args` and a
//! `run` that returns the process exit code. The commands that send load
//! resolve their flags into `nyann_run`'s spec and share its words on the
//! terminal (`run`, `fleet`).

// First: its `shown!` serves the flags of the modules below.
#[macro_use]
mod defaults;
mod check;
mod client;
mod demo;
mod eval;
mod fleet;
mod generate;
mod interrupt;
mod kube;
mod policy;
pub mod progress;
mod registry;
mod report;
mod run;
mod scenario;
mod serve;
mod signals;
mod sim;

pub use run::Interrupted;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

/// `0.1.0 (1a2b3c4d5e6f 2026-12-01)`: the version and the commit built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("NYANN_BUILD_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "nyann-bench",
    version = VERSION,
    about = "Load generator for LLM inference servers that stops a sweep when the server is congested",
    long_about = None,
)]
pub struct Cli {
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Only errors and the final verdict line on stderr (stdout is unchanged).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,

    /// When to colour stderr: auto (on a terminal, unless NO_COLOR is set),
    /// always or never.
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = Color::Auto)]
    pub color: Color,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Color {
    Auto,
    Always,
    Never,
}

/// How stderr is written, decided once from `-q`, `--color`, `NO_COLOR`
/// and whether stderr is a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ui {
    /// Only errors and the final verdict line.
    pub quiet: bool,
    /// ANSI colours in the log.
    pub color: bool,
    /// stderr is a terminal: progress bars are drawn.
    pub terminal: bool,
}

impl Cli {
    /// Parses the command line. `--color` is looked for first, so that
    /// clap's own help and error messages follow it too.
    pub fn parse_args() -> Cli {
        let args: Vec<OsString> = std::env::args_os().collect();
        let mut command = Cli::command();
        if let Some(color) = color_flag(&args) {
            command = command.color(match color {
                Color::Auto => clap::ColorChoice::Auto,
                Color::Always => clap::ColorChoice::Always,
                Color::Never => clap::ColorChoice::Never,
            });
        }
        let matches = command.get_matches_from(args);
        Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit())
    }

    pub fn ui(&self) -> Ui {
        let terminal = std::io::stderr().is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Ui {
            quiet: self.quiet,
            color: match self.color {
                Color::Always => true,
                Color::Never => false,
                Color::Auto => terminal && !no_color,
            },
            terminal,
        }
    }
}

/// The last `--color WHEN` / `--color=WHEN` before a `--`, if valid.
fn color_flag(args: &[OsString]) -> Option<Color> {
    let mut found = None;
    let mut args = args.iter().map(|a| a.to_string_lossy());
    while let Some(arg) = args.next() {
        let value = match arg.as_ref() {
            "--" => break,
            "--color" => args.next().map(|v| v.into_owned()),
            other => other.strip_prefix("--color=").map(str::to_owned),
        };
        if let Some(color) = value.and_then(|v| Color::from_str(&v, false).ok()) {
            found = Some(color);
        }
    }
    found
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a scenario against an OpenAI-compatible server.
    Generate(generate::Args),
    /// Run a short congestion-stopped sweep against the built-in simulator.
    Demo(demo::Args),
    /// Ask an eval dataset's questions as load, each once, and score the
    /// replies (one stage; a sweep with evals is a --config scenario).
    #[command(subcommand)]
    Eval(eval::Command),
    /// Serve a simulated vLLM engine (OpenAI API and /metrics).
    Sim(Box<sim::Args>),
    /// Compile a scenario file and print its IR as JSON.
    Scenario(scenario::Args),
    /// Build the HTML report of saved runs (several are overlaid).
    Report(report::Args),
    /// Inspect, check and scaffold congestion policies.
    #[command(subcommand)]
    Policy(policy::Command),
    /// Serve runs to teams and agents: a JSON API and a web page over a
    /// queue of runs against operator-defined targets (docs/service.md).
    Serve(Box<serve::Args>),
    /// Kubernetes manifests of a run by several workers, or of the run
    /// service.
    #[command(subcommand)]
    Kube(kube::Command),
    /// Print a shell completion script, e.g. `nyann-bench completions bash >
    /// ~/.local/share/bash-completion/completions/nyann-bench`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

impl Command {
    pub async fn run(self, ui: Ui) -> anyhow::Result<ExitCode> {
        match self {
            Command::Generate(args) => generate::run(args, ui).await,
            Command::Demo(args) => demo::run(args, ui).await,
            Command::Eval(command) => eval::run(command, ui).await,
            Command::Sim(args) => sim::run(*args).await,
            Command::Scenario(args) => scenario::run(args).await,
            Command::Report(args) => report::run(args, ui).await,
            Command::Policy(command) => policy::run(command).await,
            Command::Kube(command) => kube::run(command).await,
            Command::Serve(args) => serve::run(*args).await,
            Command::Completions { shell } => {
                use std::io::Write;
                std::io::stdout()
                    .write_all(completion_script(shell).as_bytes())
                    .map_err(|e| anyhow::anyhow!("cannot write the script: {e}"))?;
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}

/// The completion script for `shell`. clap_complete 4.6 writes bash's
/// per-subcommand cases for a hyphenated binary under a name that differs
/// from the one its dispatcher selects (`nyann__subcmd__bench__subcmd__generate`
/// against `nyann__bench__subcmd__generate`), so nothing below the top level
/// completed; the cases are renamed to match.
pub fn completion_script(shell: clap_complete::Shell) -> String {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "nyann-bench", &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    match shell {
        clap_complete::Shell::Bash => script.replace("nyann__subcmd__bench", "nyann__bench"),
        _ => script,
    }
}

/// Logs go to stderr (stdout carries results), above the progress bar when
/// one is drawn. `-v` raises the level, `-q` keeps errors only; RUST_LOG
/// wins over both.
pub fn init_logging(verbose: u8, ui: Ui) {
    let default = match (ui.quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(progress::StderrAboveBar)
        .with_ansi(ui.color)
        .with_target(false)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Clap's own consistency checks (unique argument ids across flattened
    /// structs, valid defaults, ...) for every command.
    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The help of every command, as `--help` prints it, against the
    /// snapshots in `cli/snapshots/`: a change of what users read shows in
    /// review. Accept an intended change with `INSTA_UPDATE=always` (or
    /// `cargo insta review`) and commit the snapshots.
    #[test]
    fn help_of_every_command() {
        fn walk(command: &mut clap::Command, path: &str, helps: &mut Vec<(String, String)>) {
            // The values of environment variables are the machine's, not the help's.
            let mut shown = command.clone().mut_args(|arg| arg.hide_env_values(true));
            helps.push((path.to_string(), shown.render_long_help().to_string()));
            // clap's own `help` subcommands only list the others.
            for sub in command
                .get_subcommands_mut()
                .filter(|sub| sub.get_name() != "help")
            {
                let name = format!("{path}-{}", sub.get_name());
                walk(sub, &name, helps);
            }
        }
        let mut root = Cli::command().term_width(100);
        root.build();
        let mut helps = Vec::new();
        walk(&mut root, "nyann-bench", &mut helps);
        assert!(
            helps.len() > 15,
            "{} commands: the walk missed subcommands",
            helps.len()
        );
        for (name, help) in helps {
            insta::assert_snapshot!(name, help);
        }
    }

    #[test]
    fn color_flag_is_found_before_parsing() {
        let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            color_flag(&args(&["x", "--color", "never", "-h"])),
            Some(Color::Never)
        );
        assert_eq!(
            color_flag(&args(&["x", "demo", "--color=always"])),
            Some(Color::Always)
        );
        assert_eq!(color_flag(&args(&["x", "--color", "sometimes"])), None);
        assert_eq!(color_flag(&args(&["x", "--", "--color=always"])), None);
        assert_eq!(color_flag(&args(&["x", "demo"])), None);
    }
}
