//! Whether the toolchain can build for the wasm target. Shared by the build
//! script (which stops the build early without it) and the library.

use std::path::Path;
use std::process::Command;

/// The wasm target policies are built for.
pub const WASM_TARGET: &str = "wasm32-wasip2";

/// What to do when the target is missing.
pub const MISSING_TARGET: &str = "the wasm32-wasip2 target is not installed: run `rustup target add wasm32-wasip2` (needed to build policy components: the tests and `cargo xtask builtin`; the nyann-bench binary itself builds without it)";

/// True when `rustc` has a standard library for the wasm target.
pub fn target_installed(rustc: &Path) -> bool {
    let out = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", WASM_TARGET])
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .output();
    let Ok(out) = out else { return false };
    if !out.status.success() {
        return false;
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    std::fs::read_dir(&dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == "libstd.rlib" || (name.starts_with("libstd-") && name.ends_with(".rlib"))
        })
    })
}
