//! MCP on `/mcp`, driven by an independent client: PyPI's `mcp` package
//! (`mcp_client.py` beside this file) plans, submits an `until_congested`
//! sweep, polls it to its stop, reads its report and artifacts, once per
//! protocol revision the SDK lets a client choose (2025-11-25 with its
//! handshake, 2026-07-28 stateless). `.ci/run` installs the package; with
//! `CI` set the tests require it, elsewhere they skip with a message. The
//! refusals at the HTTP level (no token, a malformed JSON-RPC body, a
//! foreign Host or Origin) need no Python.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::{ADMIN, READ, SUBMIT, Setup};
use crate::support::{serial, simulator};

/// The pinned client, as `.ci/run` installs it.
const MCP: &str = "2.3.0";
const INSTALL: &str = "python3 -m pip install mcp==2.3.0";

/// Whether Python's `mcp` is there; without it a failure with `CI` set,
/// else a skip said once.
fn have_client() -> bool {
    let version = std::process::Command::new("python3")
        .args([
            "-c",
            "import importlib.metadata as m, mcp.client.streamable_http; print(m.version('mcp'))",
        ])
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .output();
    if let Ok(out) = &version
        && String::from_utf8_lossy(&out.stdout).trim() == MCP
    {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "PyPI's mcp {MCP} is not installed (CI must install it: {INSTALL}; .ci/run does)"
    );
    eprintln!("PyPI's mcp {MCP} is not installed: the test is skipped ({INSTALL})");
    false
}

fn client_script() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/e2e/serve/mcp_client.py"
    ))
}

/// The sweep, its stages and where the service reports it stopped.
async fn sweep_through_mcp(revision: &str) {
    if !have_client() {
        return;
    }
    let _serial = serial().await;
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let serve = setup.start().await;
    let scenario = crate::support::sweep(&crate::sweep::LEVELS, crate::sweep::STOPS_AT_16);
    let args = json!({
        "url": format!("{}/mcp", serve.url),
        "submit": SUBMIT,
        "read": READ,
        "revision": revision,
        "target": "wide",
        "scenario": scenario,
        "label": format!("mcp {revision}"),
    });
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(240),
        tokio::process::Command::new("python3")
            .arg(client_script())
            .arg(args.to_string())
            .current_dir(env!("CARGO_TARGET_TMPDIR"))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the MCP client ends within 4 minutes")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the MCP client failed:\n{stderr}");
    let seen: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    eprintln!(
        "MCP {revision}: the client's session took {:?}",
        started.elapsed()
    );

    assert_eq!(seen["planned_stages"], 4, "{seen}");
    assert_eq!(seen["status"], "stopped", "{seen}");
    // The report: judged stages with their verdicts, the stop at c=16,
    // the knee below it, the stage after it skipped.
    let report = &seen["report"];
    eprintln!("MCP {revision}: the report: {report}");
    assert_eq!(report["outcome"], "stopped", "{report}");
    assert_eq!(report["stopped"]["stage"], 2, "{report}");
    assert!(
        report["stopped"]["reason"]
            .as_str()
            .unwrap()
            .contains("congested"),
        "{report}"
    );
    let stages = report["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 4, "{report}");
    for (index, (status, congested)) in [
        ("measured", json!(false)),
        ("measured", json!(false)),
        ("measured", json!(true)),
        ("skipped", Value::Null),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(stages[index]["status"], status, "stage {index}: {report}");
        assert_eq!(
            stages[index]["congested"], congested,
            "stage {index}: {report}"
        );
        assert_eq!(
            stages[index]["concurrency"],
            crate::sweep::LEVELS[index],
            "{report}"
        );
    }
    assert!(!stages[2]["reasons"].as_array().unwrap().is_empty());
    assert!(stages[3]["skip_reason"].is_string(), "{report}");
    let sweep = &report["sweeps"][0];
    assert_eq!(sweep["congested"]["concurrency"], 16, "{report}");
    assert_eq!(sweep["knee"]["concurrency"], 8, "{report}");
    assert!(sweep["knee"]["requests_per_second"].as_f64().unwrap() > 0.0);
    let id = seen["run"].as_str().unwrap();
    assert_eq!(
        report["report_html"],
        format!("/api/v1/runs/{id}/report.html")
    );

    // The artifacts are those the JSON API serves, at the paths given.
    let names: Vec<&str> = seen["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    for name in [
        "requests.jsonl",
        "stages.json",
        "summary.json",
        "report.html",
        "run.log",
    ] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    let path = seen["artifacts"][0]["path"].as_str().unwrap();
    assert_eq!(serve.call("GET", path, Some(READ), None).await.status, 200);
    // The summary MCP read is the one the JSON API serves.
    let run = serve.run(id).await;
    assert_eq!(run["summary"]["outcome"]["stage"], 2);

    // The read-only token's refused submit changed nothing: one run.
    let listed = serve.call("GET", "/api/v1/runs", Some(READ), None).await;
    assert_eq!(
        listed.body["runs"].as_array().unwrap().len(),
        1,
        "{}",
        listed.body
    );
}

