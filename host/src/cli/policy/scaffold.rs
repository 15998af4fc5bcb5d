//! `nyann-bench policy new NAME`: a new policy crate that builds anywhere
//! with only cargo and the wasm32-wasip2 target, without a nyann-bench
//! checkout. The SDK (`nyann-policy`, with the WIT it implements) is copied
//! into it from the sources this binary was built with, as
//! `vendor/nyann-policy`; the crate depends on that copy by path, and on
//! nothing but crates.io otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

/// The SDK's files, as the binary was built with them.
const SDK_FILES: [(&str, &str); 4] = [
    (
        "Cargo.toml",
        include_str!("../../../../policies/sdk/Cargo.toml"),
    ),
    (
        "README.md",
        include_str!("../../../../policies/sdk/README.md"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../../policies/sdk/src/lib.rs"),
    ),
    (
        "wit/policy.wit",
        include_str!("../../../../policies/sdk/wit/policy.wit"),
    ),
];

/// Where the SDK goes in the new crate.
const VENDORED_SDK: &str = "vendor/nyann-policy";

pub fn new(name: &str) -> anyhow::Result<ExitCode> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        bail!(
            "policy name {name:?}: use lowercase letters, digits and `-`, starting with a letter"
        );
    }
    let dir = PathBuf::from(name);
    if dir.exists() {
        bail!(
            "{} already exists; pick another name or remove it",
            dir.display()
        );
    }
    for (path, content) in files(name) {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, content)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let wasm = format!(
        "{name}/target/wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    );
    println!(
        "created {name}/ (Cargo.toml, src/lib.rs, README.md, rust-toolchain.toml, \
         {VENDORED_SDK}/: the SDK and its WIT)\n"
    );
    println!("build it:   cd {name} && cargo build --release --target wasm32-wasip2");
    println!("test rules: cd {name} && cargo test");
    println!("check it:   nyann-bench policy check {wasm}");
    println!("use it:     nyann-bench generate --policy {wasm} ...");
    println!("\n(needs the target once: rustup target add wasm32-wasip2)");
    Ok(ExitCode::SUCCESS)
}

/// Every file of a new policy crate, by path: a complete, working policy
/// and the SDK it builds with.
pub fn files(name: &str) -> Vec<(String, String)> {
    let mut files = vec![
        ("Cargo.toml".to_string(), cargo_toml(name)),
        ("src/lib.rs".to_string(), lib_rs(name)),
        (".gitignore".to_string(), "/target\n".to_string()),
        ("README.md".to_string(), readme(name)),
        ("rust-toolchain.toml".to_string(), TOOLCHAIN.to_string()),
    ];
    files.extend(
        SDK_FILES
            .iter()
            .map(|(path, content)| (format!("{VENDORED_SDK}/{path}"), content.to_string())),
    );
    files
}

/// The toolchain the SDK needs (its `wit-bindgen` needs Rust 1.95), with
/// the component target: rustup installs both on the first build.
const TOOLCHAIN: &str = r#"# The SDK (vendor/nyann-policy) needs Rust 1.95 or newer; rustup installs
# this toolchain and the WebAssembly component target on the first build.
[toolchain]
channel = "1.95.0"
targets = ["wasm32-wasip2"]
"#;

