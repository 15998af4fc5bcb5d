//! The harness against the real Debian `prometheus`: it starts, scrapes a
//! target with the given job and labels, and is gone after drop. Fails (does
//! not skip) when the binary is missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use nyann_testkit::{PrometheusServer, ScrapeJob, wait_until};

#[tokio::test]
async fn scrapes_a_target_with_job_and_labels_then_dies_on_drop() {
    let app = Router::new().route(
        "/metrics",
        get(|| async {
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 7.0\n"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let prom = PrometheusServer::start(&[
        ScrapeJob::new("vllm-aggregate").target(addr, &[("pod", "model-0")])
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let pid = prom.pid();
    assert!(prom.url().starts_with("http://127.0.0.1:"));

    prom.wait_for_series("vllm:num_requests_waiting", Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let result = prom.query("sum(vllm:num_requests_waiting)").await.unwrap();
    assert_eq!(result[0]["value"][1], "7");

    let http = nyann_testkit::http_client().build().unwrap();
    let url = format!(
        "{}/api/v1/query?query=vllm:num_requests_waiting{{job=%22vllm-aggregate%22,pod=%22model-0%22}}",
        prom.url()
    );
    let body = wait_until(
        "the sample to be queryable",
        Duration::from_secs(20),
        || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let body = http.get(&url).send().await.ok()?.text().await.ok()?;
                body.contains("\"7\"").then_some(body)
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nprometheus log:\n{}", prom.log()));
    assert!(body.contains("\"pod\":\"model-0\""), "{body}");

    drop(prom);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "prometheus (pid {pid}) still running after drop"
    );
}
