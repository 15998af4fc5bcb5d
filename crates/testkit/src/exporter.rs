//! A scripted `/metrics` exporter whose values the test sets: exact, known
//! server signals for tests of the signal sources and of the congestion
//! rules, independent of any engine's timing. It writes vLLM's metric names
//! or SGLang's (names, labels and TTFT buckets as each server exposes them),
//! and can leave out the preemption counter, as llm-d-inference-sim does.
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

/// SGLang's default TTFT bucket bounds.
pub const SGLANG_TTFT_BOUNDS: [f64; 18] = [
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
];

/// Whose metric names the exporter writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Names {
    #[default]
    Vllm,
    Sglang,
}

impl Names {
    /// (waiting, running, KV usage, preemption counter, generation token
    /// counter, TTFT histogram, ITL histogram).
    fn metrics(self) -> [&'static str; 7] {
        match self {
            Names::Vllm => [
                "vllm:num_requests_waiting",
                "vllm:num_requests_running",
                "vllm:kv_cache_usage_perc",
                "vllm:num_preemptions_total",
                "vllm:generation_tokens_total",
                "vllm:time_to_first_token_seconds",
                "vllm:inter_token_latency_seconds",
            ],
            Names::Sglang => [
                "sglang:num_queue_reqs",
                "sglang:num_running_reqs",
                "sglang:token_usage",
                "sglang:num_retracted_requests_total",
                "sglang:generation_tokens_total",
                "sglang:time_to_first_token_seconds",
                "sglang:inter_token_latency_seconds",
            ],
        }
    }

    fn ttft_bounds(self) -> &'static [f64] {
        match self {
            Names::Vllm => &TTFT_BOUNDS,
            Names::Sglang => &SGLANG_TTFT_BOUNDS,
        }
    }

    /// The labels of every series (sorted, as prometheus_client writes them).
    fn labels(self) -> &'static str {
        match self {
            Names::Vllm => r#"engine="0",model_name="m""#,
            Names::Sglang => r#"engine_type="unified",model_name="m",pp_rank="0",tp_rank="0""#,
        }
    }
}

/// The state of a scripted server.
#[derive(Debug, Clone, Default)]
pub struct Engine {
    pub waiting: f64,
    pub running: f64,
    pub kv: f64,
    pub preemptions: f64,
    pub generation_tokens: f64,
    /// Cumulative TTFT bucket counts, one per bound of the server's TTFT
    /// buckets, then +Inf.
    pub ttft: Vec<f64>,
    pub ttft_sum: f64,
    pub names: Names,
    /// Leave the preemption counter out of the exposition.
    pub without_preemptions: bool,
}

impl Engine {
    /// A vLLM-like server.
    pub fn new() -> Self {
        Self::with_names(Names::Vllm)
    }

    /// An SGLang-like server.
    pub fn sglang() -> Self {
        Self::with_names(Names::Sglang)
    }

    fn with_names(names: Names) -> Self {
        Engine {
            ttft: vec![0.0; names.ttft_bounds().len() + 1],
            names,
            ..Default::default()
        }
    }

    /// Records one TTFT observation.
    pub fn observe_ttft(&mut self, seconds: f64) {
        let bounds = self.names.ttft_bounds();
        for (i, b) in bounds.iter().enumerate() {
            if seconds <= *b {
                self.ttft[i] += 1.0;
            }
        }
        self.ttft[bounds.len()] += 1.0;
        self.ttft_sum += seconds;
    }

    /// The exposition text, in prometheus_client's style (floats, sorted labels).
    pub fn exposition(&self) -> String {
        let [waiting, running, kv, preemptions, generation, ttft, itl] = self.names.metrics();
        let l = self.names.labels();
        let mut s = String::new();
        let mut one = |kind: &str, name: &str, v: f64| {
            s.push_str(&format!(
                "# HELP {name} x\n# TYPE {name} {kind}\n{name}{{{l}}} {v:?}\n"
            ));
        };
        one("gauge", waiting, self.waiting);
        one("gauge", running, self.running);
        one("gauge", kv, self.kv);
        if !self.without_preemptions {
            one("counter", preemptions, self.preemptions);
        }
        one("counter", generation, self.generation_tokens);
        s.push_str(&format!("# TYPE {ttft} histogram\n"));
        let bounds = self.names.ttft_bounds();
        let (before, after) = l.split_once(r#",model_name="m""#).unwrap_or((l, ""));
        for (i, c) in self.ttft.iter().enumerate() {
            let le = bounds
                .get(i)
                .map(|b| format!("{b:?}"))
                .unwrap_or_else(|| "+Inf".into());
            // `le` sorts between the labels before and after model_name.
            s.push_str(&format!(
                "{ttft}_bucket{{{before},le=\"{le}\",model_name=\"m\"{after}}} {c:?}\n"
            ));
        }
        s.push_str(&format!(
            "{ttft}_count{{{l}}} {:?}\n{ttft}_sum{{{l}}} {:?}\n",
            self.ttft[bounds.len()],
            self.ttft_sum
        ));
        // An ITL histogram without observations, so that every signal has
        // its series.
        s.push_str(&format!(
            "# TYPE {itl} histogram\n{itl}_bucket{{{before},le=\"+Inf\",model_name=\"m\"{after}}} 0.0\n{itl}_count{{{l}}} 0.0\n{itl}_sum{{{l}}} 0.0\n"
        ));
        s
    }
}

/// Serves `app` on an ephemeral loopback port, in the background.
pub(crate) async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
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
        Exporter {
            addr: serve(app).await,
            engine,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    pub fn update(&self, f: impl FnOnce(&mut Engine)) {
        f(&mut self.engine.lock().unwrap());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_each_servers_names_and_buckets() {
        let mut vllm = Engine::new();
        vllm.observe_ttft(0.3);
        let text = vllm.exposition();
        assert!(text.contains("vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0\n"));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.5\",model_name=\"m\"} 1.0\n"
        ));
        assert!(text.contains("vllm:num_preemptions_total"));

        let mut sglang = Engine::sglang();
        sglang.observe_ttft(0.3);
        sglang.without_preemptions = true;
        let text = sglang.exposition();
        assert!(text.contains(
            "sglang:num_queue_reqs{engine_type=\"unified\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"0\"} 0.0\n"
        ));
        assert!(text.contains(
            "sglang:time_to_first_token_seconds_bucket{engine_type=\"unified\",le=\"0.4\",model_name=\"m\",pp_rank=\"0\",tp_rank=\"0\"} 1.0\n"
        ));
        assert!(text.contains("le=\"+Inf\""));
        assert!(
            !text.contains("retracted") && !text.contains("vllm:"),
            "{text}"
        );
    }
}
