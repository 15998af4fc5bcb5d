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

/// `{"status":"success"}` with a vector of samples at time 1, each with
/// its labels.
pub fn labelled(samples: &[(&[(&str, &str)], &str)]) -> String {
    let items: Vec<String> = samples
        .iter()
        .map(|(labels, v)| {
            let labels: serde_json::Map<String, serde_json::Value> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                .collect();
            format!(
                r#"{{"metric":{},"value":[1,"{v}"]}}"#,
                serde_json::Value::Object(labels)
            )
        })
        .collect();
    format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
        items.join(",")
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

#[allow(unused_imports)] // not every test binary uses every item
pub use nyann_testkit::exporter::{Engine, Exporter, TTFT_BOUNDS};

/// `count by (__name__)` of every signal series of the vLLM profile: what a
/// selector that finds a complete vLLM server answers at preflight.
pub fn every_vllm_series() -> String {
    let names = [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:num_preemptions_total",
        "vllm:generation_tokens_total",
    ];
    let labels: Vec<[(&str, &str); 1]> = names.iter().map(|n| [("__name__", *n)]).collect();
    let samples: Vec<(&[(&str, &str)], &str)> =
        labels.iter().map(|l| (l.as_slice(), "1")).collect();
    labelled(&samples)
}

/// Index of the TTFT bucket holding `v` (same bucket = same answer within
/// the histogram's resolution).
pub fn bucket_of(v: f64) -> usize {
    TTFT_BOUNDS
        .iter()
        .position(|b| v <= *b)
        .unwrap_or(TTFT_BOUNDS.len())
}

/// The built-in policy's rule with the balanced example's thresholds.
pub fn congested(roles: &[nyann_model::RoleSignals]) -> bool {
    let waiting = roles.iter().any(|r| r.waiting_requests_p50 >= 32.0);
    let ttft = roles.iter().any(|r| r.ttft_p99_seconds >= 2.0);
    let kv = roles
        .iter()
        .any(|r| r.kv_cache_usage_max >= 0.95 && r.preemptions >= 1.0);
    (waiting && ttft) || kv
}

/// Now in unix seconds.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}
