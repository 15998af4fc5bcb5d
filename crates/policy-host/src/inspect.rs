//! Load-time checks of a policy's bytes, read from the binary's sections
//! before anything is compiled: a bad file is refused with a message saying
//! what it is and what to do, and a component that imports a forbidden
//! interface or defines too many memories never reaches the compiler (nor
//! the compiled-code cache).

use wasmtime::Engine;
use wasmtime::wasmparser::{Parser, Payload};

use crate::sandbox::{MAX_MEMORIES, TABLE_ELEMENT_BYTES};
use crate::versions::{Interface, PACKAGE, supported_versions};

/// Interfaces a policy may import: the contract's own, and the WASI 0.2
/// interfaces a Rust wasm32-wasip2 `std` links, granted over an empty
/// context (no files, environment, arguments; stdin closed; virtual clocks).
/// Anything else is refused, except the interfaces in [`TRAPPED_IMPORTS`].
/// `sandbox::linker` links exactly these.
const ALLOWED_IMPORTS: &[(&str, &[&str])] = &[
    (PACKAGE, &["types", "host"]),
    (
        "wasi:cli",
        &[
            "environment",
            "exit",
            "stdin",
            "stdout",
            "stderr",
            "terminal-input",
            "terminal-output",
            "terminal-stdin",
            "terminal-stdout",
            "terminal-stderr",
        ],
    ),
    ("wasi:io", &["error", "streams", "poll"]),
    ("wasi:clocks", &["wall-clock", "monotonic-clock"]),
    ("wasi:filesystem", &["types", "preopens"]),
    ("wasi:random", &["random", "insecure", "insecure-seed"]),
];

/// Interfaces the runtimes of interpreted languages import and a policy
/// never needs: componentize-py's CPython links wasi-libc's sockets (its
/// `socket` module is not built), StarlingMonkey (componentize-js) links
/// `fetch`'s HTTP client. They are accepted at load and linked as
/// functions that trap when called: a call fails naming the interface
/// (`CallFailure::Forbidden`), and nothing of the network is reachable.
const TRAPPED_IMPORTS: &[(&str, &[&str])] = &[
    (
        "wasi:sockets",
        &[
            "network",
            "instance-network",
            "tcp",
            "tcp-create-socket",
            "udp",
            "udp-create-socket",
            "ip-name-lookup",
        ],
    ),
    ("wasi:http", &["types", "outgoing-handler"]),
];

/// How much code a policy may ask the host to compile: compiling costs
/// time and memory per function and per byte of code (900,000 empty
/// functions took 2 minutes and 4 GB), so both are counted from the binary
/// before anything is compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeLimits {
    /// Functions defined by all the component's core modules.
    pub max_functions: u64,
    /// Bytes of their code sections together.
    pub max_code_bytes: u64,
    /// Bytes of the largest function body: compiling one function costs
    /// more than in proportion to its size (a straight-line function of
    /// 7 MB took 9 s and over 400 MB alone), so no function may be large.
    pub max_function_bytes: u64,
}

/// What the checks found out about a component.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Inspected {
    /// The interface line it implements.
    pub interface: Interface,
    /// The newest `nyann:policy` version it names (in an export or import),
    /// e.g. `0.2.1`: what it was built for.
    pub built_for: String,
    /// It imports interfaces of [`TRAPPED_IMPORTS`]: they are to be linked
    /// as traps.
    pub traps: bool,
    /// Bytes of code its core modules define (what compiling costs).
    pub code_bytes: u64,
}

/// The toolchain that built a component, told from the names its runtime
/// leaves in the binary: it picks the advice of a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Toolchain {
    /// componentize-py (CPython).
    Python,
    /// jco's QuickJS backend (componentize-qjs).
    QuickJs,
    /// componentize-js (StarlingMonkey).
    StarlingMonkey,
    /// rustc (wasm32-wasip2), with or without the SDK.
    Rust,
    Unknown,
}

