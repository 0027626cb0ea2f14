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

/// The series a registry serves, as users query them (counters with `_total`); tests
/// compare them with the operator guide's tables.
pub fn series_names(registry: &Registry) -> Vec<String> {
    let mut text = String::new();
    if encode(&mut text, registry).is_err() {
        return Vec::new();
    }
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let (name, kind) = rest.split_once(' ')?;
            Some(if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_owned()
            })
        })
        .collect()
}

/// Compare the series `registry` serves with those `markdown` lists under `prefix`:
/// `Err` says which are missing on either side (each daemon's tests call it with the
/// operator guide).
pub fn check_documented(registry: &Registry, markdown: &str, prefix: &str) -> Result<(), String> {
    let mut served = series_names(registry);
    let mut documented = documented_series(markdown, prefix);
    served.sort();
    documented.sort();
    if served.is_empty() {
        return Err("the registry serves no series".to_owned());
    }
    let undocumented: Vec<_> = served.iter().filter(|s| !documented.contains(s)).collect();
    let unserved: Vec<_> = documented.iter().filter(|s| !served.contains(s)).collect();
    if undocumented.is_empty() && unserved.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "served but not documented: {undocumented:?}; documented but not served: {unserved:?}"
        ))
    }
}

/// The series a Markdown document lists in table rows that start with `` | `PREFIX``.
pub fn documented_series(markdown: &str, prefix: &str) -> Vec<String> {
    let start = format!("| `{prefix}");
    markdown
        .lines()
        .filter(|line| line.starts_with(&start))
        .filter_map(|line| line.split('`').nth(1).map(ToOwned::to_owned))
        .collect()
}
