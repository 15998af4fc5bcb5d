//! Policies in Python and JavaScript, built from source with the real
//! toolchains (componentize-py 0.25.1; componentize-qjs 0.4.5, and
//! componentize-js 0.23.0 for StarlingMonkey): the `client-slo` example in
//! both languages judges as the Rust one (on the reference runs of a real
//! vLLM and on a sweep of the simulator), `policy new --lang python|js`
//! builds outside the repository and stops a sweep, and what the host makes
//! of a Python policy that raises, opens a socket, loops or hoards memory.
//!
//! `.ci/run` installs the tools (componentize-py with pip, the JavaScript
//! ones with npm into `$NYANN_JS_TOOLS`); with `CI` set the tests require
//! them, elsewhere a missing tool skips its tests with a message.
//!
//! Each component is built once per test process and its machine code
//! compiled once into a code cache the tests share (a Python component
//! takes ~20 s to build and 10-20 s to compile): a `OnceCell` per component.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tokio::sync::OnceCell;

use crate::support::{generate_with_env, nyann_bench, policy_wasm, serial, simulator, sweep};
use crate::sweep::LEVELS;

const COMPONENTIZE_PY: &str = "componentize-py 0.25.1";
const COMPONENTIZE_QJS: &str = "0.4.5";
const COMPONENTIZE_JS: &str = "0.23.0";

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where this process builds and caches (under the target directory).
fn work() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("polyglot")
}

/// The code cache and key the tests share: `NYANN_BENCH_CACHE_DIR`,
/// `XDG_STATE_HOME`.
pub(crate) fn cache_env() -> [(&'static str, PathBuf); 2] {
    [
        ("NYANN_BENCH_CACHE_DIR", work().join("cache")),
        ("XDG_STATE_HOME", work().join("state")),
    ]
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A missing toolchain: a failure with `CI` set, else a skip said once per test.
fn missing(what: &str, install: &str) -> bool {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} is not installed (CI must install it: {install}; .ci/run does)"
    );
    eprintln!("{what} is not installed: the test is skipped ({install})");
    false
}

/// componentize-py of the pinned version: `$COMPONENTIZE_PY` (as the
/// kit's build.sh reads it), else on PATH.
pub(crate) fn have_python_tools() -> bool {
    let tool = std::env::var_os("COMPONENTIZE_PY").unwrap_or_else(|| "componentize-py".into());
    let version = Command::new(tool).arg("--version").output();
    match version {
        Ok(out) if text(&out.stdout).trim() == COMPONENTIZE_PY => true,
        _ => missing(
            COMPONENTIZE_PY,
            "python3 -m pip install componentize-py==0.25.1",
        ),
    }
}

/// The version of npm package `package` under `$NYANN_JS_TOOLS/node_modules`.
fn js_tool_version(package: &str) -> Option<String> {
    let dir = std::env::var_os("NYANN_JS_TOOLS")?;
    let manifest = Path::new(&dir)
        .join("node_modules")
        .join(package)
        .join("package.json");
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(manifest).ok()?).ok()?;
    manifest["version"].as_str().map(str::to_string)
}

fn have_js_tools() -> bool {
    js_tool_version("componentize-qjs").as_deref() == Some(COMPONENTIZE_QJS)
        || missing(
            "componentize-qjs 0.4.5 in $NYANN_JS_TOOLS",
            "npm install --prefix DIR componentize-qjs@0.4.5 and set NYANN_JS_TOOLS=DIR",
        )
}

fn have_starlingmonkey_tools() -> bool {
    js_tool_version("@bytecodealliance/componentize-js").as_deref() == Some(COMPONENTIZE_JS)
        || missing(
            "@bytecodealliance/componentize-js 0.23.0 in $NYANN_JS_TOOLS",
            "npm install --prefix DIR @bytecodealliance/componentize-js@0.23.0 and set NYANN_JS_TOOLS=DIR",
        )
}

