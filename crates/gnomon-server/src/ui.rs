//! The web console and the API viewer, embedded in the binary (no CDN, no
//! network beyond this server).

use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;

/// The console's page, served at `/` and `/ui`.
pub const PAGE: &str = include_str!("../assets/console.html");
const SCRIPT: &str = include_str!("../assets/console.js");
/// The console's pipeline drawings (loaded before `console.js`).
const GRAPH_SCRIPT: &str = include_str!("../assets/console-graph.js");
/// The console's job form (loaded before `console.js`).
const FORM_SCRIPT: &str = include_str!("../assets/console-form.js");
const STYLE: &str = include_str!("../assets/console.css");
/// The API viewer at `/docs`: renders `/v1/openapi.json`.
pub const DOCS: &str = include_str!("../assets/docs.html");

/// The console's and the viewer's routes (no credential: the pages hold
/// no data; the API they call checks the caller).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let page = || async { Html(PAGE) };
    Router::new()
        .route("/", get(page))
        .route("/ui", get(page))
        .route("/ui/console.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT).into_response() }))
        .route(
            "/ui/console-graph.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], GRAPH_SCRIPT).into_response() }),
        )
        .route(
            "/ui/console-form.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], FORM_SCRIPT).into_response() }),
        )
        .route("/ui/console.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response() }))
        .route("/docs", get(|| async { Html(DOCS) }))
}