impl Toolchain {
    /// Told from the names in `bytes` (runtime symbols and the producers
    /// section). QuickJS components carry some StarlingMonkey names too, so
    /// they are told first. A scan of the whole binary: for messages only.
    pub(crate) fn of(bytes: &[u8]) -> Toolchain {
        let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        if has(b"componentize_qjs_runtime") {
            Toolchain::QuickJs
        } else if has(b"componentize_py_runtime") {
            Toolchain::Python
        } else if has(b"ComponentizeJS") {
            Toolchain::StarlingMonkey
        } else if has(b"rustc") {
            Toolchain::Rust
        } else {
            Toolchain::Unknown
        }
    }

    /// What to do about an import policies may not use.
    fn import_fix(self) -> &'static str {
        match self {
            Toolchain::Python => {
                "build it with componentize-py 0.25 against the policy's WIT and world \
                 `congestion-policy` (the `build.sh` of `nyann-bench policy new --lang python` \
                 does), and import no Python package that needs it"
            }
            Toolchain::QuickJs | Toolchain::StarlingMonkey => {
                "build it against the policy's WIT and world `congestion-policy` with \
                 `jco componentize --backend qjs --backend-qjs-disable-async`, or \
                 componentize-js with `-d http fetch-event` (the `build.sh` of \
                 `nyann-bench policy new --lang js` does), and import no module that needs it"
            }
            Toolchain::Rust | Toolchain::Unknown => {
                "build it with `cargo build --release --target wasm32-wasip2` and the \
                 nyann-policy SDK (`nyann-bench policy new`), and drop the dependency that \
                 imports it"
            }
        }
    }
}

/// Check a policy's bytes and return the interface line it implements.
pub(crate) fn inspect(
    bytes: &[u8],
    limits: CodeLimits,
    memory_cap: usize,
) -> Result<Inspected, String> {
    check_header(bytes)?;
    let sections = read_sections(bytes)?;
    if let Some(prerelease) = sections
        .imports
        .iter()
        .chain(&sections.exports)
        .filter_map(|n| nyann_version(n))
        .find(|v| v.contains(['-', '+']))
    {
        return Err(format!(
            "is built for {PACKAGE}@{prerelease}, a pre-release of the interface; this host runs \
             the released {} (rebuild the policy against a released WIT, e.g. the one \
             `nyann-bench policy wit` prints)",
            supported_versions()
        ));
    }
    let interface = exported_interface(&sections.exports)?;
    if sections.functions > limits.max_functions {
        return Err(format!(
            "defines {} functions; policies may define at most {} (compiling costs time and \
             memory per function; a Rust policy has a few hundred, a Python one about 13,000)",
            sections.functions, limits.max_functions
        ));
    }
    if sections.code_bytes > limits.max_code_bytes {
        return Err(format!(
            "has {} of code; policies may have at most {} (compiling costs time and memory \
             per byte of code; a Rust policy has well under 1 MiB, a Python one about 6 MiB)",
            crate::error::human_size(sections.code_bytes),
            crate::error::human_size(limits.max_code_bytes)
        ));
    }
    if sections.largest_function > limits.max_function_bytes {
        return Err(format!(
            "has a function of {} of code; a policy's functions may have at most {} each \
             (compiling a function costs more than in proportion to its size; the largest \
             function of a Python policy, CPython's interpreter loop, has 417 KiB)",
            crate::error::human_size(sections.largest_function),
            crate::error::human_size(limits.max_function_bytes)
        ));
    }
    if let Some(name) = sections
        .imports
        .iter()
        .find(|n| !import_allowed(n) && !import_trapped(n))
    {
        return Err(format!(
            "imports `{name}`, which policies may not use (allowed: {PACKAGE}/host, and the \
             wasi:cli, wasi:io, wasi:clocks, wasi:filesystem and wasi:random 0.2 interfaces \
             over an empty context; the wasi:sockets and wasi:http client interfaces of \
             language runtimes only as functions that fail when called); {}",
            Toolchain::of(bytes).import_fix()
        ));
    }
    if sections.memories > MAX_MEMORIES {
        return Err(format!(
            "defines {} linear memories; policies may define at most {MAX_MEMORIES} (a policy \
             built by a Rust, JavaScript or Python toolchain has one)",
            sections.memories
        ));
    }
    // Memories and tables start at their minimum sizes, all against one
    // cap (table elements at 8 bytes each, as the limiter counts them).
    let initial = sections
        .memory_pages
        .saturating_mul(64 << 10)
        .saturating_add(sections.table_elements.saturating_mul(TABLE_ELEMENT_BYTES));
    if initial > memory_cap as u64 {
        return Err(format!(
            "declares linear memories and tables that start at {} together, over its memory cap \
             of {} (for all its memories and tables)",
            crate::error::human_size(initial),
            crate::error::human_bytes(memory_cap)
        ));
    }
    let built_for = sections
        .imports
        .iter()
        .chain(&sections.exports)
        .filter_map(|n| nyann_version(n))
        .max_by_key(|v| semver(v))
        .unwrap_or_default()
        .to_string();
    Ok(Inspected {
        interface,
        built_for,
        traps: sections.imports.iter().any(|n| import_trapped(n)),
        code_bytes: sections.code_bytes,
    })
}

