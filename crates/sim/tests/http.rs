//! Protocol tests over real HTTP on 127.0.0.1 with ephemeral ports: the
//! OpenAI shapes (streaming and not), usage only when asked, 4xx bodies,
//! `/metrics`, `/tokenize`, the timing record, disaggregated mode, faults
//! and determinism.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use nyann_sim::{RunningSim, SimConfig, start};
use serde_json::{Value, json};

async fn post(sim: &RunningSim, path: &str, body: Value) -> reqwest::Response {
    nyann_testkit::http_client()
        .build()
        .unwrap()
        .post(format!("http://{}{path}", sim.endpoint()))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn get_json(sim: &RunningSim, path: &str) -> Value {
    nyann_testkit::get(format!("http://{}{path}", sim.endpoint()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The `data:` payloads of an SSE body, `[DONE]` included.
fn sse_events(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body must end with a blank line: {body:?}"
    );
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data line: {e:?}"))
                .to_string()
        })
        .collect()
}

struct Stream {
    chunks: Vec<Value>,
    done_last: bool,
}

async fn stream(sim: &RunningSim, path: &str, body: Value) -> Stream {
    let r = post(sim, path, body).await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = r.text().await.unwrap();
    let events = sse_events(&text);
    let done_last = events.last().map(String::as_str) == Some("[DONE]");
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    let chunks = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    Stream { chunks, done_last }
}

fn content_chunks(s: &Stream) -> Vec<&Value> {
    s.chunks
        .iter()
        .filter(|c| !c["choices"].as_array().unwrap().is_empty())
        .collect()
}

#[tokio::test]
async fn chat_stream_is_openai_shaped_and_usage_only_when_asked() {
    let sim = start(SimConfig::default()).await.unwrap();
    let msgs = json!([{"role": "user", "content": "hello there, how are you?"}]);

    let s = stream(
        &sim,
        "/v1/chat/completions",
        json!({"model": "nyann-sim", "messages": msgs, "max_tokens": 7, "stream": true}),
    )
    .await;
    assert!(s.done_last);
    assert!(
        s.chunks.iter().all(|c| c.get("usage").is_none()),
        "no usage unless asked"
    );
    let id = s.chunks[0]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("chatcmpl-"));
    for c in &s.chunks {
        assert_eq!(c["id"], id.as_str());
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], "nyann-sim");
        assert!(c["created"].is_u64());
    }
    assert_eq!(s.chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let texts: Vec<&str> = s.chunks[1..]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts.len(), 7, "exactly max_tokens content chunks");
    let last = s.chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(
        s.chunks[..s.chunks.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );

    let s = stream(
        &sim,
        "/v1/chat/completions",
        json!({"messages": msgs, "max_completion_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    let usage = s.chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert_eq!(usage["usage"]["prompt_tokens"], 7, "ceil(25 chars / 4)");
    assert_eq!(usage["usage"]["total_tokens"], 12);
    assert_ne!(s.chunks[0]["id"], id.as_str(), "ids are unique");
    sim.shutdown().await;
}

#[tokio::test]
async fn completions_stream_and_non_streaming() {
    let sim = start(SimConfig::default()).await.unwrap();
    let s = stream(&sim, "/v1/completions", json!({"prompt": "abcdefgh", "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}})).await;
    let content = content_chunks(&s);
    assert_eq!(content.len(), 4);
    assert!(
        content
            .iter()
            .all(|c| c["object"] == "text_completion" && c["choices"][0]["text"].is_string())
    );
    assert_eq!(content[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(s.chunks.last().unwrap()["usage"]["prompt_tokens"], 2);

    let r: Value = post(
        &sim,
        "/v1/completions",
        json!({"prompt": [1, 2, 3], "max_tokens": 3}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["usage"]["prompt_tokens"], 3);
    assert_eq!(r["usage"]["completion_tokens"], 3);
    assert_eq!(
        r["choices"][0]["text"].as_str().unwrap().chars().count(),
        12,
        "3 tokens of 4 characters"
    );

    let r: Value = post(&sim, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 2);

    // No max_tokens: the default length, finishing with "stop".
    let r: Value = post(&sim, "/v1/completions", json!({"prompt": "x"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["usage"]["completion_tokens"], 256);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    sim.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let sim = start(SimConfig::default()).await.unwrap();
    let client = nyann_testkit::http_client().build().unwrap();
    let url = format!("http://{}/v1/chat/completions", sim.endpoint());
    let raw = client
        .post(&url)
        .body("{not json")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let body: Value = raw.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid request body")
    );
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["code"], 400);

    let cases = [
        ("/v1/chat/completions", json!({"max_tokens": 3})),
        ("/v1/chat/completions", json!({"messages": "hi"})),
        ("/v1/chat/completions", json!({"messages": []})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "n": 2}),
        ),
        ("/v1/completions", json!({"max_tokens": 3})),
        ("/v1/completions", json!({"prompt": 12})),
        ("/v1/completions", json!({"prompt": ["a", "b"]})),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 100000}),
        ),
        ("/tokenize", json!({"model": "nyann-sim"})),
    ];
    for (path, body) in cases {
        let r = post(&sim, path, body.clone()).await;
        assert_eq!(r.status(), 400, "{path} {body}");
        let e: Value = r.json().await.unwrap();
        assert!(
            e["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{e}"
        );
        assert_eq!(e["error"]["code"], 400);
    }
    let r = post(
        &sim,
        "/v1/completions",
        json!({"model": "other", "prompt": "x"}),
    )
    .await;
    assert_eq!(r.status(), 404);
    let r = client
        .get(format!("http://{}/nope", sim.endpoint()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // The server is still fine.
    let r = post(
        &sim,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status(), 200);
    sim.shutdown().await;
}

#[tokio::test]
async fn models_health_tokenize() {
    let sim = start(SimConfig::default()).await.unwrap();
    let base = format!("http://{}", sim.endpoint());
    let m = get_json(&sim, "/v1/models").await;
    assert_eq!(m["data"][0]["id"], "nyann-sim");
    assert_eq!(m["data"][0]["max_model_len"], 224 * 16);
    assert_eq!(
        nyann_testkit::get(format!("{base}/health"))
            .await
            .unwrap()
            .status(),
        200
    );
    let t: Value = post(
        &sim,
        "/tokenize",
        json!({"model": "nyann-sim", "prompt": "abcdefghi"}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(t["count"], 3);
    assert_eq!(t["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(t["max_model_len"], 224 * 16);
    let t: Value = post(&sim, "/tokenize", json!({"messages": [{"role": "user", "content": "abcd"}, {"role": "assistant", "content": "efg"}]}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(t["count"], 2, "\"abcd\\nefg\" is 8 characters");
    sim.shutdown().await;
}

/// The vllm-cpu-ref profile: its limits in /v1/models and /metrics (with
/// vLLM's null block), and its chat template's 16 tokens in chat prompts
/// (usage, /tokenize with messages) but not in completion prompts.
#[tokio::test]
async fn a_profile_shows_its_limits_and_chat_template() {
    let sim = start(SimConfig {
        profile: nyann_sim::Profile::VllmCpuRef,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let base = format!("http://{}", sim.endpoint());
    let m = get_json(&sim, "/v1/models").await;
    assert_eq!(m["data"][0]["max_model_len"], 1024);
    let metrics = nyann_testkit::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("block_size=\"32\"")
            && metrics.contains("num_gpu_blocks=\"64\"")
            && metrics.contains("kv_cache_size_tokens=\"2048\""),
        "{metrics}"
    );
    let prompt = "x".repeat(240); // 60 tokens
    let usage = |v: Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    let chat = post(
        &sim,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(usage(chat), 76);
    let completion = post(
        &sim,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 2}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(usage(completion), 60);
    let t: Value = post(
        &sim,
        "/tokenize",
        json!({"messages": [{"role": "user", "content": prompt}]}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(t["count"], 76);
    let t: Value = post(&sim, "/tokenize", json!({"prompt": prompt}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        t["count"], 60,
        "what a client calibrates its prompt lengths with"
    );
    sim.shutdown().await;
}

/// Parse a text exposition into (series with labels, value).
fn parse_exposition(text: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let v = match value {
            "+Inf" => f64::INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        assert!(
            value.contains('.') || value.contains('e') || value.contains("Inf"),
            "float-style value: {line}"
        );
        out.push((series.to_string(), v));
    }
    out
}

fn value(series: &[(String, f64)], name: &str) -> f64 {
    series
        .iter()
        .find(|(s, _)| s == name)
        .unwrap_or_else(|| panic!("missing {name}"))
        .1
}

#[tokio::test]
async fn metrics_have_every_series_from_startup_and_count_requests() {
    let sim = start(SimConfig::default()).await.unwrap();
    assert_eq!(
        sim.metrics_endpoints(),
        vec![("aggregate".to_string(), sim.endpoint())]
    );
    let url = format!("http://{}/metrics", sim.endpoint());
    let r = nyann_testkit::get(&url).await.unwrap();
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let s = parse_exposition(&r.text().await.unwrap());
    let l = r#"{engine="0",model_name="nyann-sim"}"#;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_sum",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
    ] {
        assert_eq!(value(&s, &format!("{name}{l}")), 0.0, "{name}");
    }
    for reason in ["stop", "length", "abort", "error", "repetition"] {
        let n = format!(
            r#"vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="nyann-sim"}}"#
        );
        assert_eq!(value(&s, &n), 0.0);
    }
    for le in ["0.001", "0.06", "1.0", "2560.0", "+Inf"] {
        value(
            &s,
            &format!(
                r#"vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="nyann-sim"}}"#
            ),
        );
    }
    for le in ["0.01", "80.0"] {
        value(
            &s,
            &format!(
                r#"vllm:inter_token_latency_seconds_bucket{{engine="0",le="{le}",model_name="nyann-sim"}}"#
            ),
        );
    }
    for le in ["0.3", "7680.0"] {
        value(
            &s,
            &format!(
                r#"vllm:e2e_request_latency_seconds_bucket{{engine="0",le="{le}",model_name="nyann-sim"}}"#
            ),
        );
        value(
            &s,
            &format!(
                r#"vllm:request_queue_time_seconds_bucket{{engine="0",le="{le}",model_name="nyann-sim"}}"#
            ),
        );
    }

    for _ in 0..3 {
        let r = post(
            &sim,
            "/v1/completions",
            json!({"prompt": "abcdefgh", "max_tokens": 10}),
        )
        .await;
        assert_eq!(r.status(), 200);
    }
    let s = parse_exposition(
        &nyann_testkit::get(&url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(value(&s, &format!("vllm:generation_tokens_total{l}")), 30.0);
    assert_eq!(value(&s, &format!("vllm:prompt_tokens_total{l}")), 6.0);
    assert_eq!(
        value(&s, &format!("vllm:time_to_first_token_seconds_count{l}")),
        3.0
    );
    assert_eq!(
        value(&s, &format!("vllm:inter_token_latency_seconds_count{l}")),
        27.0
    );
    assert_eq!(
        value(
            &s,
            r#"vllm:request_success_total{engine="0",finished_reason="length",model_name="nyann-sim"}"#
        ),
        3.0
    );

    let recs = sim.requests();
    assert_eq!(recs.len(), 3);
    for r in &recs {
        let ft = r.first_token.unwrap();
        assert!(r.arrival <= ft && ft <= r.end, "{r:?}");
        assert_eq!(
            (r.status, r.completion_tokens, r.prompt_tokens),
            ("ok", 10, 2)
        );
    }
    let j: Value = nyann_testkit::get(format!("http://{}/sim/requests", sim.endpoint()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(j.as_array().unwrap().len(), 3);
    assert!(j[0]["arrival"].is_f64() && j[0]["first_token"].is_f64() && j[0]["end"].is_f64());
    sim.shutdown().await;
}

#[tokio::test]
async fn client_going_away_aborts_the_request() {
    let sim = start(SimConfig::default()).await.unwrap();
    let mut r = post(
        &sim,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 3000, "stream": true}),
    )
    .await;
    r.chunk().await.unwrap().unwrap();
    drop(r);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = &sim.engine_metrics()[0].1;
        if m.success(nyann_sim::metrics::FinishedReason::Abort) == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "abort not recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sim.requests()[0].status, "aborted");
    sim.shutdown().await;
}

#[tokio::test]
async fn disaggregated_prefill_then_decode_with_two_metrics_endpoints() {
    let sim = start(SimConfig {
        disaggregated: true,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let eps = sim.metrics_endpoints();
    assert_eq!(
        eps.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        ["prefill", "decode"]
    );
    assert!(
        eps.iter()
            .all(|(_, a)| a.ip().is_loopback() && *a != sim.endpoint())
    );
    let s = stream(&sim, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "abcdefgh"}], "max_tokens": 6, "stream": true})).await;
    assert_eq!(content_chunks(&s).len(), 7, "role chunk + 6 tokens");
    let r: Value = post(
        &sim,
        "/v1/completions",
        json!({"prompt": "abcd", "max_tokens": 1}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(r["usage"]["completion_tokens"], 1);
    let l = r#"{engine="0",model_name="nyann-sim"}"#;
    let get = |addr: std::net::SocketAddr| async move {
        parse_exposition(
            &nyann_testkit::get(format!("http://{addr}/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        )
    };
    let prefill = get(eps[0].1).await;
    let decode = get(eps[1].1).await;
    assert_eq!(
        value(&prefill, &format!("vllm:generation_tokens_total{l}")),
        2.0,
        "one token of each request, which the client does not see"
    );
    assert_eq!(
        value(&prefill, &format!("vllm:prompt_tokens_total{l}")),
        3.0
    );
    assert_eq!(
        value(&decode, &format!("vllm:generation_tokens_total{l}")),
        7.0,
        "every token the client sees"
    );
    assert_eq!(
        value(
            &decode,
            &format!("vllm:time_to_first_token_seconds_count{l}")
        ),
        2.0,
        "the client's first tokens"
    );
    assert_eq!(
        value(&decode, &format!("vllm:prompt_tokens_total{l}")),
        0.0,
        "KV transferred, not recomputed"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn max_waiting_gives_429() {
    // Slowed down 5x so the first request holds its slot for ~20 s, far longer than the test needs.
    let args = SimConfig {
        max_num_seqs: Some(1),
        max_waiting: Some(1),
        time_scale: 5.0,
        ..SimConfig::default()
    };
    let sim = start(args).await.unwrap();
    // The first holds the only running slot for seconds; the second waits; the third is refused.
    let mut first = post(
        &sim,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 3000, "stream": true}),
    )
    .await;
    first.chunk().await.unwrap().unwrap();
    let second = tokio::spawn({
        let url = format!("http://{}/v1/completions", sim.endpoint());
        async move {
            nyann_testkit::http_client()
                .build()
                .unwrap()
                .post(url)
                .json(&json!({"prompt": "x", "max_tokens": 1}))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sim.engine_metrics()[0].1.clone().ttft().count() < 1 || {
        let mut t = String::new();
        sim.engine_metrics()[0].1.render(&mut t);
        !t.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"nyann-sim\"} 1.0")
    } {
        assert!(
            tokio::time::Instant::now() < deadline,
            "second request never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let third = post(
        &sim,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(third.status(), 429);
    let e: Value = third.json().await.unwrap();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-waiting")
    );
    drop(first);
    assert_eq!(second.await.unwrap(), 200);
    sim.shutdown().await;
}

#[tokio::test]
async fn faults_are_injected() {
    let sim = start(SimConfig {
        fault_error_rate: 1.0,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let r = post(
        &sim,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status(), 500);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], 500);
    sim.shutdown().await;

    let sim = start(SimConfig {
        fault_cut_rate: 1.0,
        fault_cut_after: 3,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let mut r = post(
        &sim,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 10, "stream": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut body = Vec::new();
    let err = loop {
        match r.chunk().await {
            Ok(Some(c)) => body.extend_from_slice(&c),
            Ok(None) => panic!("a cut stream must not end cleanly"),
            Err(e) => break e,
        }
    };
    let text = String::from_utf8(body).unwrap();
    assert_eq!(text.matches("\"text\":").count(), 3, "{text} / {err}");
    assert!(!text.contains("[DONE]"));
    sim.shutdown().await;

    let sim = start(SimConfig {
        fault_reset_rate: 1.0,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let r = nyann_testkit::http_client()
        .build()
        .unwrap()
        .post(format!("http://{}/v1/completions", sim.endpoint()))
        .json(&json!({"prompt": "x", "max_tokens": 2}))
        .send()
        .await;
    match r {
        Err(_) => {}
        Ok(resp) => assert!(
            resp.bytes().await.is_err(),
            "a reset must not deliver a complete response"
        ),
    }
    assert_eq!(sim.requests()[0].status, "reset");
    sim.shutdown().await;

    let stall = Duration::from_millis(300);
    let sim = start(SimConfig {
        fault_stall_rate: 1.0,
        fault_stall: stall,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let t = std::time::Instant::now();
    let r = post(
        &sim,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(t.elapsed() >= stall);
    let rec = &sim.requests()[0];
    assert!(rec.first_token.unwrap() - rec.arrival >= stall.as_secs_f64() * 0.99);
    sim.shutdown().await;
}

#[tokio::test]
async fn fault_choice_is_deterministic_under_seed() {
    async fn statuses(seed: u64) -> Vec<u16> {
        let sim = start(SimConfig {
            seed,
            fault_error_rate: 0.5,
            ..SimConfig::fast()
        })
        .await
        .unwrap();
        let mut out = Vec::new();
        for _ in 0..20 {
            out.push(
                post(
                    &sim,
                    "/v1/completions",
                    json!({"prompt": "x", "max_tokens": 1}),
                )
                .await
                .status()
                .as_u16(),
            );
        }
        sim.shutdown().await;
        out
    }
    let a = statuses(3).await;
    assert_eq!(a, statuses(3).await);
    assert!(a.contains(&500) && a.contains(&200), "{a:?}");
}

#[tokio::test]
async fn same_seed_same_output() {
    async fn outputs(seed: u64) -> Vec<String> {
        let sim = start(SimConfig {
            seed,
            ..SimConfig::default()
        })
        .await
        .unwrap();
        let mut out = Vec::new();
        for i in 0..3 {
            let r: Value = post(
                &sim,
                "/v1/completions",
                json!({"prompt": format!("p{i}"), "max_tokens": 8}),
            )
            .await
            .json()
            .await
            .unwrap();
            out.push(r["choices"][0]["text"].as_str().unwrap().to_string());
        }
        sim.shutdown().await;
        out
    }
    let a = outputs(11).await;
    assert_eq!(a, outputs(11).await);
    assert_ne!(a, outputs(12).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_profile_serves_many_concurrent_streams() {
    let sim = start(SimConfig::fast()).await.unwrap();
    let client = nyann_testkit::http_client()
        .pool_max_idle_per_host(1024)
        .build()
        .unwrap();
    let url = format!("{}/chat/completions", sim.base_url());
    let mut tasks = Vec::new();
    for _ in 0..1024 {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let r = client
                .post(url)
                .json(&json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}))
                .send()
                .await
                .unwrap();
            let text = r.text().await.unwrap();
            sse_events(&text)
                .iter()
                .filter(|e| e.contains("\"content\":\"") && !e.contains("\"role\""))
                .count()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 32, "the fast profile's default length");
    }
    let m = &sim.engine_metrics()[0].1;
    assert_eq!(m.generation_tokens(), 1024 * 32);
    sim.shutdown().await;
}

/// `vllm:prefix_cache_hits_total` on the simulator's `/metrics`.
async fn prefix_cache_hits(sim: &RunningSim) -> u64 {
    let url = format!("http://{}/metrics", sim.endpoint());
    let text = nyann_testkit::get(url).await.unwrap().text().await.unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:prefix_cache_hits_total{"))
        .unwrap();
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

/// The usage of one request: its stream's final usage chunk, or its answer's.
async fn final_usage(sim: &RunningSim, path: &str, mut body: Value, streamed: bool) -> Value {
    if streamed {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let text = post(sim, path, body).await.text().await.unwrap();
    if streamed {
        let events = sse_events(&text);
        let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        last["usage"].clone()
    } else {
        serde_json::from_str::<Value>(&text).unwrap()["usage"].clone()
    }
}

/// `--enable-prompt-tokens-details`: each response's usage says how many
/// prompt tokens the prefix cache served (`prompt_tokens_details.cached_tokens`,
/// in the final usage chunk of a stream and in a whole answer, chat and
/// completions alike): 0 for a new prompt, then exactly what `/metrics`
/// adds to `vllm:prefix_cache_hits_total`. Without the flag the usage is
/// what it always was: no details in the stream, null in a whole answer.
#[tokio::test]
async fn prompt_tokens_details_report_the_prefix_cache_hits() {
    // 256 characters: 64 tokens; the lookup stops before the last token,
    // so a repeat finds 3 blocks of 16.
    let question = "abcd".repeat(64);
    let chat = json!({"messages": [{"role": "user", "content": question}], "max_tokens": 4});
    let completion = json!({"prompt": question, "max_tokens": 4});
    let requests = [
        ("/v1/chat/completions", chat.clone(), true),
        ("/v1/chat/completions", chat, false),
        ("/v1/completions", completion.clone(), true),
        ("/v1/completions", completion, false),
    ];
    let sim = start(SimConfig {
        enable_prompt_tokens_details: true,
        jitter: Some(0.0),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let mut reported = Vec::new();
    for (path, body, streamed) in requests.clone() {
        let before = prefix_cache_hits(&sim).await;
        let usage = final_usage(&sim, path, body, streamed).await;
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("{path} (streamed: {streamed}): {usage}"));
        assert_eq!(
            cached,
            prefix_cache_hits(&sim).await - before,
            "{path} {streamed}"
        );
        reported.push(cached);
    }
    assert_eq!(
        reported,
        [0, 48, 48, 48],
        "a new prompt, then 3 cached blocks"
    );
    assert_eq!(reported.iter().sum::<u64>(), prefix_cache_hits(&sim).await);
    sim.shutdown().await;

    let sim = start(SimConfig {
        jitter: Some(0.0),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    for (path, body, streamed) in requests {
        let usage = final_usage(&sim, path, body, streamed).await;
        if streamed {
            let mut keys: Vec<&String> = usage.as_object().unwrap().keys().collect();
            keys.sort();
            assert_eq!(
                keys,
                ["completion_tokens", "prompt_tokens", "total_tokens"],
                "{path}"
            );
        } else {
            assert!(usage["prompt_tokens_details"].is_null(), "{path}: {usage}");
            assert!(usage.get("prompt_tokens_details").is_some(), "{path}");
        }
    }
    assert!(
        prefix_cache_hits(&sim).await > 0,
        "the cache is used, only not reported"
    );
    sim.shutdown().await;
}
