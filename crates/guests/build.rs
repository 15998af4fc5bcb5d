//! Stops the build at once when the toolchain lacks the wasm32-wasip2
//! target (everything that depends on this crate builds guests), and tells
//! the library where guests are built and with which rustc.

#[path = "src/toolchain.rs"]
mod toolchain;

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/toolchain.rs");
    let (Some(rustc), Some(out_dir)) = (std::env::var_os("RUSTC"), std::env::var_os("OUT_DIR"))
    else {
        println!("cargo::error=RUSTC or OUT_DIR is not set: build this crate with cargo");
        return;
    };
    // Checked again whenever the target's library directory changes (or,
    // while it is missing, on every build): a target removed later is
    // noticed, not remembered as present.
    if let Some(libdir) = toolchain::target_libdir(Path::new(&rustc)) {
        println!("cargo::rerun-if-changed={libdir}");
    }
    if !toolchain::target_installed(Path::new(&rustc)) {
        println!("cargo::error={}", toolchain::MISSING_TARGET);
        return;
    }
    println!(
        "cargo::rustc-env=NYANN_GUESTS_RUSTC={}",
        Path::new(&rustc).display()
    );
    println!(
        "cargo::rustc-env=NYANN_GUESTS_TARGET_DIR={}",
        guest_target_dir(Path::new(&out_dir)).display()
    );
}

/// `<outer target dir>/nyann-policy-guests`, found from OUT_DIR
/// (`<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`): shared by the
/// debug and release builds and by every test binary. OUT_DIR itself when
/// the layout is unexpected.
fn guest_target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|target| target.join("nyann-policy-guests"))
        .unwrap_or_else(|| out_dir.join("guests"))
}
