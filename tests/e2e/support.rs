//! What every end-to-end test needs: the binary, an in-process simulator,
//! scenario files, a `generate` run and its results, the guest policies.

use std::path::PathBuf;
use std::process::Output;

use nyann_sim::{RunningSim, SimConfig};
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::{Mutex, MutexGuard};

/// The binary under test, built with the test's own profile.
pub fn nyann_bench() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_nyann-bench"));
    command.kill_on_drop(true);
    command
}

/// One sweep at a time (the simulator's timing needs the CPU).
pub async fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::const_new(());
    SERIAL.lock().await
}

/// The simulator (default profile, seed 1) on ephemeral loopback ports.
pub async fn simulator(disaggregated: bool) -> RunningSim {
    nyann_sim::start(SimConfig {
        seed: 1,
        disaggregated,
        ..SimConfig::default()
    })
    .await
    .expect("the simulator starts")
}

/// `1, 2, 4`: concurrencies as a Starlark list's items.
pub fn starlark_list(concurrencies: &[u32]) -> String {
    concurrencies
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A sweep of 3-second stages at the given concurrencies, stopped by
/// `until_congested` with `params` (Starlark keyword arguments).
pub fn sweep(concurrencies: &[u32], params: &str) -> String {
    let levels = starlark_list(concurrencies);
    format!(
        "scenario(\n    workload = workload(\"faker\", isl=128, osl=256),\n    stages = until_congested(\n        \
         [stage(\"3s\", concurrency=c) for c in [{levels}]],\n        {params},\n    ),\n)\n"
    )
}

/// A finished `nyann-bench generate` run.
pub struct Run {
    pub output: Output,
    /// `summary.json` from the output directory.
    pub summary: Value,
    dir: TempDir,
}

impl Run {
    pub fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    /// The output directory (stages.json, requests.jsonl, summary.json).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    pub fn stages(&self) -> &Vec<Value> {
        self.summary["stages"]
            .as_array()
            .expect("summary.stages is a list")
    }

    pub fn stage(&self, index: usize) -> &Value {
        &self.stages()[index]
    }

    /// The congestion record of a judged stage.
    pub fn congestion(&self, index: usize) -> &Value {
        &self.stage(index)["annotation"]["congestion"]
    }

    pub fn status(&self, index: usize) -> &str {
        self.stage(index)["status"].as_str().unwrap_or("?")
    }

    pub fn congested(&self, index: usize) -> bool {
        self.congestion(index)["verdict"]["congested"] == Value::Bool(true)
    }

    /// Where the sweep stopped, if it did.
    pub fn stopped_at(&self) -> Option<u64> {
        let outcome = &self.summary["outcome"];
        (outcome["kind"] == "stopped")
            .then(|| outcome["stage"].as_u64())
            .flatten()
    }
}

/// Run `generate --config <scenario> --output-dir <tmp> --target <sim> ARGS`.
pub async fn generate(sim: &RunningSim, scenario: &str, args: &[String]) -> Run {
    generate_at(&sim.base_url(), scenario, args).await
}

/// Run `generate --config <scenario> --output-dir <tmp> --target <target> ARGS`.
pub async fn generate_at(target: &str, scenario: &str, args: &[String]) -> Run {
    generate_with_env(target, scenario, args, &[]).await
}

