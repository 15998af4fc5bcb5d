//! Who may call: the bearer token (401 with `WWW-Authenticate` without a
//! valid one) and the request's `Origin` (403 from a foreign one).

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::App;
use super::api::error;

/// Puts the token's [`crate::auth::Caller`] in the request, or answers 401.
pub async fn authenticate(State(app): State<App>, mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(token) = token else {
        return unauthorized(
            "Bearer realm=\"nyann-bench\"",
            "this needs a bearer token: send `Authorization: Bearer TOKEN` (the operator gives tokens)",
        );
    };
    let Some(caller) = app.tokens.caller(token.trim()).cloned() else {
        return unauthorized(
            "Bearer realm=\"nyann-bench\", error=\"invalid_token\"",
            "the bearer token is not one the service knows: check it with the operator",
        );
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

fn unauthorized(challenge: &'static str, message: &str) -> Response {
    let mut response = error(StatusCode::UNAUTHORIZED, message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static(challenge),
    );
    response
}

/// Refuses a request whose `Origin` is neither the service's own (its
/// `Host`) nor one the operator allowed. Requests without `Origin` (curl,
/// CI scripts, MCP clients outside a browser) pass.
pub async fn same_origin(State(app): State<App>, request: Request, next: Next) -> Response {
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let allowed = origin.to_str().ok().is_some_and(|origin| {
            is_own(origin, request.headers()) || app.allowed_origins.iter().any(|a| a == origin)
        });
        if !allowed {
            return error(
                StatusCode::FORBIDDEN,
                "requests from another origin are refused: open the service's own page, or ask the operator to allow this origin",
            )
            .into_response();
        }
    }
    next.run(request).await
}

fn is_own(origin: &str, headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|rest| rest == host)
}