#[tokio::test]
async fn mcp_client_sweeps_with_the_2025_11_25_handshake() {
    sweep_through_mcp("2025-11-25").await;
}

#[tokio::test]
async fn mcp_client_sweeps_with_the_stateless_2026_07_28_revision() {
    sweep_through_mcp("2026-07-28").await;
}

/// What is refused before any tool runs, and changes nothing.
#[tokio::test]
async fn mcp_refuses_no_token_a_bad_body_a_foreign_host_or_origin() {
    let sim = simulator(false).await;
    let setup = Setup::new(&sim);
    let serve = setup.start().await;
    let client = nyann_testkit::http_client().build().unwrap();
    let url = format!("{}/mcp", serve.url);
    let post = |token: Option<&str>, body: &str| {
        let mut request = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string());
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        request
    };
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;

    for token in [None, Some("wrong")] {
        let answer = post(token, list).send().await.unwrap();
        assert_eq!(answer.status().as_u16(), 401, "{token:?}");
        let challenge = answer.headers().get("www-authenticate").unwrap();
        assert!(challenge.to_str().unwrap().starts_with("Bearer"));
    }

    // Not JSON, and JSON that is no JSON-RPC message: JSON-RPC errors
    // (parse error, invalid request) with 400.
    for (body, code, id) in [
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"submit_run""#,
            -32700,
            Value::Null,
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":"submit_run"}"#,
            -32600,
            json!(2),
        ),
        (r#"[1, 2"#, -32700, Value::Null),
    ] {
        let answer = post(Some(ADMIN), body).send().await.unwrap();
        let status = answer.status().as_u16();
        let message: Value = answer.json().await.unwrap();
        assert_eq!(status, 400, "{message}");
        assert_eq!(message["jsonrpc"], "2.0", "{message}");
        assert_eq!(message["id"], id, "{message}");
        assert_eq!(message["error"]["code"], code, "{message}");
        assert!(
            message["error"]["message"]
                .as_str()
                .unwrap()
                .contains("JSON-RPC 2.0 message"),
            "{message}"
        );
    }

    // A Host that is none of the service's (DNS rebinding), and a page of
    // another origin, are refused; the service's own origin is not.
    let foreign = post(Some(ADMIN), list)
        .header("host", "rebound.example:8089")
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status().as_u16(), 403);
    let foreign = post(Some(ADMIN), list)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(foreign.status().as_u16(), 403);
    let own = post(Some(READ), list)
        .header("origin", &serve.url)
        .send()
        .await
        .unwrap();
    assert_eq!(own.status().as_u16(), 200);

    // The same request from loopback is served: the seven tools.
    let answer = post(Some(READ), list).send().await.unwrap();
    let text = answer.text().await.unwrap();
    assert!(
        text.contains("submit_run") && text.contains("get_report"),
        "{text}"
    );

    let listed = serve.call("GET", "/api/v1/runs", Some(READ), None).await;
    assert_eq!(listed.body["runs"], json!([]), "nothing was submitted");
    assert!(sim.requests().is_empty());
}
