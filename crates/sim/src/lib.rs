//! A simulated vLLM server whose congestion is real: continuous batching, a
//! paged KV cache with preemption, a FIFO waiting queue, an OpenAI-compatible
//! API and vLLM's `/metrics`. It is what `nyann-bench demo`, the tests and the
//! benchmarks run against.
//!
//! ```no_run
//! # async fn f() -> Result<(), nyann_sim::SimError> {
//! let sim = nyann_sim::start(nyann_sim::SimConfig::default()).await?;
//! let base_url = format!("http://{}/v1", sim.endpoint());
//! for (role, addr) in sim.metrics_endpoints() { println!("{role} http://{addr}/metrics"); }
//! sim.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Modules: [`engine`] (the deterministic scheduler, with its step-time
//! formula), [`prefix`] (the prefix cache), [`metrics`] (vLLM's exposition), [`backend`] (engines on the
//! wall clock), `api` (HTTP), [`tokens`] (token counting), [`record`] (the
//! per-request timing record), [`config`] (its configuration and profiles), [`fit`] (a time model fitted to recorded runs).

mod api;
pub mod backend;
pub mod config;
pub mod engine;
pub mod fit;
pub mod metrics;
pub mod prefix;
pub mod profile;
pub mod record;
pub mod reference;
pub mod sweep;
pub mod tokens;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{ConfigError, Profile, SimConfig};
pub use metrics::EngineMetrics;
pub use profile::{ProfileError, ServerProfile};
pub use record::{RequestLog, RequestRecord};

use api::{App, Backend, Faults};
use backend::{EngineHandle, FastBackend};
use engine::Engine;
use profile::Role;

/// How long [`RunningSim::shutdown`] lets open responses finish.
const GRACE: Duration = Duration::from_secs(2);

/// The fast profile's context limit (it has no KV cache to bound it).
const FAST_MAX_MODEL_LEN: u32 = 1 << 20;

/// Why the simulator could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The cause is in the message (not a `source`, or it is said twice).
    #[error("invalid simulator settings: {0}")]
    Config(ConfigError),
    /// The profile with the overrides applied is out of range.
    #[error("invalid simulator settings: {0}")]
    InvalidProfile(String),
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// An eval dataset to answer from (`eval_gsm8k`, `eval_gpqa`). (Not a
    /// `source`: a printed error chain says it once.)
    #[error("eval dataset {0}")]
    Dataset(nyann_datasets::DatasetError),
    // The OS error is the source (printed once, after the hint).
    #[error("cannot listen on {addr} (is the port in use? use port 0 for an ephemeral one)")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

impl From<nyann_datasets::DatasetError> for SimError {
    fn from(error: nyann_datasets::DatasetError) -> Self {
        SimError::Dataset(error)
    }
}

/// A simulator serving in the background of the current tokio runtime.
pub struct RunningSim {
    endpoint: SocketAddr,
    metrics: Vec<(String, SocketAddr)>,
    log: RequestLog,
    app: Arc<App>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    engines: Vec<(EngineHandle, JoinHandle<()>)>,
}

impl RunningSim {
    /// Address of the OpenAI API (base URL `http://ADDR/v1`).
    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    /// `http://ADDR/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.endpoint)
    }

    /// Role and address of each `/metrics`: `("aggregate", endpoint)`, or
    /// `("prefill", ..)` and `("decode", ..)` in disaggregated mode.
    pub fn metrics_endpoints(&self) -> Vec<(String, SocketAddr)> {
        self.metrics.clone()
    }

    /// The per-request timing record (shared, live).
    pub fn request_log(&self) -> RequestLog {
        self.log.clone()
    }

    /// A copy of the timing record, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.log.snapshot(None)
    }

    /// A copy of each engine's metric values, by role.
    pub fn engine_metrics(&self) -> Vec<(String, EngineMetrics)> {
        match &self.app.backend {
            Backend::Aggregate(e) => vec![("aggregate".into(), e.metrics())],
            Backend::Disaggregated { prefill, decode } => {
                vec![
                    ("prefill".into(), prefill.metrics()),
                    ("decode".into(), decode.metrics()),
                ]
            }
            Backend::Fast(f) => vec![("aggregate".into(), f.metrics_snapshot())],
        }
    }

    /// Stop accepting connections, give open responses up to 2 s, then stop everything.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for mut server in std::mem::take(&mut self.servers) {
            if tokio::time::timeout(GRACE, &mut server).await.is_err() {
                server.abort();
                let _ = server.await;
            }
        }
        for (handle, task) in std::mem::take(&mut self.engines) {
            handle.stop();
            let _ = tokio::time::timeout(GRACE, task).await;
        }
    }
}

