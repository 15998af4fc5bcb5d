//! Compiles the built-in policy (`policies/builtin`) to a wasm32-wasip2
//! component and leaves it in `OUT_DIR/builtin.wasm` for `include_bytes!`.
//!
//! Like wasmtime's own test-program artifacts: a nested `cargo build` of the
//! guest crate in a separate target directory. No prebuilt `.wasm` is
//! committed. `NYANN_POLICY_BUILTIN_WASM=path` skips the nested build and
//! embeds the given file instead (for tooling that cannot run it).

#[path = "guest.rs"]
mod guest;

use std::path::{Path, PathBuf};

fn main() {
    if let Err(msg) = run() {
        // One line, and the build fails.
        println!("cargo::error={msg}");
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env("OUT_DIR")?);
    let root = manifest_dir
        .parent()
        .and_then(Path::parent)
        .ok_or("crates/policy-host has no grandparent directory")?
        .to_path_buf();
    for path in ["policies/builtin", "policies/sdk", "wit", "Cargo.lock"] {
        println!("cargo::rerun-if-changed={}", root.join(path).display());
    }
    println!("cargo::rerun-if-env-changed=NYANN_POLICY_BUILTIN_WASM");

    // Shared by debug and release outer builds (the guest is always built
    // in release) and by the tests that build more guests.
    let guest_target = guest_target_dir(&out_dir);
    println!(
        "cargo::rustc-env=NYANN_POLICY_GUEST_TARGET_DIR={}",
        guest_target.display()
    );
    println!(
        "cargo::rustc-env=NYANN_POLICY_WORKSPACE_ROOT={}",
        root.display()
    );
    println!("cargo::rustc-env=NYANN_POLICY_RUSTC={}", env("RUSTC")?);

    let artifact = match std::env::var_os("NYANN_POLICY_BUILTIN_WASM") {
        Some(path) => PathBuf::from(path),
        None => {
            let cargo = PathBuf::from(env("CARGO")?);
            let rustc = PathBuf::from(env("RUSTC")?);
            let dir = guest::build(
                &cargo,
                &rustc,
                &root.join("Cargo.toml"),
                &["nyann-builtin-policy"],
                &guest_target,
            )
            .map_err(|e| e.to_string().replace('\n', " | "))?;
            dir.join("nyann_builtin_policy.wasm")
        }
    };
    std::fs::copy(&artifact, out_dir.join("builtin.wasm"))
        .map_err(|e| format!("cannot copy {}: {e}", artifact.display()))?;
    Ok(())
}

fn env(key: &str) -> Result<String, String> {
    std::env::var(key).map_err(|_| format!("{key} is not set (not running under cargo?)"))
}

/// `<outer target dir>/nyann-policy-guests`, found from OUT_DIR
/// (`<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`); OUT_DIR itself
/// when the layout is unexpected.
fn guest_target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|target| target.join("nyann-policy-guests"))
        .unwrap_or_else(|| out_dir.join("guests"))
}
