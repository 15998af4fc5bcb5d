//! `nyann-bench policy new NAME`: a new policy crate that builds anywhere
//! with only cargo and the wasm32-wasip2 target, without a nyann-bench
//! checkout; `--lang python|js`, a directory that builds anywhere with the
//! Python or JavaScript tools its `build.sh` pins (`policies/sdk-python`,
//! `policies/sdk-js`, copied with the current WIT). The SDK (`nyann-policy`, with the WIT it implements) is copied
//! into it from the sources this binary was built with, as
//! `vendor/nyann-policy`; the crate depends on that copy by path, and on
//! nothing but crates.io otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

/// The SDK's files, as the binary was built with them.
const SDK_FILES: [(&str, &str); 5] = [
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
        "src/slo.rs",
        include_str!("../../../../policies/sdk/src/slo.rs"),
    ),
    (
        "wit/policy.wit",
        include_str!("../../../../policies/sdk/wit/policy.wit"),
    ),
];

/// Where the SDK goes in the new crate.
const VENDORED_SDK: &str = "vendor/nyann-policy";

/// The language of a new policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// A Rust crate with the nyann-policy SDK (cargo, wasm32-wasip2).
    Rust,
    /// A Python app with nyann_policy.py (componentize-py 0.25.1).
    Python,
    /// A JavaScript module with nyann_policy.js (QuickJS by default).
    Js,
}

/// The Python kit (`policies/sdk-python`): copied verbatim but `app.py`,
/// whose policy is renamed.
const PYTHON_FILES: [(&str, &str); 6] = [
    (
        "nyann_policy.py",
        include_str!("../../../../policies/sdk-python/nyann_policy.py"),
    ),
    (
        "app.py",
        include_str!("../../../../policies/sdk-python/app.py"),
    ),
    (
        "test_app.py",
        include_str!("../../../../policies/sdk-python/test_app.py"),
    ),
    (
        "build.sh",
        include_str!("../../../../policies/sdk-python/build.sh"),
    ),
    (
        "README.md",
        include_str!("../../../../policies/sdk-python/README.md"),
    ),
    (
        ".gitignore",
        include_str!("../../../../policies/sdk-python/.gitignore"),
    ),
];

/// The JavaScript kit (`policies/sdk-js`): copied verbatim but
/// `policy.js`, whose policy is renamed.
const JS_FILES: [(&str, &str); 6] = [
    (
        "nyann_policy.js",
        include_str!("../../../../policies/sdk-js/nyann_policy.js"),
    ),
    (
        "policy.js",
        include_str!("../../../../policies/sdk-js/policy.js"),
    ),
    (
        "package.json",
        include_str!("../../../../policies/sdk-js/package.json"),
    ),
    (
        "build.sh",
        include_str!("../../../../policies/sdk-js/build.sh"),
    ),
    (
        "README.md",
        include_str!("../../../../policies/sdk-js/README.md"),
    ),
    (
        ".gitignore",
        include_str!("../../../../policies/sdk-js/.gitignore"),
    ),
];

/// The name the kits' example policy goes by, replaced by the new one's.
const KIT_POLICY_NAME: &str = "my-policy";

