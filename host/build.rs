//! Names the git commit the binary is built from, for `nyann-bench
//! --version` (`0.1.0 (1a2b3c4d5e6f 2026-12-01)`); "unknown commit" outside
//! a git checkout.

use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // Rebuild when HEAD moves: HEAD itself (branch switch) and the refs it
    // may point at (a commit on the branch), in the checkout's git dir and,
    // for a worktree, the shared one.
    for dir in ["--git-dir", "--git-common-dir"] {
        if let Some(dir) = git(&["rev-parse", "--path-format=absolute", dir]) {
            // Only files that exist: cargo reruns a build script that
            // watches a missing one on every build (no `packed-refs` before
            // the first `git gc`), and relinks the binary each time.
            for file in ["HEAD", "refs/heads", "packed-refs"] {
                let path = std::path::Path::new(&dir).join(file);
                if path.exists() {
                    println!("cargo::rerun-if-changed={}", path.display());
                }
            }
        }
    }
    let commit = git(&["log", "-1", "--format=%h %cs", "--abbrev=12"])
        .unwrap_or_else(|| "unknown commit".to_string());
    println!("cargo::rustc-env=NYANN_BUILD_COMMIT={commit}");
}

/// A git command's trimmed output, `None` if it fails (no git, no checkout).
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}