impl Drop for RunningSim {
    /// Dropped without `shutdown` (e.g. a failing test): stop at once rather than serve on.
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for server in &self.servers {
            server.abort();
        }
        for (handle, task) in &self.engines {
            handle.stop();
            task.abort();
        }
    }
}

/// Connections the kernel may hold ready before the server accepts them
/// (capped by `net.core.somaxconn`, 4096 by default). tokio's `bind` asks
/// for 1024: a load generator opening 16,384 connections at once then has
/// connects dropped and retried after 1, 3, 7... seconds.
const BACKLOG: u32 = 65_535;

async fn bind(host: &str, port: u16) -> Result<TcpListener, SimError> {
    let error = |source| SimError::Bind {
        addr: format!("{host}:{port}"),
        source,
    };
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await.map_err(error)? {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()
        } else {
            tokio::net::TcpSocket::new_v6()
        };
        let listener = socket.and_then(|socket| {
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(BACKLOG)
        });
        match listener {
            Ok(listener) => return Ok(listener),
            Err(err) => last = Some(err),
        }
    }
    Err(error(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "the host has no address")
    })))
}

fn serve(
    listener: TcpListener,
    router: axum::Router,
    stop: &watch::Sender<bool>,
) -> JoinHandle<()> {
    let mut rx = stop.subscribe();
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        // Without TCP_NODELAY, Nagle's algorithm holds each small SSE chunk
        // until the client's delayed ACK (~40 ms): a latency that real
        // servers (uvicorn sets nodelay) do not add.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("cannot set TCP_NODELAY: {e}");
            }
        });
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::warn!("simulator server stopped: {e}");
        }
    })
}

fn local_addr(l: &TcpListener, host: &str) -> Result<SocketAddr, SimError> {
    l.local_addr().map_err(|source| SimError::Bind {
        addr: host.to_string(),
        source,
    })
}