/// Run a build script as a policy author would (`ENGINE`, the tools, the
/// WIT as given); its failure is a test failure with its output.
fn build(script: &Path, args: &[&Path], env: &[(&str, &OsStr)]) {
    let out = Command::new(script)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} failed:\n{}{}",
        script.display(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// `nyann-bench ARGS` with the shared code cache: exit code, stdout, stderr.
async fn nyann(args: &[&OsStr]) -> (Option<i32>, String, String) {
    let out = nyann_bench()
        .args(args)
        .envs(cache_env())
        .output()
        .await
        .unwrap();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// A built component, its code compiled into the shared cache, and what
/// `policy check` said then.
pub(crate) struct Built {
    pub(crate) wasm: PathBuf,
    check: (Option<i32>, String, String),
}

/// Load `wasm` once with `policy check PARAMS` (compiling its code into
/// the shared cache: later loads read it).
async fn warmed(wasm: PathBuf, params: &[&str]) -> Built {
    let mut args: Vec<&OsStr> = vec!["policy".as_ref(), "check".as_ref(), wasm.as_os_str()];
    for p in params {
        args.extend(["--param".as_ref(), OsStr::new(p)]);
    }
    let check = nyann(&args).await;
    Built { wasm, check }
}

/// A fresh directory under [`work`].
fn fresh(name: &str) -> PathBuf {
    let dir = work().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn wit_env() -> (&'static str, std::ffi::OsString) {
    ("WIT_DIR", repo().join("wit/0.5").into_os_string())
}

/// The Python client-slo example (examples/policies/client-slo/python).
pub(crate) async fn python_client_slo() -> &'static Built {
    static BUILT: OnceCell<Built> = OnceCell::const_new();
    BUILT
        .get_or_init(|| async {
            let wasm = fresh("py-client-slo").join("client_slo.wasm");
            let script = repo().join("examples/policies/client-slo/python/build.sh");
            let build_wasm = wasm.clone();
            tokio::task::spawn_blocking(move || build(&script, &[&build_wasm], &[]))
                .await
                .unwrap();
            warmed(wasm, &["ttft_p99=1s"]).await
        })
        .await
}

/// The JavaScript client-slo example, with `engine` (quickjs, starlingmonkey).
async fn js_client_slo(engine: &'static str) -> &'static Built {
    static QUICKJS: OnceCell<Built> = OnceCell::const_new();
    static STARLINGMONKEY: OnceCell<Built> = OnceCell::const_new();
    let cell = if engine == "quickjs" {
        &QUICKJS
    } else {
        &STARLINGMONKEY
    };
    cell.get_or_init(|| async move {
        let wasm = fresh(&format!("js-client-slo-{engine}")).join("client_slo.wasm");
        let script = repo().join("examples/policies/client-slo/js/build.sh");
        let build_wasm = wasm.clone();
        tokio::task::spawn_blocking(move || {
            build(&script, &[&build_wasm], &[("ENGINE", OsStr::new(engine))])
        })
        .await
        .unwrap();
        warmed(wasm, &["ttft_p99=1s"]).await
    })
    .await
}

/// `policy new NAME --lang LANG` in a directory of its own, built with its
/// own build.sh (its own WIT), as an author outside the repository would.
async fn scaffolded(lang: &'static str) -> &'static Built {
    static PYTHON: OnceCell<Built> = OnceCell::const_new();
    static JS: OnceCell<Built> = OnceCell::const_new();
    let cell = if lang == "python" { &PYTHON } else { &JS };
    cell.get_or_init(|| async move {
        let dir = fresh(&format!("scaffold-{lang}"));
        let name = format!("{lang}-guard");
        let out = nyann_bench()
            .current_dir(&dir)
            .args(["policy", "new", &name, "--lang", lang])
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains(&format!("build it:   cd {name} && ./build.sh")),
            "{}",
            text(&out.stdout)
        );
        let policy = dir.join(&name);
        let script = policy.join("build.sh");
        if lang == "python" {
            let tests = script.clone();
            let out = tokio::task::spawn_blocking(move || {
                Command::new(&tests).arg("test").output().unwrap()
            })
            .await
            .unwrap();
            assert!(out.status.success(), "{}", text(&out.stderr));
            assert!(text(&out.stderr).contains("OK"), "{}", text(&out.stderr));
        }
        tokio::task::spawn_blocking(move || build(&script, &[], &[]))
            .await
            .unwrap();
        warmed(policy.join("policy.wasm"), &["ttft_p99=1s"]).await
    })
    .await
}

/// The Python policy that misbehaves on request (tests/e2e/polyglot/hostile.py).
async fn python_hostile() -> &'static Built {
    static BUILT: OnceCell<Built> = OnceCell::const_new();
    BUILT
        .get_or_init(|| async {
            let dir = fresh("py-hostile");
            std::fs::copy(
                repo().join("tests/e2e/polyglot/hostile.py"),
                dir.join("hostile.py"),
            )
            .unwrap();
            let wasm = dir.join("hostile.wasm");
            let script = repo().join("policies/sdk-python/build.sh");
            let (app, out) = (dir.join("hostile.py"), wasm.clone());
            let (key, wit) = wit_env();
            tokio::task::spawn_blocking(move || build(&script, &[&app, &out], &[(key, &wit)]))
                .await
                .unwrap();
            warmed(wasm, &[]).await
        })
        .await
}

/// `policy replay POLICY --run DIR --json --param ...`: the replayed
/// verdicts (or errors), stage by stage.
async fn replayed(policy: &Path, run: &Path, params: &[String]) -> Vec<Value> {
    let mut args: Vec<&OsStr> = vec![
        "policy".as_ref(),
        "replay".as_ref(),
        policy.as_os_str(),
        "--run".as_ref(),
        run.as_os_str(),
        "--json".as_ref(),
    ];
    for p in params {
        args.extend(["--param".as_ref(), OsStr::new(p)]);
    }
    let (code, stdout, stderr) = nyann(&args).await;
    assert_eq!(code, Some(0), "{}: {stderr}", policy.display());
    let stages: Value = serde_json::from_str(&stdout).unwrap();
    stages
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["replayed"].clone())
        .collect()
}

/// The Rust client-slo example's component.
fn rust_client_slo() -> PathBuf {
    policy_wasm("client-slo-policy")
}

/// Parameter sets over the reference runs of a real vLLM: kv-A's client
/// TTFT p99 is 0.11, 0.30 and 0.12 s, queueing-B's grows to 1.7 s.
fn reference_cases() -> Vec<(&'static str, Vec<String>)> {
    let p = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        ("kv-A", p(&["ttft_p99=0.2"])),
        ("kv-A", p(&["ttft_p99=0.1", "consecutive=2"])),
        ("kv-A", p(&["ttft_p99=250ms", "max_error_rate=0"])),
        ("queueing-B", p(&["ttft_p99=1s"])),
        ("queueing-B", p(&["ttft_p99=0.5", "consecutive=2"])),
        ("queueing-B", p(&["ttft_p99=0.3", "consecutive=3"])),
    ]
}

