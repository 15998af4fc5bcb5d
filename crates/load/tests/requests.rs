//! What the runner sends and reads end to end against a local test
//! server: ISL calibration, usage tokens, the completions API, the model
//! found by itself, API keys and headers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::scenarios::*;
use common::{Behaviour, TestServer, records};
use nyann_load::{NoHook, Status};
use nyann_model::{Mode, Stage, Step};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isl_is_calibrated_with_tokenize_when_the_server_has_it() {
    let server = TestServer::start(Behaviour {
        tokenize_chars_per_token: Some(3.0),
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut sc = scenario(vec![Step::Stage(Stage {
        concurrency: Some(1),
        max_requests: 1,
        ..Stage::new(30.0, Mode::Concurrent)
    })]);
    sc.workload.isl = 100;
    sc.workload.chars_per_token = 0.0;
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let prompt = server.requests()[0]["messages"][0]["content"]
        .as_str()
        .unwrap()
        .len();
    assert!(
        (297..=303).contains(&prompt),
        "100 tokens x 3.0 chars: {prompt}"
    );

    // Without /tokenize: the workload's chars_per_token, else 4.0.
    let plain = TestServer::start(Behaviour::default()).await;
    for (cpt, want) in [(2.5, 250), (0.0, 400)] {
        sc.workload.chars_per_token = cpt;
        nyann_load::run(&sc, options(&plain, dir.path()), NoHook)
            .await
            .unwrap();
        let len = plain.requests().last().unwrap()["messages"][0]["content"]
            .as_str()
            .unwrap()
            .len();
        assert_eq!(len, want, "chars_per_token {cpt}");
    }
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_tokens_completions_api_and_model_autodetect() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let sc = two_requests();
    let mut opts = options(&server, dir.path());
    opts.client.api = nyann_load::Api::Completions;
    opts.client.stream_usage = true;
    let result = nyann_load::run(&sc, opts, NoHook).await.unwrap();
    assert_eq!(result.models, vec!["test-model".to_string()]);
    let reqs = server.requests();
    assert_eq!(reqs[0]["model"], "test-model");
    assert!(reqs[0]["prompt"].is_string());
    let r = &records(dir.path())[0];
    assert_eq!(r.status, Status::Ok);
    assert_eq!(r.output_tokens, Some(4));
    assert_eq!(r.output_tokens_source, Some(nyann_load::TokenSource::Usage));
    assert_eq!(r.itl_s.len(), 3);
    assert!(r.ttft_s.unwrap() > 0.0 && r.e2e_s.unwrap() >= r.ttft_s.unwrap());
    assert_eq!(r.finish_reason.as_deref(), Some("length"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_and_headers_are_sent_with_every_request() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let sc = two_requests();
    let mut opts = options(&server, dir.path());
    opts.client.api_key = Some("sk-test".into());
    opts.client.headers = vec![
        ("X-Team".into(), "perf".into()),
        ("User-Agent".into(), "sweep/1".into()),
    ];
    nyann_load::run(&sc, opts, NoHook).await.unwrap();
    let heads = server.heads();
    assert_eq!(heads.len(), 2);
    for head in heads {
        let lines: Vec<String> = head.lines().map(str::to_ascii_lowercase).collect();
        assert_eq!(lines[0], "post /v1/chat/completions http/1.1", "{head}");
        for expected in [
            format!("host: {}", server.addr),
            "authorization: bearer sk-test".into(),
            "x-team: perf".into(),
            "user-agent: sweep/1".into(),
            "content-type: application/json".into(),
            "accept: text/event-stream".into(),
        ] {
            assert!(lines.contains(&expected), "{expected:?} missing in {head}");
        }
        // The user's User-Agent replaces nyann-bench's own.
        assert_eq!(
            lines
                .iter()
                .filter(|l| l.starts_with("user-agent:"))
                .count(),
            1,
            "{head}"
        );
    }
}
