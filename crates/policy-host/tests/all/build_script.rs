//! The nested guest build used by build.rs: a toolchain without the
//! wasm32-wasip2 target gives the one-line instruction.

use std::path::Path;

use crate::common::guest;

#[test]
fn missing_target_says_how_to_install_it() {
    let dir = std::env::temp_dir().join(format!("nyann-fake-rustc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A rustc whose wasm32-wasip2 library directory does not exist.
    let fake = dir.join("rustc");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho /nonexistent/lib/rustlib/wasm32-wasip2/lib\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&fake)
        .status()
        .unwrap();

    let err = guest::build(
        Path::new(env!("CARGO")),
        &fake,
        Path::new("Cargo.toml"),
        &["x"],
        &dir,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the wasm32-wasip2 target is not installed: run `rustup target add wasm32-wasip2`"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
