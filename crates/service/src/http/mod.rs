//! The HTTP interfaces over the [`Service`]: the JSON API under `/api/v1`,
//! MCP on `/mcp` ([`crate::mcp`]), the web page at `/`, and `/healthz`. Every route but `/healthz` and the
//! page (which holds no data: it asks the API with the token its user
//! gives) needs a bearer token; a request from a foreign `Origin` is
//! refused (a web page elsewhere cannot drive the service through a
//! browser, the DNS-rebinding advice of the MCP specification).

mod api;
mod guard;
mod page;
pub mod tls;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::auth::Tokens;
use crate::service::Service;

/// The largest request body: a 64 KiB scenario as a JSON string, with room.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// What the routes share.
#[derive(Clone)]
pub struct App {
    pub service: Arc<Service>,
    pub tokens: Arc<Tokens>,
    /// Origins allowed besides the service's own (`scheme://host:port`).
    pub allowed_origins: Arc<Vec<String>>,
    /// The `Host` headers `/mcp` answers (`host` or `host:port`; see
    /// [`allowed_hosts`]).
    pub allowed_hosts: Arc<Vec<String>>,
}

/// The `Host` headers MCP clients may send (rmcp refuses others, against
/// DNS rebinding): the loopback names, the address the service listens on
/// (unless it is every interface's), the hosts of the allowed origins, and
/// the operator's `extra` names.
pub fn allowed_hosts(
    listen: std::net::SocketAddr,
    allowed_origins: &[String],
    extra: &[String],
) -> Vec<String> {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .map(String::from)
        .collect();
    if !listen.ip().is_unspecified() {
        hosts.push(listen.ip().to_string());
    }
    for origin in allowed_origins {
        let rest = origin.split_once("://").map_or(origin.as_str(), |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or_default();
        if !authority.is_empty() {
            hosts.push(authority.to_string());
        }
    }
    hosts.extend(extra.iter().cloned());
    hosts.dedup();
    hosts
}

/// The service's routes.
pub fn router(app: App) -> Router {
    let api = Router::new()
        .route("/targets", get(api::targets))
        .route("/plan", post(api::plan))
        .route("/runs", get(api::list).post(api::submit))
        .route("/runs/{id}", get(api::get))
        .route("/runs/{id}/cancel", post(api::cancel))
        .route("/runs/{id}/artifacts", get(api::artifacts))
        .route("/runs/{id}/artifacts/{name}", get(api::artifact))
        .route("/runs/{id}/report.html", get(api::report))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            guard::authenticate,
        ));
    let mcp = Router::new()
        .route_service(
            "/mcp",
            crate::mcp::endpoint(
                Arc::clone(&app.service),
                app.allowed_hosts.to_vec(),
                MAX_BODY_BYTES,
            ),
        )
        .layer(axum::middleware::from_fn(crate::mcp::well_formed))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            guard::authenticate,
        ));
    Router::new()
        .nest("/api/v1", api)
        .merge(mcp)
        .route("/", get(page::index))
        .route("/healthz", get(|| async { "ok\n" }))
        // Browsers ask for it: no icon, and no error in their console.
        .route(
            "/favicon.ico",
            get(|| async { axum::http::StatusCode::NO_CONTENT }),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            guard::same_origin,
        ))
        .with_state(app)
}

/// Serves `router` on `listener` (plain TCP, or [`tls::TlsListener`])
/// until `shutdown` completes.
pub async fn serve<L>(
    listener: L,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
