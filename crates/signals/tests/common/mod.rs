//! Test servers shared by the integration tests: a fake Prometheus HTTP API
//! that records every request and answers from a closure, and a scripted
//! vLLM-like `/metrics` exporter whose values the test controls.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// One request the fake Prometheus received.
#[derive(Debug, Clone)]
pub struct Req {
    pub path: String,
    pub params: HashMap<String, String>,
    pub headers: HashMap<String, String>,
}

impl Req {
    pub fn query(&self) -> &str {
        self.params.get("query").map(String::as_str).unwrap_or("")
    }
    pub fn num(&self, key: &str) -> f64 {
        self.params[key].parse().unwrap()
    }
}

/// What the fake answers.
pub enum Answer {
    Now {
        status: u16,
        content_type: &'static str,
        body: String,
    },
    /// Never answers (within the test).
    Hang,
}

impl Answer {
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Answer::Now {
            status,
            content_type: "application/json",
            body: body.into(),
        }
    }
}

type Handler = Arc<dyn Fn(&Req) -> Answer + Send + Sync>;

#[derive(Clone)]
struct FakeState {
    log: Arc<Mutex<Vec<Req>>>,
    handler: Handler,
}

pub struct FakeProm {
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<Req>>>,
}

impl FakeProm {
    pub async fn start(handler: impl Fn(&Req) -> Answer + Send + Sync + 'static) -> Self {
        let state = FakeState {
            log: Arc::default(),
            handler: Arc::new(handler),
        };
        let log = state.log.clone();
        let app = Router::new().fallback(get(fake_handler)).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeProm { addr, log }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Req> {
        self.log.lock().unwrap().clone()
    }
}

async fn fake_handler(
    State(st): State<FakeState>,
    uri: Uri,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let req = Req {
        path: uri.path().to_string(),
        params,
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
    };
    st.log.lock().unwrap().push(req.clone());
    match (st.handler)(&req) {
        Answer::Now {
            status,
            content_type,
            body,
        } => (
            StatusCode::from_u16(status).unwrap(),
            [("content-type", content_type)],
            body,
        )
            .into_response(),
        Answer::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::OK.into_response()
        }
    }
}

/// `{"status":"success"}` with a matrix of one series.
pub fn matrix(points: &[(f64, &str)]) -> String {
    let values: Vec<String> = points
        .iter()
        .map(|(t, v)| format!("[{t},\"{v}\"]"))
        .collect();
    format!(
        r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":[{}]}}]}}}}"#,
        values.join(",")
    )
}

/// `{"status":"success"}` with a vector of one sample.
pub fn vector(t: f64, v: &str) -> String {
    format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"value":[{t},"{v}"]}}]}}}}"#
    )
}

/// An empty result of the type the endpoint returns.
pub fn empty(req: &Req) -> String {
    let kind = if req.path.ends_with("query_range") {
        "matrix"
    } else {
        "vector"
    };
    format!(r#"{{"status":"success","data":{{"resultType":"{kind}","result":[]}}}}"#)
}

/// vLLM's TTFT bucket bounds.
pub const TTFT_BOUNDS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// The state of a scripted vLLM-like server.
#[derive(Debug, Clone, Default)]
pub struct Engine {
    pub waiting: f64,
    pub running: f64,
    pub kv: f64,
    pub preemptions: f64,
    pub generation_tokens: f64,
    /// Cumulative TTFT bucket counts, one per bound of TTFT_BOUNDS, then +Inf.
    pub ttft: Vec<f64>,
    pub ttft_sum: f64,
}

impl Engine {
    pub fn new() -> Self {
        Engine {
            ttft: vec![0.0; TTFT_BOUNDS.len() + 1],
            ..Default::default()
        }
    }

    /// Records one TTFT observation.
    pub fn observe_ttft(&mut self, seconds: f64) {
        for (i, b) in TTFT_BOUNDS.iter().enumerate() {
            if seconds <= *b {
                self.ttft[i] += 1.0;
            }
        }
        self.ttft[TTFT_BOUNDS.len()] += 1.0;
        self.ttft_sum += seconds;
    }

    /// The exposition text, in prometheus_client's style (floats, sorted labels).
    pub fn exposition(&self) -> String {
        let l = r#"engine="0",model_name="m""#;
        let mut s = String::new();
        let gauge = |s: &mut String, name: &str, v: f64| {
            s.push_str(&format!(
                "# HELP {name} x\n# TYPE {name} gauge\n{name}{{{l}}} {v:?}\n"
            ));
        };
        gauge(&mut s, "vllm:num_requests_waiting", self.waiting);
        gauge(&mut s, "vllm:num_requests_running", self.running);
        gauge(&mut s, "vllm:kv_cache_usage_perc", self.kv);
        s.push_str(&format!(
            "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{{{l}}} {:?}\n",
            self.preemptions
        ));
        s.push_str(&format!(
            "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{{l}}} {:?}\n",
            self.generation_tokens
        ));
        s.push_str("# TYPE vllm:time_to_first_token_seconds histogram\n");
        for (i, c) in self.ttft.iter().enumerate() {
            let le = TTFT_BOUNDS
                .get(i)
                .map(|b| format!("{b:?}"))
                .unwrap_or_else(|| "+Inf".into());
            s.push_str(&format!(
                "vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"{le}\",model_name=\"m\"}} {c:?}\n"
            ));
        }
        s.push_str(&format!(
            "vllm:time_to_first_token_seconds_count{{{l}}} {:?}\nvllm:time_to_first_token_seconds_sum{{{l}}} {:?}\n",
            self.ttft[TTFT_BOUNDS.len()],
            self.ttft_sum
        ));
        s
    }
}

/// A scripted exporter serving `Engine::exposition()` at `/metrics`.
pub struct Exporter {
    pub addr: SocketAddr,
    pub engine: Arc<Mutex<Engine>>,
}

impl Exporter {
    pub async fn start(engine: Engine) -> Self {
        let engine = Arc::new(Mutex::new(engine));
        let e = engine.clone();
        let app = Router::new().route(
            "/metrics",
            get(move || {
                let text = e.lock().unwrap().exposition();
                async move { ([("content-type", "text/plain; version=0.0.4")], text) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Exporter { addr, engine }
    }

    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    pub fn update(&self, f: impl FnOnce(&mut Engine)) {
        f(&mut self.engine.lock().unwrap());
    }
}

/// Now in unix seconds.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
