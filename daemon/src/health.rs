//! `/healthz` (the process is alive) and `/readyz` (it can do its job) over HTTP.

use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

/// Readiness shared between the daemon's workers and the health endpoint.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    // None = ready; Some(reason) = not ready and why.
    not_ready: Arc<RwLock<Option<String>>>,
}

impl Readiness {
    /// Starts not ready, with `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            not_ready: Arc::new(RwLock::new(Some(reason.into()))),
        }
    }

    pub fn set_ready(&self) {
        self.set(None);
    }

    pub fn set_not_ready(&self, reason: impl Into<String>) {
        self.set(Some(reason.into()));
    }

    /// `Ok(())` when ready, otherwise the reason.
    pub fn check(&self) -> Result<(), String> {
        match self.not_ready.read() {
            Ok(guard) => guard.clone().map_or(Ok(()), Err),
            Err(_) => Err("readiness state poisoned".to_owned()),
        }
    }

    fn set(&self, value: Option<String>) {
        if let Ok(mut guard) = self.not_ready.write() {
            *guard = value;
        }
    }
}

/// Routes for `/healthz` and `/readyz`; merge more routes into it.
pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

async fn readyz(State(readiness): State<Readiness>) -> (StatusCode, String) {
    match readiness.check() {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_transitions() {
        let r = Readiness::new("starting");
        assert_eq!(r.check(), Err("starting".to_owned()));
        r.set_ready();
        assert_eq!(r.check(), Ok(()));
        r.set_not_ready("containerd unreachable");
        assert_eq!(r.check(), Err("containerd unreachable".to_owned()));
    }
}
