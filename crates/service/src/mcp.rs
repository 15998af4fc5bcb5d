//! The MCP interface on `/mcp`: seven tools over the [`Service`], served
//! with the official SDK (`rmcp`) as streamable HTTP without sessions, for
//! protocol revisions 2026-07-28 (stateless, `server/discover`) and
//! 2025-11-25 (the `initialize` handshake). It sits behind the same
//! bearer-token guard and `Origin` check as the JSON API ([`crate::http`]),
//! and each tool checks the caller's scope as the API does (the same
//! [`Service`] methods). A refusal or a bad request is a tool error
//! (`isError`) whose text says what to change.

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    ClientJsonRpcMessage, Implementation, ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::plan::{Plan, PlanRequest};
use crate::report::RunReport;
use crate::service::{RunDetail, RunView, Service, ServiceError, TargetView};

/// The protocol revisions served: the stateless one and the last with the
/// `initialize` handshake.
pub const PROTOCOL_VERSIONS: &[ProtocolVersion] =
    &[ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2026_07_28];

/// The `/mcp` endpoint: no sessions (each request stands alone, as the
/// 2026-07-28 revision has it), JSON answers, request bodies within
/// `max_body_bytes`, and `Host` headers among `allowed_hosts` (rmcp's
/// DNS-rebinding check).
pub fn endpoint(
    service: Arc<Service>,
    allowed_hosts: Vec<String>,
    max_body_bytes: usize,
) -> StreamableHttpService<Tools, NeverSessionManager> {
    let tools = Tools::new(service);
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(allowed_hosts)
        .with_max_request_body_bytes(max_body_bytes);
    StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// Answers a POST whose body is not a JSON-RPC message with a JSON-RPC
/// error (400: -32700 for a body that is not JSON, -32600 for JSON that is
/// no message), before rmcp sees it; rmcp itself would answer 415 with
/// plain text. A body over `MAX_BODY_BYTES` is refused (413) as it is read.
pub async fn well_formed(request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let limit = crate::http::MAX_BODY_BYTES;
    let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
        return jsonrpc_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            serde_json::Value::Null,
            -32600,
            &format!("the request body is over {limit} bytes: send one JSON-RPC message"),
        );
    };
    let value: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(value) => value,
        Err(e) => {
            return jsonrpc_error(
                StatusCode::BAD_REQUEST,
                serde_json::Value::Null,
                -32700,
                &format!("parse error: the body is not JSON ({e}): send one JSON-RPC 2.0 message"),
            );
        }
    };
    if let Err(e) = serde_json::from_value::<ClientJsonRpcMessage>(value.clone()) {
        let id = value.get("id").cloned().unwrap_or_default();
        return jsonrpc_error(
            StatusCode::BAD_REQUEST,
            id,
            -32600,
            &format!(
                "invalid request: not a JSON-RPC 2.0 message MCP knows ({e}): send \"jsonrpc\": \"2.0\", a method and its params object"
            ),
        );
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn jsonrpc_error(status: StatusCode, id: serde_json::Value, code: i64, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message },
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The tools, over the service.
#[derive(Clone)]
pub struct Tools {
    service: Arc<Service>,
    tool_router: ToolRouter<Tools>,
}

/// A run, by its id.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunId {
    /// The run's id (`r-` and 16 hexadecimal digits), as `submit_run` and
    /// `list_runs` give it.
    pub id: String,
}

/// A submitted run.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Submitted {
    #[serde(flatten)]
    pub run: RunView,
    /// False when the same request was submitted before: this is that run.
    pub created: bool,
}

/// The runs, newest first, and the targets runs may name.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Runs {
    pub runs: Vec<RunView>,
    pub targets: Vec<TargetView>,
}

/// A run's files.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Artifacts {
    pub id: String,
    pub artifacts: Vec<ArtifactLink>,
}

/// One file of a run, and where the JSON API serves it (a GET with the
/// same bearer token).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ArtifactLink {
    pub name: String,
    pub bytes: u64,
    pub path: String,
}

fn refused(err: ServiceError) -> String {
    let internal = match &err {
        ServiceError::Plan(plan) => plan.is_internal(),
        ServiceError::Store(_) | ServiceError::Io(_) | ServiceError::Cluster(_) => true,
        _ => false,
    };
    if internal {
        tracing::error!("mcp: {err}");
    }
    err.to_string()
}

/// Who calls: the guard put the token's caller in the HTTP request.
fn caller(parts: &Parts) -> Result<&Caller, String> {
    parts.extensions.get::<Caller>().ok_or_else(|| {
        "the service found no bearer token in this request: send `Authorization: Bearer TOKEN`"
            .to_string()
    })
}

#[tool_router]
impl Tools {
    pub fn new(service: Arc<Service>) -> Tools {
        Tools {
            service,
            tool_router: Self::tool_router(),
        }
    }