/// The version of a `nyann:policy/...@VERSION` name.
fn nyann_version(name: &str) -> Option<&str> {
    let (path, version) = name.split_once('@')?;
    path.starts_with(&format!("{PACKAGE}/")).then_some(version)
}

/// `0.2.1` as numbers, for ordering (missing or odd parts read 0).
pub(crate) fn semver(version: &str) -> (u64, u64, u64) {
    let mut parts = version
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

/// Refuse anything that is not a WebAssembly component, saying what it is.
fn check_header(bytes: &[u8]) -> Result<(), String> {
    const MAGIC: &[u8] = b"\0asm";
    if Engine::detect_precompiled(bytes).is_some() {
        return Err(
            "is precompiled wasmtime code, not a component; give the .wasm file instead".into(),
        );
    }
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err(
            "is not a WebAssembly component (no \\0asm header); give the .wasm file built with \
             `cargo build --release --target wasm32-wasip2`"
                .into(),
        );
    }
    // Bytes 4..8: version and layer. Core modules are layer 0, components layer 1.
    match bytes[6..8] {
        [0, 0] => Err("is a core WebAssembly module, not a component; build the policy with \
             `--target wasm32-wasip2` (the nyann-policy SDK does), or wrap it with `wasm-tools component new`"
            .into()),
        [1, 0] => Ok(()),
        _ => Err("is a WebAssembly binary of an unknown layer, not a component".into()),
    }
}

/// What the load-time checks need from the binary.
struct Sections {
    /// Names the component itself imports and exports (not its nested
    /// components' and modules').
    imports: Vec<String>,
    exports: Vec<String>,
    /// Linear memories defined by all its core modules.
    memories: usize,
    /// Functions defined by all its core modules, their code's bytes, and
    /// the largest function body's.
    functions: u64,
    code_bytes: u64,
    largest_function: u64,
    /// The minimum sizes of the memories (pages) and tables (elements) its
    /// core modules define, summed.
    memory_pages: u64,
    table_elements: u64,
}

