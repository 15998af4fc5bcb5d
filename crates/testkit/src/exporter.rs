//! A scripted vLLM-like `/metrics` exporter whose values the test sets:
//! exact, known server signals for tests of the signal sources and of the
//! congestion rules, independent of any engine's timing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::get;

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