pub fn new(name: &str, lang: Lang) -> anyhow::Result<ExitCode> {
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
    let files = match lang {
        Lang::Rust => files(name),
        Lang::Python | Lang::Js => kit_files(name, lang),
    };
    for (path, content) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, content)
            .with_context(|| format!("cannot write {}", path.display()))?;
        if path.extension().is_some_and(|e| e == "sh") {
            make_executable(&path)?;
        }
    }
    if lang != Lang::Rust {
        let (source, tool) = match lang {
            Lang::Python => ("app.py", "python3 and pip (componentize-py 0.25.1, once)"),
            _ => ("policy.js", "node and npm (componentize-qjs 0.4.5, once)"),
        };
        println!(
            "created {name}/ ({source}, nyann_policy.{}: the SDK, wit/policy.wit, build.sh, \
             README.md)\n",
            if lang == Lang::Python { "py" } else { "js" }
        );
        println!("build it:   cd {name} && ./build.sh");
        println!("check it:   nyann-bench policy check {name}/policy.wasm");
        println!("use it:     nyann-bench generate --policy {name}/policy.wasm ...");
        println!("\n(build.sh installs the pinned tools it needs: {tool})");
        return Ok(ExitCode::SUCCESS);
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

/// Every file of a new Python or JavaScript policy: the kit, its example
/// policy renamed, and the WIT it implements.
pub fn kit_files(name: &str, lang: Lang) -> Vec<(String, String)> {
    let (kit, source): (&[(&str, &str)], &str) = match lang {
        Lang::Python => (&PYTHON_FILES, "app.py"),
        _ => (&JS_FILES, "policy.js"),
    };
    let mut files: Vec<(String, String)> = kit
        .iter()
        .map(|(path, content)| {
            let content = if *path == source {
                content.replace(KIT_POLICY_NAME, name)
            } else {
                content.to_string()
            };
            (path.to_string(), content)
        })
        .collect();
    files.push((
        "wit/policy.wit".to_string(),
        nyann_policy_host::Interface::NEWEST.wit().to_string(),
    ));
    files
}

/// `chmod +x` (rwxr-xr-x): the build scripts.
fn make_executable(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))
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
`nyann:policy@0.5` (`vendor/nyann-policy/wit/policy.wit`). The rules are in
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
# The nyann-bench policy SDK (nyann:policy@0.5), copied here by
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

    /// A module added to the SDK must be copied too, or a new policy
    /// crate does not build (as `slo.rs` was not).
    #[test]
    fn every_sdk_source_is_vendored() {
        let sources = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/sdk/src");
        for entry in std::fs::read_dir(sources).unwrap() {
            let name = format!("src/{}", entry.unwrap().file_name().to_string_lossy());
            assert!(
                SDK_FILES.iter().any(|(path, _)| *path == name),
                "{name} of the SDK is not in SDK_FILES"
            );
        }
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
        assert!(file(&files, "vendor/nyann-policy/wit/policy.wit").contains("nyann:policy@0.5.0"));
        // Its own README, and the toolchain the SDK needs.
        assert!(file(&files, "README.md").contains("release/my_policy.wasm"));
        let toolchain = file(&files, "rust-toolchain.toml");
        assert!(
            toolchain.contains("channel = \"1.95.0\"") && toolchain.contains("wasm32-wasip2"),
            "{toolchain}"
        );
    }

    /// The Python and JavaScript kits are complete and self-contained:
    /// the SDK, the policy renamed, the current WIT, a build script that
    /// pins its tools, nothing that points at this checkout.
    #[test]
    fn the_python_and_js_kits_are_self_contained() {
        for (lang, source, sdk, pins) in [
            (Lang::Python, "app.py", "nyann_policy.py", "VERSION=0.25.1"),
            (
                Lang::Js,
                "policy.js",
                "nyann_policy.js",
                "QJS_VERSION=0.4.5",
            ),
        ] {
            let files = kit_files("slo-guard", lang);
            let app = file(&files, source);
            assert!(
                app.contains("\"slo-guard\"") || app.contains("'slo-guard'"),
                "{app}"
            );
            assert!(!app.contains(KIT_POLICY_NAME), "{app}");
            assert!(file(&files, sdk).contains("INTERFACE_VERSION"));
            assert!(file(&files, "build.sh").contains(pins));
            assert!(file(&files, "README.md").contains("Rules that bite"));
            let wit = file(&files, "wit/policy.wit");
            assert!(wit.contains(&format!(
                "package nyann:policy@{}.0;",
                nyann_policy_host::Interface::NEWEST.line()
            )));
            for (path, content) in &files {
                assert!(!content.contains("/work/"), "{path} points at a checkout");
                assert!(
                    !content.contains("../../"),
                    "{path} reaches outside the policy's directory"
                );
            }
        }
        let js = kit_files("slo-guard", Lang::Js);
        assert!(file(&js, "package.json").contains("\"componentize-qjs\": \"0.4.5\""));
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
