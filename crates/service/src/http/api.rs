//! The JSON API's handlers: each calls the service (which checks the
//! caller's scope) and answers JSON (errors as `{"error": "..."}` saying
//! what to change).

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::App;
use crate::auth::Caller;
use crate::plan::{PlanError, PlanRequest};
use crate::service::ServiceError;

/// An error answer: `{"error": MESSAGE}` with its status.
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

pub fn error(status: StatusCode, message: &str) -> ApiError {
    ApiError {
        status,
        message: message.to_string(),
    }
}

fn service_error(err: ServiceError) -> ApiError {
    let status = match &err {
        ServiceError::Plan(PlanError::UnknownTarget { .. }) | ServiceError::NotFound(_) => {
            StatusCode::NOT_FOUND
        }
        ServiceError::Plan(plan) if plan.is_internal() => StatusCode::INTERNAL_SERVER_ERROR,
        ServiceError::Plan(_) => StatusCode::BAD_REQUEST,
        ServiceError::Finished { .. } => StatusCode::CONFLICT,
        ServiceError::Denied(_) => StatusCode::FORBIDDEN,
        ServiceError::Store(_) | ServiceError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        // The API server did not do what was asked.
        ServiceError::Cluster(_) => StatusCode::BAD_GATEWAY,
    };
    if status.is_server_error() {
        tracing::error!("{err}");
    }
    error(status, &err.to_string())
}

fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(t)| t).map_err(|rejection| {
        error(
            rejection.status(),
            &format!(
                "the request body: {}; send JSON like {{\"target\": NAME, \"scenario\": STARLARK}}",
                rejection.body_text()
            ),
        )
    })
}

type Answer = Result<Response, ApiError>;

pub async fn targets(State(app): State<App>) -> Response {
    Json(json!({ "targets": app.service.target_views() })).into_response()
}

pub async fn plan(
    State(app): State<App>,
    request: Result<Json<PlanRequest>, JsonRejection>,
) -> Answer {
    let request = body(request)?;
    let plan = app
        .service
        .plan(&request)
        .await
        .map_err(|e| service_error(e.into()))?;
    Ok(Json(plan).into_response())
}

pub async fn submit(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    request: Result<Json<PlanRequest>, JsonRejection>,
) -> Answer {
    let request = body(request)?;
    let (run, created) = app
        .service
        .submit_as(&caller, &request)
        .await
        .map_err(service_error)?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(run)).into_response())
}

pub async fn list(State(app): State<App>) -> Answer {
    let runs = app.service.list().map_err(service_error)?;
    Ok(Json(json!({ "runs": runs })).into_response())
}

pub async fn get(State(app): State<App>, Path(id): Path<String>) -> Answer {
    Ok(Json(app.service.get(&id).map_err(service_error)?).into_response())
}

pub async fn cancel(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Answer {
    let run = app
        .service
        .cancel_as(&caller, &id)
        .await
        .map_err(service_error)?;
    Ok(Json(run).into_response())
}

pub async fn artifacts(State(app): State<App>, Path(id): Path<String>) -> Answer {
    let artifacts = app.service.artifacts(&id).map_err(service_error)?;
    Ok(Json(json!({ "artifacts": artifacts })).into_response())
}

pub async fn artifact(State(app): State<App>, Path((id, name)): Path<(String, String)>) -> Answer {
    file(&app, &id, &name).await
}

pub async fn report(State(app): State<App>, Path(id): Path<String>) -> Answer {
    file(&app, &id, nyann_results::REPORT).await
}

/// One of a run's artifacts, by name (only those the run lists).
async fn file(app: &App, id: &str, name: &str) -> Answer {
    let Some(path) = app.service.artifact_path(id, name).map_err(service_error)? else {
        return Err(error(
            StatusCode::NOT_FOUND,
            &format!("run {id} has no artifact {name:?} (yet): list its artifacts"),
        ));
    };
    let bytes = tokio::fs::read(&path).await.map_err(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot read {name}: {e}"),
        )
    })?;
    let kind = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => "application/json",
        Some("jsonl") => "application/x-ndjson",
        Some("html") => "text/html; charset=utf-8",
        Some("star" | "log" | "txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    };
    Ok(([(header::CONTENT_TYPE, kind)], bytes).into_response())
}