fn readme(name: &str) -> String {
    let wasm = format!(
        "target/wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    );
    format!(
        r#"# {name}

A congestion policy for nyann-bench: a WebAssembly component implementing
`nyann:policy@0.4` (`vendor/nyann-policy/wit/policy.wit`). The rules are in
`src/lib.rs`, plain Rust, tested natively.

```sh
cargo test                                       # the rules, natively
cargo build --release --target wasm32-wasip2     # the component
nyann-bench policy check {wasm}
nyann-bench generate --policy {wasm} ...
```

`rust-toolchain.toml` pins Rust 1.95 and the `wasm32-wasip2` target (with
`RUSTUP_AUTO_INSTALL=0`, install them once: `rustup toolchain install 1.95.0
--target wasm32-wasip2`). The walk-through (parameters, the stage history,
logging, replaying a recorded run) is in `vendor/nyann-policy/README.md`.
"#
    )
}

fn cargo_toml(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

# cdylib: the WebAssembly component; rlib: native `cargo test` of the rules.
[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
# The nyann-bench policy SDK (nyann:policy@0.4), copied here by
# `nyann-bench policy new` so that this crate builds anywhere.
nyann-policy = {{ path = "{VENDORED_SDK}" }}

# Small components load fast.
[profile.release]
opt-level = "s"
lto = true
strip = true
codegen-units = 1

# A standalone crate, even when created inside another workspace.
[workspace]
"#
    )
}

fn lib_rs(name: &str) -> String {
    format!(
        r#"//! {name}: a nyann-bench congestion policy.
//!
//! Build: `cargo build --release --target wasm32-wasip2`
//! Use:   `nyann-bench generate --policy target/wasm32-wasip2/release/{file}.wasm ...`

use nyann_policy::{{Params, Policy, PolicyInfo, StageObservation, Verdict, spec}};

struct MyPolicy;

impl Policy for MyPolicy {{
    fn describe() -> PolicyInfo {{
        PolicyInfo::new(
            "{name}",
            env!("CARGO_PKG_VERSION"),
            "Congested when client TTFT p99 or the error rate is too high.",
        )
        // It judges the client's figures only, so it runs without
        // --scrape or --prometheus-url; drop this line to read stage.roles.
        .client_only()
        .param(spec::duration("ttft_p99", "client TTFT p99 limit").required())
        .param(
            spec::fraction("max_error_rate", "largest share of failed requests")
                .default_number(0.01),
        )
    }}

    fn validate(params: &Params) -> Result<(), String> {{
        params.require_positive("ttft_p99")?;
        Ok(())
    }}

    fn judge(
        params: &Params,
        stage: &StageObservation,
        _history: &[StageObservation],
    ) -> Result<Verdict, String> {{
        Ok(rule(
            params.seconds("ttft_p99")?,
            params.fraction("max_error_rate")?,
            stage,
        ))
    }}
}}

/// The rule, as plain Rust: `cargo test` runs it natively.
fn rule(ttft_limit: f64, max_error_rate: f64, stage: &StageObservation) -> Verdict {{
    let mut reasons = Vec::new();
    if stage.client.ttft_p99_seconds > ttft_limit {{
        reasons.push(format!(
            "client TTFT p99 {{:.3}}s > {{ttft_limit}}s",
            stage.client.ttft_p99_seconds
        ));
    }}
    if stage.client.error_rate() > max_error_rate {{
        reasons.push(format!(
            "error rate {{:.1}}% > {{:.1}}%",
            stage.client.error_rate() * 100.0,
            max_error_rate * 100.0
        ));
    }}
    Verdict::from_reasons(reasons)
}}

nyann_policy::export_policy!(MyPolicy);

#[cfg(test)]
mod tests {{
    use super::*;
    use nyann_policy::ClientStats;

    #[test]
    fn slow_stage_is_congested() {{
        let stage = StageObservation {{
            client: ClientStats {{
                ttft_p99_seconds: 3.0,
                requests_ok: 100,
                ..Default::default()
            }},
            ..Default::default()
        }};
        assert!(rule(2.0, 0.01, &stage).congested);
        assert!(!rule(5.0, 0.01, &stage).congested);
    }}
}}
"#,
        file = name.replace('-', "_")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(files: &[(String, String)], path: &str) -> String {
        files
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| panic!("no {path}"))
    }

    #[test]
    fn the_crate_is_self_contained() {
        let files = files("my-policy");
        let cargo = file(&files, "Cargo.toml");
        assert!(cargo.contains("name = \"my-policy\""));
        assert!(cargo.contains("nyann-policy = { path = \"vendor/nyann-policy\" }"));
        assert!(
            !cargo.contains("/work") && !cargo.contains("git ="),
            "{cargo}"
        );
        assert!(file(&files, "src/lib.rs").contains("release/my_policy.wasm"));
        // The vendored SDK builds on its own: no workspace inheritance.
        let sdk = file(&files, "vendor/nyann-policy/Cargo.toml");
        assert!(!sdk.contains("workspace = true"), "{sdk}");
        assert!(file(&files, "vendor/nyann-policy/wit/policy.wit").contains("nyann:policy@0.4.0"));
        // Its own README, and the toolchain the SDK needs.
        assert!(file(&files, "README.md").contains("release/my_policy.wasm"));
        let toolchain = file(&files, "rust-toolchain.toml");
        assert!(
            toolchain.contains("channel = \"1.95.0\"") && toolchain.contains("wasm32-wasip2"),
            "{toolchain}"
        );
    }

    /// The SDK's README shows exactly what `policy new my-policy` writes.
    #[test]
    fn the_sdk_readme_shows_the_scaffold() {
        let readme = include_str!("../../../../policies/sdk/README.md");
        let files = files("my-policy");
        for (path, fence) in [("Cargo.toml", "toml"), ("src/lib.rs", "rust")] {
            let marker = format!("`my-policy/{path}`:\n\n```{fence}\n");
            let start = readme
                .find(&marker)
                .map(|i| i + marker.len())
                .unwrap_or_else(|| panic!("policies/sdk/README.md has no block after {marker:?}"));
            let block = &readme[start..];
            let block = &block[..block.find("```\n").unwrap_or(block.len())];
            assert_eq!(
                block,
                file(&files, path),
                "policies/sdk/README.md's my-policy/{path} differs from what `policy new` writes"
            );
        }
    }
}