/// [`generate_at`] with these environment variables set.
pub async fn generate_with_env(
    target: &str,
    scenario: &str,
    args: &[String],
    env: &[(&str, &std::ffi::OsStr)],
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scenario.star");
    std::fs::write(&config, scenario).unwrap();
    let output = nyann_bench()
        .envs(env.iter().copied())
        .arg("generate")
        .arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(dir.path())
        .args(["--target", target, "--seed", "1"])
        .args(args)
        .output()
        .await
        .unwrap();
    let summary = std::fs::read_to_string(dir.path().join("summary.json")).unwrap_or_else(|e| {
        panic!(
            "no summary.json ({e}); exit {:?}, stderr:\n{}",
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    Run {
        summary: serde_json::from_str(&summary).unwrap(),
        output,
        dir,
    }
}

/// Run `generate` with `extra` flags (and `--scrape` flags for the
/// simulator if `scrape`) on a scenario that must be refused before any
/// load: its stderr, after checking the exit status and that the simulator
/// saw nothing.
pub async fn refused(scenario: &str, scrape: bool, extra: &[&str]) -> String {
    let sim = simulator(false).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.star");
    std::fs::write(&config, scenario).unwrap();
    let mut command = nyann_bench();
    command
        .args(["generate", "--config"])
        .arg(&config)
        .args(["--target", &sim.base_url()]);
    if scrape {
        command.args(scrape_flags(&sim));
    }
    command.args(extra);
    let out = command.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        sim.requests().is_empty(),
        "no request may be sent: {stderr}"
    );
    stderr
}

/// The body of `GET http://ADDR/PATH` (HTTP/1.0: the server closes when done).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_string()
}

/// `--scrape ROLE=URL` flags for every metrics endpoint of the simulator.
pub fn scrape_flags(sim: &RunningSim) -> Vec<String> {
    sim.metrics_endpoints()
        .into_iter()
        .flat_map(|(role, addr)| {
            [
                "--scrape".to_string(),
                format!("{role}=http://{addr}/metrics"),
            ]
        })
        .collect()
}

/// Build a guest policy package (an example policy of this workspace, or one
/// of the policy host's test guests) for wasm32-wasip2 and return its `.wasm`.
pub fn policy_wasm(package: &str) -> PathBuf {
    const TEST_GUESTS: [&str; 3] = [
        "hostile-policy",
        "legacy-v01-policy",
        "request-count-policy",
    ];
    let built = if TEST_GUESTS.contains(&package) {
        nyann_guests::test_guest(package)
    } else {
        nyann_guests::repository_guest(package)
    };
    built.unwrap_or_else(|e| panic!("{e}"))
}

/// Validates the run in `dir` (`stages.json`, `summary.json`, every line
/// of `requests.jsonl`) against the committed JSON Schema (`docs/schema/`)
/// with Python's `jsonschema`, an independent validator. `.ci/run`
/// installs it (kubernetes-validate brings it); with `CI` set it is
/// required, elsewhere its absence is said and the check skipped.
pub fn validate_against_schema(dir: &std::path::Path) {
    const VALIDATE: &str = r#"
import json, sys
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
schemas, run = sys.argv[1], sys.argv[2]
def report(errors, where):
    for e in errors[:3]:
        while e.context:  # the branch of an anyOf that came closest
            e = best_match(e.context)
        print(f"{where}: {e.json_path}: {e.message[:300]}")
    return not errors
def check(schema, doc, where):
    validator = Draft202012Validator(json.load(open(f"{schemas}/{schema}")))
    return report(list(validator.iter_errors(doc)), where)
ok = check("stages.schema.json", json.load(open(f"{run}/stages.json")), "stages.json")
ok &= check("summary.schema.json", json.load(open(f"{run}/summary.json")), "summary.json")
validator = Draft202012Validator(json.load(open(f"{schemas}/request.schema.json")))
for number, line in enumerate(open(f"{run}/requests.jsonl"), 1):
    if not report(list(validator.iter_errors(json.loads(line))), f"requests.jsonl:{number}"):
        ok = False
        break
sys.exit(0 if ok else 1)
"#;
    let schemas = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema");
    let out = std::process::Command::new("python3")
        .args(["-c", VALIDATE])
        .arg(&schemas)
        .arg(dir)
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No module named 'jsonschema'") {
        assert!(
            std::env::var_os("CI").is_none(),
            "Python's jsonschema is not installed (CI must install it: pip install kubernetes-validate)"
        );
        eprintln!(
            "Python's jsonschema is not installed: the run was not validated against docs/schema"
        );
        return;
    }
    assert!(
        out.status.success(),
        "{} does not match docs/schema:\n{}{stderr}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Validates Kubernetes objects with `kubernetes-validate --strict` (PyPI;
/// offline schemas, `.ci/run` installs it): `items` each in a JSON file of
/// its own, and `yaml`, the same objects as multi-document YAML, which must
/// also read back as `items` (PyYAML comes with kubernetes-validate). One
/// verdict per object and form. With `CI` set the tool is required;
/// elsewhere its absence is said and the check skipped.
pub fn kubernetes_validate(dir: &std::path::Path, items: &[Value], yaml: &str) {
    // `python3 -m kubernetes_validate` needs no shim on PATH (pyenv makes
    // one only on a rehash); $KUBERNETES_VALIDATE names another program.
    let (program, first): (String, &[&str]) = match std::env::var("KUBERNETES_VALIDATE") {
        Ok(program) => (program, &[]),
        Err(_) => ("python3".into(), &["-m", "kubernetes_validate"]),
    };
    let checked_dir = tempfile::tempdir_in(dir).unwrap();
    let mut files = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let file = checked_dir.path().join(format!("item{i}.json"));
        std::fs::write(&file, item.to_string()).unwrap();
        files.push(file);
    }
    let yaml_file = checked_dir.path().join("all.yaml");
    std::fs::write(&yaml_file, yaml).unwrap();
    files.push(yaml_file.clone());
    let checked = std::process::Command::new(&program)
        .args(first)
        .arg("--strict")
        .args(&files)
        .output();
    let installed = checked.as_ref().is_ok_and(|o| {
        !String::from_utf8_lossy(&o.stderr).contains("No module named kubernetes_validate")
    });
    match checked {
        Ok(checked) if installed => {
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&checked.stdout),
                String::from_utf8_lossy(&checked.stderr)
            );
            assert!(checked.status.success(), "{program}: {said}");
            // One verdict per object: the JSON files, then the YAML documents.
            assert_eq!(
                said.matches(" passed for resource ").count(),
                2 * items.len(),
                "{said}"
            );
            let back = std::process::Command::new("python3")
                .arg("-c")
                .arg("import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))")
                .arg(&yaml_file)
                .output()
                .unwrap();
            assert!(
                back.status.success(),
                "{}",
                String::from_utf8_lossy(&back.stderr)
            );
            let back: Value = serde_json::from_slice(&back.stdout).unwrap();
            assert_eq!(back.as_array().map(Vec::as_slice), Some(items));
        }
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "kubernetes-validate is not installed (CI must install it: pip install kubernetes-validate)"
            );
            eprintln!(
                "kubernetes-validate is not installed: the manifests were not validated against the Kubernetes schemas (pip install kubernetes-validate)"
            );
        }
    }
}
