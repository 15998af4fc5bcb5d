//! A target that allows a policy in a registry, pinned by digest: a client
//! names it, the plan's compile and the run's child pull it (a real
//! registry on loopback, as in `crate::oci`), and every judged stage
//! records the reference as its origin. A tag alone is refused at start.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::{READ, SUBMIT, Setup, is_final};
use crate::oci::registry::{Home, NEVER, Registry, builtin_wasm, have_tools, sha256_of};
use crate::support::{serial, simulator, sweep};

#[tokio::test(flavor = "multi_thread")]
async fn a_target_allows_a_registry_policy_pinned_by_digest() {
    if !have_tools() {
        return;
    }
    let registry = Registry::start(false, false);
    let home = Home::new();
    let tagged = registry.reference("team/slo:1.0");
    let wasm = builtin_wasm();
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
    assert_eq!(code, Some(0), "{stderr}");
    let pinned = stdout.trim().to_string();

    let _serial = serial().await;
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let scrape: Vec<String> = sim
        .metrics_endpoints()
        .into_iter()
        .map(|(role, addr)| format!("\"{role}=http://{addr}/metrics\""))
        .collect();
    let targets = setup.dir.path().join("targets.toml");
    let mut text = std::fs::read_to_string(&targets).unwrap();
    text.push_str(&format!(
        "[targets.judged]\nurl = \"{}\"\nsignals = {{ scrape = [{}] }}\npolicies = [\"builtin\", \"{pinned}\"]\n",
        sim.base_url(),
        scrape.join(", ")
    ));
    std::fs::write(&targets, &text).unwrap();
    let env: Vec<(&str, &Path)> = home
        .env()
        .into_iter()
        .map(|(name, value)| (name, Path::new(value)))
        .collect();
    let serve = setup.start_with(&[], &env).await;

    // The tag is not what the target allows: only its pinned reference.
    let request = |policy: &str| json!({"target": "judged", "scenario": sweep(&[1, 2], NEVER), "policy": policy});
    let refused = serve
        .call("POST", "/api/v1/plan", Some(READ), Some(request(&tagged)))
        .await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused.body["error"]
            .as_str()
            .unwrap()
            .contains("does not allow policy"),
        "{}",
        refused.body
    );
    let answer = serve
        .call("POST", "/api/v1/runs", Some(SUBMIT), Some(request(&pinned)))
        .await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let id = answer.body["id"].as_str().unwrap();
    let run = serve.wait_for(id, Duration::from_secs(120), is_final).await;
    assert_eq!(run["status"], "completed", "{run}");
    let stages = run["summary"]["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2, "{run}");
    for stage in stages {
        let policy: &Value = &stage["annotation"]["congestion"]["policy"];
        assert_eq!(policy["origin"], pinned.as_str(), "{policy}");
        assert_eq!(policy["digest"], sha256_of(&wasm).as_str(), "{policy}");
    }

    // A tag alone in the targets file stops the start, saying to pin it.
    std::fs::write(&targets, text.replace(&pinned, &tagged)).unwrap();
    let stderr = setup.refused_start(&[]).await;
    assert!(
        stderr.contains("target \"judged\": policies:")
            && stderr.contains("names no digest: pin it"),
        "{stderr}"
    );
}