/// `built` checks, replays the reference runs to the Rust example's
/// verdicts (reasons and all), and stops a sweep of the simulator where
/// the Rust example, replaying that run, says it should.
async fn judges_as_the_rust_client_slo(built: &Built) {
    let (code, stdout, stderr) = &built.check;
    assert_eq!(*code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("client-slo 0.1.0"), "{stdout}");
    assert!(stdout.contains("interface: nyann:policy@0.5"), "{stdout}");
    assert!(
        stdout.contains("ttft_p99        duration  required"),
        "{stdout}"
    );
    assert!(stdout.contains("check passed"), "{stdout}");
    // The log line of its judge, shown under the call.
    assert!(stdout.contains("| [debug] judging #1 c=128"), "{stdout}");

    let rust = rust_client_slo();
    let (mut congested, mut ok) = (0, 0);
    for (run, params) in reference_cases() {
        let dir = repo().join("reference/vllm-cpu-runs").join(run);
        let want = replayed(&rust, &dir, &params).await;
        let got = replayed(&built.wasm, &dir, &params).await;
        assert_eq!(got, want, "{run} {params:?}: {}", built.wasm.display());
        for verdict in &want {
            match verdict["verdict"]["congested"].as_bool() {
                Some(true) => congested += 1,
                Some(false) => ok += 1,
                None => panic!("{run} {params:?}: {verdict}"),
            }
        }
    }
    assert!(congested >= 3 && ok >= 3, "{congested} congested, {ok} ok");

    // A sweep (client TTFT p99 ~50 ms at c=8, ~400 ms at c=16): it runs
    // without a signal source (client figures only) and stops at c=16;
    // the Rust example, replaying the run, gives the same verdicts.
    let _serial = serial().await;
    let sim = simulator(false).await;
    let args = vec!["--policy".to_string(), built.wasm.display().to_string()];
    let env = cache_env();
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let run = generate_with_env(
        &sim.base_url(),
        &sweep(&LEVELS, r#"ttft_p99="200ms""#),
        &args,
        &env,
    )
    .await;
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    assert_eq!(run.congestion(2)["policy"]["name"], "client-slo");
    drop(sim);
    let rust_verdicts = replayed(&rust, run.dir(), &[]).await;
    for (i, verdict) in rust_verdicts.iter().enumerate() {
        assert_eq!(
            verdict["verdict"],
            run.congestion(i)["verdict"],
            "stage {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_slo_judges_as_the_rust_one() {
    if !have_python_tools() {
        return;
    }
    let built = python_client_slo().await;
    // A default componentize-py build: its runtime's socket imports are
    // there (linked as traps), not stubbed away.
    let bytes = std::fs::read(&built.wasm).unwrap();
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(has(b"wasi:sockets/tcp@0.2"), "not a default build");
    judges_as_the_rust_client_slo(built).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_client_slo_judges_as_the_rust_one() {
    if !have_js_tools() {
        return;
    }
    judges_as_the_rust_client_slo(js_client_slo("quickjs").await).await;
}

/// The same source under StarlingMonkey: the SDK hides the engines'
/// differences (BigInt counts, `undefined` options, thrown errors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_client_slo_judges_the_same_under_starlingmonkey() {
    if !have_starlingmonkey_tools() {
        return;
    }
    let built = js_client_slo("starlingmonkey").await;
    let (code, stdout, stderr) = &built.check;
    assert_eq!(*code, Some(0), "{stdout}{stderr}");
    let rust = rust_client_slo();
    for (run, params) in reference_cases() {
        let dir = repo().join("reference/vllm-cpu-runs").join(run);
        assert_eq!(
            replayed(&built.wasm, &dir, &params).await,
            replayed(&rust, &dir, &params).await,
            "{run} {params:?}"
        );
    }
    // An invalid integer parameter is the policy's own error under both.
    let (code, stdout, _) = nyann(&[
        "policy".as_ref(),
        "check".as_ref(),
        built.wasm.as_os_str(),
        "--param".as_ref(),
        "ttft_p99=1s".as_ref(),
        "--param".as_ref(),
        "consecutive=0".as_ref(),
    ])
    .await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("consecutive must be from 1 to 100 (got 0)"),
        "{stdout}"
    );
}

/// `policy new --lang python|js`: built outside the repository with its own
/// WIT and pinned tools, it checks, replays as the Rust client-slo (same
/// rule, same default error rate: the same congested stages) and stops a
/// sweep at c=16.
async fn scaffold_works(lang: &'static str) {
    let built = scaffolded(lang).await;
    let (code, stdout, stderr) = &built.check;
    assert_eq!(*code, Some(0), "{stdout}{stderr}");
    let name = format!("{lang}-guard");
    assert!(stdout.contains(&format!("{name} 0.1.0")), "{stdout}");
    assert!(stdout.contains("check passed"), "{stdout}");

    let rust = rust_client_slo();
    for (run, params) in reference_cases().into_iter().filter(|(_, p)| p.len() == 1) {
        let dir = repo().join("reference/vllm-cpu-runs").join(run);
        let want = replayed(&rust, &dir, &params).await;
        let got = replayed(&built.wasm, &dir, &params).await;
        let flags = |v: &[Value]| -> Vec<Value> {
            v.iter()
                .map(|s| s["verdict"]["congested"].clone())
                .collect()
        };
        assert_eq!(flags(&got), flags(&want), "{run} {params:?}");
    }

    let _serial = serial().await;
    let sim = simulator(false).await;
    let args = vec!["--policy".to_string(), built.wasm.display().to_string()];
    let env = cache_env();
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let run = generate_with_env(
        &sim.base_url(),
        &sweep(&LEVELS, r#"ttft_p99="200ms""#),
        &args,
        &env,
    )
    .await;
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    assert_eq!(run.congestion(2)["policy"]["name"], name.as_str());
    let reasons = run.congestion(2)["verdict"]["reasons"].to_string();
    assert!(reasons.contains("client TTFT p99 "), "{reasons}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_python_policy_builds_outside_the_repository_and_stops_a_sweep() {
    if have_python_tools() {
        scaffold_works("python").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_javascript_policy_builds_outside_the_repository_and_stops_a_sweep() {
    if have_js_tools() {
        scaffold_works("js").await;
    }
}

/// `policy check` of the hostile Python policy in `mode` with `fuel` per
/// judgment: exit code, stdout and stderr.
async fn hostile_check(mode: &str, fuel: u64) -> (Option<i32>, String) {
    let built = python_hostile().await;
    let mode = format!("mode={mode}");
    let fuel = fuel.to_string();
    let (code, stdout, stderr) = nyann(&[
        "policy".as_ref(),
        "check".as_ref(),
        built.wasm.as_os_str(),
        "--policy-fuel".as_ref(),
        fuel.as_ref(),
        "--param".as_ref(),
        mode.as_ref(),
    ])
    .await;
    (code, format!("{stdout}{stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_policy_that_misbehaves_is_reported_clearly() {
    if !have_python_tools() {
        return;
    }
    // Harmless: it checks, and its print shows under the call.
    let (code, out) = hostile_check("ok", 50_000_000).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("  stdout:\n    | judging #0 c=64 in mode ok"),
        "{out}"
    );
    assert!(out.contains("check passed"), "{out}");

    // An exception: where it was raised, and the whole traceback.
    let (code, out) = hostile_check("raise", 50_000_000).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(
            "FAILED: policy py-hostile: raised ValueError: judge exploded on purpose \
             (hostile.py, line 13, in nested) at stage 0"
        ),
        "{out}"
    );
    assert!(
        out.contains("    | Traceback (most recent call last):"),
        "{out}"
    );
    assert!(out.contains("in judge\n"), "{out}");

    // A socket: the runtime's import is linked to fail, and says so.
    let (code, out) = hostile_check("socket", 50_000_000).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("FAILED: policy py-hostile: called wasi:sockets/"),
        "{out}"
    );
    assert!(out.contains(", which policies may not use"), "{out}");

    // A loop: out of fuel (a tenth of the default, to stop sooner; a
    // judgment of this policy takes well under a million).
    let (code, out) = hostile_check("loop", 50_000_000).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("used up its fuel budget of 50,000,000 instructions"),
        "{out}"
    );

    // A hoard: the memory cap (before the default fuel runs out: filling
    // 64 MiB takes about 40 million).
    let (code, out) = hostile_check("alloc", 500_000_000).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("hit its memory cap of 64 MiB"), "{out}");

    // Its own error: the message, as it said it.
    let (code, out) = hostile_check("err", 50_000_000).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("no verdict today"), "{out}");
}
