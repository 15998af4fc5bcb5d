//! `cargo xtask builtin`: rebuilds the built-in policy component from
//! `policies/builtin` and writes it to `policies/builtin/builtin.wasm`, the
//! file the nyann-bench binary embeds, with its code precompiled for x86-64
//! Linux (`builtin.x86_64-linux.cwasm` and the digest of its source, which
//! the binary embeds too). Commit the result.
//!
//! `cargo xtask assemble OUT.wasm LINE EXTRA_MEMORIES GROW_MIB FILLER_MIB
//! [FUNCTION_KIB]`: writes an assembled policy component (see
//! `nyann_guests::assembled`) for the interface line `0.1` or `0.2`, its
//! filler code in functions of FUNCTION_KIB (default 4), for the sandbox
//! benchmark (`bench/policy-sandbox.sh`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["builtin"] => regenerate_builtin(),
        ["assemble", out, line, memories, grow_mib, filler_mib] => {
            assemble(out, line, memories, grow_mib, filler_mib, "4")
        }
        [
            "assemble",
            out,
            line,
            memories,
            grow_mib,
            filler_mib,
            function_kib,
        ] => assemble(out, line, memories, grow_mib, filler_mib, function_kib),
        _ => {
            eprintln!(
                "usage: cargo xtask builtin\n  rebuilds {} and its precompiled code from policies/builtin (then commit them)\n\
                 usage: cargo xtask assemble OUT.wasm 0.1|0.2 EXTRA_MEMORIES GROW_MIB FILLER_MIB [FUNCTION_KIB]\n  \
                 writes an assembled policy component (for bench/policy-sandbox.sh)",
                nyann_guests::BUILTIN_COMMITTED
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(message) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn regenerate_builtin() -> Result<String, String> {
    let built =
        nyann_guests::repository_guest(nyann_guests::BUILTIN_PACKAGE).map_err(|e| e.to_string())?;
    let bytes =
        std::fs::read(&built).map_err(|e| format!("cannot read {}: {e}", built.display()))?;
    // Precompiled from the new component, with the host's engine settings.
    let (artifact, digest) = nyann_policy_host::precompiled::precompile(&bytes)?;
    let lines = [
        write_if_changed(nyann_guests::BUILTIN_COMMITTED, &bytes)?,
        write_if_changed(nyann_guests::BUILTIN_PRECOMPILED_COMMITTED, &artifact)?,
        write_if_changed(nyann_guests::BUILTIN_PRECOMPILED_DIGEST, digest.as_bytes())?,
    ];
    Ok(lines.join("\n"))
}

/// Write `bytes` to `relative` (from the repository root) unless it holds
/// them already; says which.
fn write_if_changed(relative: &str, bytes: &[u8]) -> Result<String, String> {
    let path = nyann_guests::repository_root().join(relative);
    if std::fs::read(&path).ok().as_deref() == Some(bytes) {
        return Ok(format!("{relative} is up to date ({} bytes)", bytes.len()));
    }
    std::fs::write(&path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(format!(
        "wrote {relative} ({} bytes): commit it",
        bytes.len()
    ))
}

fn assemble(
    out: &str,
    line: &str,
    memories: &str,
    grow_mib: &str,
    filler_mib: &str,
    function_kib: &str,
) -> Result<String, String> {
    let number = |what: &str, text: &str| {
        text.parse::<u32>()
            .map_err(|_| format!("{what} must be a whole number, got {text:?}"))
    };
    let wit_path = nyann_guests::repository_root().join(format!("wit/{line}/policy.wit"));
    let wit = std::fs::read_to_string(&wit_path)
        .map_err(|e| format!("no interface line {line:?} ({}: {e})", wit_path.display()))?;
    let spec = nyann_guests::assembled::Assembled {
        extra_memories: number("EXTRA_MEMORIES", memories)?,
        judge_grows_pages: number("GROW_MIB", grow_mib)? * 16,
        filler_bytes: number("FILLER_MIB", filler_mib)? as usize * (1 << 20),
        filler_function_bytes: number("FUNCTION_KIB", function_kib)? as usize * (1 << 10),
        ..Default::default()
    };
    let bytes = nyann_guests::assembled::component(&wit, &format!("{line}.0"), &spec)?;
    std::fs::write(out, &bytes).map_err(|e| format!("cannot write {out}: {e}"))?;
    Ok(format!("wrote {out} ({} bytes)", bytes.len()))
}