/// Start the simulator: bind every listener, spawn the engines and servers.
pub async fn start(args: SimConfig) -> Result<RunningSim, SimError> {
    args.validate().map_err(SimError::Config)?;
    let profile = args.server_profile().await?;
    if let Some(p) = &profile {
        p.validate().map_err(SimError::InvalidProfile)?;
    }
    // The flag, or the profile's own (see `SimConfig::server_profile`).
    let disaggregated = profile.as_ref().is_some_and(|p| p.disaggregated);
    let (stop, _) = watch::channel(false);
    let listener = bind(&args.host, args.port).await?;
    let endpoint = local_addr(&listener, &args.host)?;

    let mut engines = Vec::new();
    let mut metrics = Vec::new();
    let mut extra = Vec::new();
    // Each engine's jitter has its own seed (prefill and decode differ).
    let new_engine = |profile: &ServerProfile, role: Role, role_seed: u64| {
        let cfg = profile
            .engine(role)
            .config(args.seed.wrapping_mul(0x9e37_79b9).wrapping_add(role_seed));
        let m = EngineMetrics::new(&args.model, "0", cfg.max_model_len()).with_cache_config(
            cfg.kv_blocks,
            cfg.block_size,
            cfg.prefix_caching,
        );
        Engine::new(cfg, m)
    };
    // The engine that computes prompts is the one whose cache they hit.
    let prefix_block_size = profile.as_ref().and_then(|p| {
        let role = if disaggregated {
            Role::Prefill
        } else {
            Role::Aggregate
        };
        let l = p.engine(role).limits;
        l.enable_prefix_caching.then_some(l.block_size)
    });
    let (backend, max_model_len, chat_template_tokens, default_max_tokens) = match profile {
        None => {
            let (ttft, per_token) = args.fast_timings();
            let m = EngineMetrics::new(&args.model, "0", FAST_MAX_MODEL_LEN);
            metrics.push(("aggregate".to_string(), endpoint));
            (
                Backend::Fast(Arc::new(FastBackend::new(ttft, per_token, m))),
                FAST_MAX_MODEL_LEN,
                0,
                args.fast_default_max_tokens(),
            )
        }
        Some(p) if !disaggregated => {
            let engine = new_engine(&p, Role::Aggregate, 0);
            let len = engine.config().max_model_len();
            let (h, task) = EngineHandle::spawn(engine, args.max_waiting);
            engines.push((h.clone(), task));
            metrics.push(("aggregate".to_string(), endpoint));
            (
                Backend::Aggregate(h),
                len,
                p.chat_template_tokens,
                p.default_max_tokens,
            )
        }
        Some(p) => {
            let prefill = new_engine(&p, Role::Prefill, 1);
            let decode = new_engine(&p, Role::Decode, 2);
            // A request must fit both engines.
            let len = prefill
                .config()
                .max_model_len()
                .min(decode.config().max_model_len());
            let (pre, pre_task) = EngineHandle::spawn(prefill, args.max_waiting);
            let (dec, dec_task) = EngineHandle::spawn(decode, None);
            engines.push((pre.clone(), pre_task));
            engines.push((dec.clone(), dec_task));
            for (role, port, h) in [
                ("prefill", args.prefill_metrics_port, &pre),
                ("decode", args.decode_metrics_port, &dec),
            ] {
                let l = bind(&args.host, port).await?;
                metrics.push((role.to_string(), local_addr(&l, &args.host)?));
                extra.push((l, api::metrics_router(h.clone())));
            }
            (
                Backend::Disaggregated {
                    prefill: pre,
                    decode: dec,
                },
                len,
                p.chat_template_tokens,
                p.default_max_tokens,
            )
        }
    };
    let log = RequestLog::new(args.record_capacity);
    let eval = match (&args.eval_gsm8k, &args.eval_gpqa) {
        (Some(path), _) => Some(nyann_datasets::EvalSet::gsm8k(path, None, 0)?),
        (None, Some(path)) => Some(nyann_datasets::EvalSet::gpqa(path, args.seed)?),
        (None, None) => None,
    };
    let app = Arc::new(App {
        model_json: serde_json::Value::String(args.model.clone()).to_string(),
        model: args.model.clone(),
        max_model_len,
        chat_template_tokens,
        default_max_tokens,
        prefix_block_size,
        prompt_tokens_details: args.enable_prompt_tokens_details,
        force_include_usage: args.enable_force_include_usage,
        seed: args.seed,
        created: record::unix_now() as u64,
        next: AtomicU64::new(0),
        backend,
        faults: Faults {
            seed: args.seed,
            error_rate: args.fault_error_rate,
            cut_rate: args.fault_cut_rate,
            cut_after: args.fault_cut_after,
            stall_rate: args.fault_stall_rate,
            stall: args.fault_stall,
            reset_rate: args.fault_reset_rate,
        },
        log: log.clone(),
        eval: eval.map(|set| api::Eval {
            set,
            accuracy: args.eval_accuracy,
            busy: args
                .eval_busy_accuracy
                .map(|accuracy| (args.eval_busy_above, accuracy)),
        }),
        in_flight: Arc::new(AtomicU64::new(0)),
    });
    let mut servers = vec![serve(listener, api::router(app.clone()), &stop)];
    for (l, r) in extra {
        servers.push(serve(l, r, &stop));
    }
    Ok(RunningSim {
        endpoint,
        metrics,
        log,
        app,
        stop,
        servers,
        engines,
    })
}
