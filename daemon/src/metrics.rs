//! `/metrics` in Prometheus' text format (OpenMetrics), from a `prometheus-client`
//! registry the daemon fills at start.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;

/// The route for `/metrics`; merge it into the health router.
pub fn router(registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(registry)
}

async fn metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    let mut text = String::new();
    match encode(&mut text, &registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("cannot encode metrics: {error}\n"),
        ),
    }
}