fn read_sections(bytes: &[u8]) -> Result<Sections, String> {
    let mut sections = Sections {
        imports: Vec::new(),
        exports: Vec::new(),
        memories: 0,
        functions: 0,
        code_bytes: 0,
        largest_function: 0,
        memory_pages: 0,
        table_elements: 0,
    };
    // The parser walks nested modules and components in line; `depth` is
    // 0 in the outer component's own sections.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("is not a valid component: {e}"))?;
        match payload {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    let import = import.map_err(|e| format!("is not a valid component: {e}"))?;
                    sections.imports.push(import.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    let export = export.map_err(|e| format!("is not a valid component: {e}"))?;
                    sections.exports.push(export.name.name.to_string());
                }
            }
            Payload::MemorySection(reader) => {
                sections.memories += usize::try_from(reader.count()).unwrap_or(usize::MAX);
                for memory in reader {
                    let memory = memory.map_err(|e| format!("is not a valid component: {e}"))?;
                    sections.memory_pages = sections.memory_pages.saturating_add(memory.initial);
                }
            }
            Payload::TableSection(reader) => {
                for table in reader {
                    let table = table.map_err(|e| format!("is not a valid component: {e}"))?;
                    sections.table_elements =
                        sections.table_elements.saturating_add(table.ty.initial);
                }
            }
            Payload::CodeSectionEntry(body) => {
                let size = body.range().len() as u64;
                sections.largest_function = sections.largest_function.max(size);
            }
            Payload::FunctionSection(reader) => {
                sections.functions += u64::from(reader.count());
            }
            Payload::CodeSectionStart { size, .. } => {
                sections.code_bytes += u64::from(size);
            }
            _ => {}
        }
    }
    Ok(sections)
}

/// The newest supported line among the component's `policy` exports.
fn exported_interface(exports: &[String]) -> Result<Interface, String> {
    let prefix = format!("{PACKAGE}/policy");
    let policy_exports: Vec<&String> = exports
        .iter()
        .filter(|n| n.split('@').next() == Some(prefix.as_str()))
        .collect();
    if policy_exports.is_empty() {
        let shown = if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        };
        return Err(format!(
            "does not export {prefix} (it exports {shown}); is it a congestion policy? \
             This host supports {}",
            supported_versions()
        ));
    }
    if let Some(interface) = policy_exports
        .iter()
        .filter_map(|n| Interface::of_name(n))
        .max()
    {
        return Ok(interface);
    }
    let version = policy_exports[0].split_once('@').map(|(_, v)| v);
    let shown = match version {
        Some(v) if !v.is_empty() => format!("{PACKAGE}@{v}"),
        _ => "an unversioned interface".to_string(),
    };
    let newer =
        version.is_some_and(|v| semver(v) > semver(&format!("{}.0", Interface::NEWEST.line())));
    let fix = if newer {
        "a newer nyann-bench is needed, or rebuild the policy against the WIT printed by \
         `nyann-bench policy wit`"
    } else {
        "rebuild the policy against the WIT printed by `nyann-bench policy wit`"
    };
    Err(format!(
        "is built for {shown}; this host supports {} ({fix})",
        supported_versions()
    ))
}

fn import_allowed(name: &str) -> bool {
    import_in(name, ALLOWED_IMPORTS)
}

/// An import linked as functions that trap ([`TRAPPED_IMPORTS`]).
pub(crate) fn import_trapped(name: &str) -> bool {
    import_in(name, TRAPPED_IMPORTS)
}

