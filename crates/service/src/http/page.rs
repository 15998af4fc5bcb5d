//! The web page at `/`: the runs, their reports, a running run's stages.

use axum::response::Html;

pub async fn index() -> Html<&'static str> {
    Html(include_str!("page.html"))
}