    /// Compiles a Starlark scenario for a target and checks it against the
    /// target's bounds and signal source, without running anything: the
    /// stages with their levels, the longest and shortest durations, warnings.
    #[tool(annotations(
        title = "Plan a run",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn plan_run(
        &self,
        Parameters(request): Parameters<PlanRequest>,
    ) -> Result<Json<Plan>, String> {
        let plan = self.service.plan(&request).await;
        plan.map(Json).map_err(|e| refused(e.into()))
    }

    /// Plans a scenario again and queues it on its target (one run at a time
    /// per target). The same request gives the same run. Needs a token of
    /// scope submit allowed on the target.
    #[tool(annotations(
        title = "Submit a run",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn submit_run(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(request): Parameters<PlanRequest>,
    ) -> Result<Json<Submitted>, String> {
        let caller = caller(&parts)?;
        let (run, created) = self
            .service
            .submit_as(caller, &request)
            .await
            .map_err(refused)?;
        Ok(Json(Submitted { run, created }))
    }

    /// The runs, newest first (status, queue position, who submitted), and
    /// the targets a scenario may name with their bounds.
    #[tool(annotations(
        title = "List runs and targets",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn list_runs(&self) -> Result<Json<Runs>, String> {
        let runs = self.service.list().map_err(refused)?;
        Ok(Json(Runs {
            runs,
            targets: self.service.target_views(),
        }))
    }

    /// One run: its status, plan and, once it ends, its summary.
    #[tool(annotations(
        title = "Get a run",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn get_run(
        &self,
        Parameters(RunId { id }): Parameters<RunId>,
    ) -> Result<Json<RunDetail>, String> {
        self.service.get(&id).map(Json).map_err(refused)
    }

    /// Cancels a queued run, or interrupts a running one and waits for its
    /// drain (its completed records are kept). Needs scope submit for one's
    /// own runs, admin for another's.
    #[tool(annotations(
        title = "Cancel a run",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    ))]
    async fn cancel_run(
        &self,
        Extension(parts): Extension<Parts>,
        Parameters(RunId { id }): Parameters<RunId>,
    ) -> Result<Json<RunView>, String> {
        let caller = caller(&parts)?;
        let run = self.service.cancel_as(caller, &id).await;
        run.map(Json).map_err(refused)
    }

    /// A run's files (records, stages, summary, HTML report, log) and the
    /// JSON API path that serves each.
    #[tool(annotations(
        title = "List a run's artifacts",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn list_artifacts(
        &self,
        Parameters(RunId { id }): Parameters<RunId>,
    ) -> Result<Json<Artifacts>, String> {
        let artifacts = self.service.artifacts(&id).map_err(refused)?;
        let artifacts = artifacts
            .into_iter()
            .map(|a| ArtifactLink {
                path: format!("/api/v1/runs/{id}/artifacts/{}", a.name),
                name: a.name,
                bytes: a.bytes,
            })
            .collect();
        Ok(Json(Artifacts { id, artifacts }))
    }

    /// A run's report in brief: each stage's congestion verdict, where a
    /// sweep stopped the run and why, the capacity (knee) each sweep found,
    /// and the HTML report's path.
    #[tool(annotations(
        title = "Report of a run",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    ))]
    async fn get_report(
        &self,
        Parameters(RunId { id }): Parameters<RunId>,
    ) -> Result<Json<RunReport>, String> {
        self.service.report(&id).map(Json).map_err(refused)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        let targets: Vec<String> = self
            .service
            .target_views()
            .iter()
            .map(|t| {
                format!(
                    "{}{}",
                    t.name,
                    if t.signals { " (until_congested)" } else { "" }
                )
            })
            .collect();
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "nyann-bench",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(format!(
                "nyann-bench runs load sweeps against the operator's inference servers. \
                 Plan a Starlark scenario for a target (plan_run), submit it (submit_run), \
                 poll get_run until its status is no longer queued or running, then read \
                 get_report. Targets: {}.",
                targets.join(", ")
            ))
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(PROTOCOL_VERSIONS)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every tool has annotations and an object output schema (rmcp lists
    /// a schema whose root is not an object to no peer before 2026-07-28).
    #[test]
    fn every_tool_has_annotations_and_an_object_output_schema() {
        let tools = Tools::tool_router().list_all();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "cancel_run",
                "get_report",
                "get_run",
                "list_artifacts",
                "list_runs",
                "plan_run",
                "submit_run"
            ]
        );
        for tool in &tools {
            let schema = tool.output_schema.as_ref().unwrap();
            assert_eq!(schema["type"], "object", "{}", tool.name);
            let hints = tool.annotations.as_ref().unwrap();
            assert!(hints.read_only_hint.is_some(), "{}", tool.name);
            assert!(tool.description.is_some(), "{}", tool.name);
        }
    }
}
