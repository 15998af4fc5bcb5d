//! `nyann-bench`: a load generator for LLM inference servers that stops a
//! sweep of load stages as soon as the server is congested.
//!
//! `main` only parses the command line, sets up logging and maps the outcome
//! to an exit code; each command lives in its own file under `cli/`.

mod cli;
#[cfg(test)]
mod schema;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse_args();
    let ui = cli.ui();
    cli::init_logging(cli.verbose, ui);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli.command.run(ui)) {
        Ok(code) => code,
        Err(err) if err.is::<cli::Interrupted>() => {
            eprintln!("{err}");
            ExitCode::from(130)
        }
        Err(err) => {
            let error = if ui.color {
                "\x1b[1;31merror\x1b[0m"
            } else {
                "error"
            };
            eprintln!("{error}: {err:#}");
            ExitCode::FAILURE
        }
    }
}