fn import_in(name: &str, list: &[(&str, &[&str])]) -> bool {
    let (path, version) = name.split_once('@').unwrap_or((name, ""));
    let Some((package, interface)) = path.split_once('/') else {
        return false;
    };
    let version_ok = if package == PACKAGE {
        Interface::of_version(version).is_some()
    } else {
        version.starts_with("0.2.")
    };
    version_ok
        && list
            .iter()
            .any(|(p, interfaces)| *p == package && interfaces.contains(&interface))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports() {
        assert!(import_allowed("wasi:cli/environment@0.2.3"));
        assert!(import_allowed("wasi:io/streams@0.2.0"));
        assert!(import_allowed("nyann:policy/host@0.1.0"));
        assert!(import_allowed("nyann:policy/host@0.2.0"));
        assert!(import_allowed("nyann:policy/host@0.3.0"));
        assert!(import_allowed("nyann:policy/host@0.4.0"));
        assert!(import_allowed("nyann:policy/host@0.5.0"));
        assert!(!import_allowed("nyann:policy/host@0.6.0"));
        assert!(!import_allowed("wasi:sockets/tcp@0.2.3"));
        assert!(!import_allowed("wasi:http/outgoing-handler@0.2.3"));
        // The runtimes' unused clients: linked as traps.
        assert!(import_trapped("wasi:sockets/tcp@0.2.9"));
        assert!(import_trapped("wasi:sockets/ip-name-lookup@0.2.0"));
        assert!(import_trapped("wasi:http/outgoing-handler@0.2.10"));
        assert!(import_trapped("wasi:http/types@0.2.10"));
        assert!(!import_trapped("wasi:http/incoming-handler@0.2.10"));
        assert!(!import_trapped("wasi:sockets/tcp@0.3.0"));
        assert!(!import_trapped("wasi:cli/environment@0.2.3"));
        assert!(!import_allowed("wasi:cli/environment@0.3.0"));
        assert!(!import_allowed("evil"));
    }

    /// A refused import's advice is for the toolchain that built the
    /// component, told from its runtime's names.
    #[test]
    fn the_toolchain_is_told_from_the_runtime_names() {
        let of = |text: &str| Toolchain::of(text.as_bytes());
        // QuickJS components carry StarlingMonkey's names too.
        assert_eq!(of("x componentize_py_runtime rustc y"), Toolchain::Python);
        assert_eq!(
            of("ComponentizeJS componentize_qjs_runtime rustc"),
            Toolchain::QuickJs
        );
        assert_eq!(of("ComponentizeJS rustc"), Toolchain::StarlingMonkey);
        assert_eq!(of("rustc 1.95"), Toolchain::Rust);
        assert_eq!(of("tinygo"), Toolchain::Unknown);
        assert!(Toolchain::Python.import_fix().contains("--lang python"));
        assert!(
            Toolchain::QuickJs
                .import_fix()
                .contains("--backend-qjs-disable-async")
        );
        assert!(
            Toolchain::StarlingMonkey
                .import_fix()
                .contains("-d http fetch-event")
        );
        assert!(Toolchain::Rust.import_fix().contains("wasm32-wasip2"));
    }

    #[test]
    fn exports_pick_the_newest_supported_line() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            exported_interface(&names(&["nyann:policy/policy@0.1.0"])),
            Ok(Interface::V0_1)
        );
        assert_eq!(
            exported_interface(&names(&[
                "nyann:policy/policy@0.1.0",
                "nyann:policy/policy@0.2.1"
            ])),
            Ok(Interface::V0_2)
        );
        let newer = exported_interface(&names(&["nyann:policy/policy@0.9.0"])).unwrap_err();
        assert!(
            newer.starts_with("is built for nyann:policy@0.9.0; this host supports")
                && newer.contains("a newer nyann-bench is needed"),
            "{newer}"
        );
        let older = exported_interface(&names(&["nyann:policy/policy@0.0.3"])).unwrap_err();
        assert!(!older.contains("newer nyann-bench"), "{older}");
        assert_eq!(semver("0.2.1-rc.1"), (0, 2, 1));
        assert!(semver("0.10.0") > semver("0.9.7"));
        assert!(
            exported_interface(&names(&["nyann:policy/policy-extra@0.2.0"]))
                .unwrap_err()
                .starts_with("does not export nyann:policy/policy")
        );
    }

    #[test]
    fn headers() {
        assert!(check_header(b"\0asm\x0d\x00\x01\x00").is_ok());
        assert!(
            check_header(b"\0asm\x01\x00\x00\x00")
                .unwrap_err()
                .contains("core WebAssembly module")
        );
        assert!(
            check_header(b"hello world")
                .unwrap_err()
                .contains("not a WebAssembly component")
        );
        assert!(check_header(b"").is_err());
    }
}
