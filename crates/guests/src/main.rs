//! `cargo xtask builtin`: rebuilds the built-in policy component from
//! `policies/builtin` and writes it to `policies/builtin/builtin.wasm`, the
//! file the nyann-bench binary embeds. Commit the result.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["builtin"] => match regenerate_builtin() {
            Ok(message) => {
                println!("{message}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("error: {message}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "usage: cargo xtask builtin\n  rebuilds {} from policies/builtin (then commit it)",
                nyann_guests::BUILTIN_COMMITTED
            );
            ExitCode::from(2)
        }
    }
}

fn regenerate_builtin() -> Result<String, String> {
    let built =
        nyann_guests::repository_guest(nyann_guests::BUILTIN_PACKAGE).map_err(|e| e.to_string())?;
    let bytes =
        std::fs::read(&built).map_err(|e| format!("cannot read {}: {e}", built.display()))?;
    let committed = nyann_guests::repository_root().join(nyann_guests::BUILTIN_COMMITTED);
    let before = std::fs::read(&committed).ok();
    if before.as_deref() == Some(bytes.as_slice()) {
        return Ok(format!(
            "{} is up to date ({} bytes)",
            nyann_guests::BUILTIN_COMMITTED,
            bytes.len()
        ));
    }
    std::fs::write(&committed, &bytes)
        .map_err(|e| format!("cannot write {}: {e}", committed.display()))?;
    Ok(format!(
        "wrote {} ({} bytes): commit it",
        nyann_guests::BUILTIN_COMMITTED,
        bytes.len()
    ))
}
