//! A Python policy shipped through a registry, the largest kind (~17.5
//! MiB): the client-slo example (built once per test process by the
//! polyglot tests, its code compiled once into their cache) pushed with
//! `policy push` judges a sweep pulled by its tag, `summary.json` names
//! its digest, and a fleet manifest rendered with the pinned reference
//! carries none of its bytes. Sizes and times go to stderr (`--nocapture`).

use std::time::Instant;

use serde_json::Value;

use super::registry::{Home, Registry, have_tools, sha256_of, text};
use super::validate_kube;
use crate::polyglot::{cache_env, have_python_tools, python_client_slo};
use crate::support::{generate_with_env, nyann_bench, serial, simulator, sweep};
use crate::sweep::LEVELS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_policy_pushed_judges_a_sweep_pulled_by_reference() {
    if !have_tools() || !have_python_tools() {
        return;
    }
    let wasm = &python_client_slo().await.wasm;
    let size = std::fs::metadata(wasm).unwrap().len();
    assert!(size > 8 << 20, "{size} bytes: not a whole Python runtime");
    let digest = sha256_of(wasm);
    // An empty store (so the component is really pulled), the polyglot
    // tests' compiled code (so it is not compiled a second time).
    let [(_, cache), (_, state)] = cache_env();
    let home = Home::sharing_code_of(&cache, &state);
    let registry = Registry::start(false, false);
    let tagged = registry.reference("team/client-slo:1.0");

    let started = Instant::now();
    let (code, stdout, stderr) = home
        .nyann(
            &[
                "policy".as_ref(),
                "push".as_ref(),
                wasm.as_os_str(),
                tagged.as_ref(),
            ],
            &[],
        )
        .await;
    let pushed_in = started.elapsed();
    assert_eq!(code, Some(0), "{stderr}");
    let pinned = stdout.trim().to_string();
    assert!(pinned.starts_with(&format!("{tagged}@sha256:")), "{pinned}");
    assert!(
        stderr.contains(&format!(
            "pushed client-slo 0.1.0 (nyann:policy@0.5), component {digest}"
        )),
        "{stderr}"
    );

    // A sweep judged by the tag (client figures only: TTFT p99 ~50 ms at
    // c=8, ~400 ms at c=16), as the polyglot test runs it from the file.
    let _serial = serial().await;
    let sim = simulator(false).await;
    let args = vec!["--policy".to_string(), tagged.clone()];
    let started = Instant::now();
    let run = generate_with_env(
        &sim.base_url(),
        &sweep(&LEVELS, r#"ttft_p99="200ms""#),
        &args,
        &home.env(),
    )
    .await;
    let swept_in = started.elapsed();
    assert_eq!(run.stopped_at(), Some(2), "{}", run.stderr());
    assert!(
        run.stderr().contains(&format!(
            "policy {tagged} is {pinned} (component {digest}, pulled)"
        )),
        "{}",
        run.stderr()
    );
    // summary.json names what judged: the component's digest and the
    // reference pinned to the manifest's.
    for stage in 0..=2 {
        let policy = &run.congestion(stage)["policy"];
        assert_eq!(policy["name"], "client-slo", "{policy}");
        assert_eq!(policy["digest"], digest.as_str(), "{policy}");
        assert_eq!(policy["origin"], pinned.as_str(), "{policy}");
    }
    let reasons = run.congestion(2)["verdict"]["reasons"].to_string();
    assert!(reasons.contains("client TTFT p99 "), "{reasons}");
    crate::support::validate_against_schema(run.dir());
    drop(sim);

    // A fleet's manifests: the component pinned by digest in an image
    // volume, the ConfigMap the scenario's alone; or pulled by the leader.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sweep.star");
    std::fs::write(&config, sweep(&LEVELS, r#"ttft_p99="200ms""#)).unwrap();
    for delivery in ["image-volume", "pull"] {
        let out = nyann_bench()
            .args(["kube", "render", "--config"])
            .arg(&config)
            .args(["--workers", "2", "--image", "example.org/nyann-bench:1"])
            .args(["--policy", &pinned, "--policy-delivery", delivery])
            .args(["--", "--target", "http://vllm:8000/v1"])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        let items = list["items"].as_array().unwrap();
        let config_map = items[0].to_string().len();
        assert!(config_map < 64 << 10, "ConfigMap of {config_map} bytes");
        let pod = items[2]["spec"]["template"]["spec"].to_string();
        let by_digest = pinned.split_once('@').unwrap().1;
        assert!(pod.contains(by_digest), "{delivery}: {pod}");
        validate_kube(dir.path(), items);
    }

    eprintln!(
        "python policy: {size} bytes ({:.1} MiB); policy push {:.1} s; a 3-stage sweep pulling \
         it by tag {:.1} s",
        size as f64 / (1 << 20) as f64,
        pushed_in.as_secs_f64(),
        swept_in.as_secs_f64()
    );
}
