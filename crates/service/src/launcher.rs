//! The commands the service starts, given by its caller: this crate names
//! no command-line flag, so the binary that embeds the service says how to
//! compile a scenario and how to run one in a child process of its own.

use std::path::Path;

use crate::targets::Target;

/// One run to start: what the child process needs to know.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    pub target: &'a Target,
    /// The scenario as compiled at plan time (the IR, JSON).
    pub scenario: &'a Path,
    /// The run directory the child writes (empty when it starts).
    pub output_dir: &'a Path,
    pub policy: &'a str,
}

/// Builds the child processes' commands.
pub trait Launcher: Send + Sync + 'static {
    /// A command that compiles the Starlark file `scenario` within
    /// `max_steps` loop iterations and function calls, checks its
    /// `until_congested` parameters against `policy`, and prints the IR as
    /// JSON on stdout (exit 0), or its errors on stderr (exit non-zero).
    fn compile(&self, scenario: &Path, policy: &str, max_steps: u64) -> tokio::process::Command;

    /// A command that runs `job` and writes an ordinary run directory. It
    /// must drain on SIGINT, keeping every completed record, and exit 0
    /// when the run completed or stopped on congestion.
    fn run(&self, job: Job<'_>) -> tokio::process::Command;

    /// The `generate` flags that aim a run at `target` (its URL, model and
    /// signal source), for the pods of the Kubernetes backend, whose
    /// manifests set the scenario, output and policy themselves.
    fn target_flags(&self, target: &Target) -> Vec<String>;
}
