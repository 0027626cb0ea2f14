//! What a finished request tells: `Recreated` when every container was recreated,
//! else a `RecreateFailed` warning naming the containers and why.

use rigger_api::container_recreate_request::{
    ContainerRecreatePhase, ContainerRecreateRequest, CrrStatus,
};

use crate::events::{Event, Regarding};
use rigger_store::ObjectKey;

/// A request's recreate worked.
pub const RECREATED: &str = "Recreated";
/// A request ended with containers not recreated.
pub const RECREATE_FAILED: &str = "RecreateFailed";

/// The event for the request `key`, now completed with `status`.
pub fn completed(key: &ObjectKey, request: &ContainerRecreateRequest, status: &CrrStatus) -> Event {
    let regarding = Regarding {
        api_version: request.api_version.clone(),
        kind: key.kind.clone(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        uid: request.metadata.uid.clone().unwrap_or_default(),
    };
    let pod = &request.spec.pod_name;
    let (done, failed): (Vec<_>, Vec<_>) = status
        .container_recreate_states
        .iter()
        .partition(|state| state.phase == ContainerRecreatePhase::Succeeded);
    if failed.is_empty() {
        let names: Vec<&str> = done.iter().map(|s| s.name.as_str()).collect();
        Event {
            regarding,
            warning: false,
            reason: RECREATED,
            message: format!("Recreated {} in pod {pod}", names.join(", ")),
        }
    } else {
        let names: Vec<&str> = failed.iter().map(|s| s.name.as_str()).collect();
        Event {
            regarding,
            warning: true,
            reason: RECREATE_FAILED,
            message: format!(
                "Not recreated in pod {pod}: {} ({})",
                names.join(", "),
                status.message
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rigger_api::container_recreate_request::ContainerRecreateState;

    fn request() -> ContainerRecreateRequest {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "r", "namespace": "default", "uid": "u1"},
            "spec": {"podName": "web", "containers": [{"name": "app"}, {"name": "log"}]},
        }))
        .unwrap()
    }

    fn state(name: &str, phase: ContainerRecreatePhase) -> ContainerRecreateState {
        ContainerRecreateState {
            name: name.to_owned(),
            phase,
            ..ContainerRecreateState::default()
        }
    }

    #[test]
    fn every_container_recreated_is_normal_and_any_failed_is_a_warning_naming_it() {
        let key = ObjectKey::new("ContainerRecreateRequest", "default", "r");
        let mut status = CrrStatus {
            container_recreate_states: vec![
                state("app", ContainerRecreatePhase::Succeeded),
                state("log", ContainerRecreatePhase::Succeeded),
            ],
            ..CrrStatus::default()
        };
        let ok = completed(&key, &request(), &status);
        assert_eq!((ok.reason, ok.warning), (RECREATED, false));
        assert_eq!(ok.message, "Recreated app, log in pod web");
        assert_eq!(ok.regarding.uid, "u1");

        status.container_recreate_states[1].phase = ContainerRecreatePhase::Failed;
        status.message = "preStop failed".to_owned();
        let failed = completed(&key, &request(), &status);
        assert_eq!((failed.reason, failed.warning), (RECREATE_FAILED, true));
        assert_eq!(
            failed.message,
            "Not recreated in pod web: log (preStop failed)"
        );
    }
}
