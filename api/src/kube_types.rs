//! Kubernetes' own types (k8s-openapi) where a kind carries them as written — a
//! SidecarSet's containers and volumes, which kubelet carries out in a cluster — read
//! strictly, and turned into Rigger's pod types where Rigger's agent runs them.
//!
//! k8s-openapi's decoders pass unknown fields by (as the API server prunes them); here a
//! field neither Kubernetes nor Rigger knows is refused with its path, as every other
//! field of Rigger's kinds is.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Kubernetes' Pod, as the admission webhook gets it.
pub use k8s_openapi::api::core::v1::Pod as KubePod;
use serde_json::Value;

/// `written` decoded as Kubernetes' type `T`, refusing a field `T` does not have
/// (`"PATH: unknown field `NAME`"`, the path relative to `written`).
pub fn decode_strict<T: DeserializeOwned>(written: &Value) -> Result<T, String> {
    crate::strict::decode_strict(written.clone()).map_err(|e| {
        // An unknown field is named by its parent's path and its key.
        let path = match e.reason.starts_with("unknown field") {
            true => e.path.rfind('.').map_or("", |i| &e.path[..i]),
            false => e.path.as_str(),
        };
        if path.is_empty() {
            e.reason
        } else {
            format!("{path}: {}", e.reason)
        }
    })
}

/// Kubernetes' `kube` (already checked) as Rigger's own pod type `T`: `Err` names the
/// first field Rigger's agent does not carry out, with its path relative to `kube`.
pub fn to_rigger<K: Serialize, T: DeserializeOwned>(kube: &K) -> Result<T, String> {
    let value = serde_json::to_value(kube).map_err(|e| e.to_string())?;
    crate::strict::decode_strict(value).map_err(|e| {
        let Some(field) = e
            .reason
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
        else {
            return if e.path.is_empty() {
                e.reason
            } else {
                format!("{}: {}", e.path, e.reason)
            };
        };
        // The path ends with the unknown field itself.
        let parent = e.path.rfind('.').map_or("", |i| &e.path[..=i]);
        format!(
            "{parent}{field}: Rigger's agent does not carry this out on its own pods; kubelet does, in Kubernetes mode"
        )
    })
}

/// Kubernetes' `rigger` value (Rigger's pod type, a subset of Kubernetes') as
/// Kubernetes' type `K`: never loses a field, since every field of Rigger's is one of
/// Kubernetes'.
pub fn to_kube<R: Serialize, K: DeserializeOwned>(rigger: &R) -> Result<K, String> {
    let value = serde_json::to_value(rigger).map_err(|e| e.to_string())?;
    serde_json::from_value(value).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1 as core;

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        let ok: core::Container = decode_strict(&serde_json::json!({
            "name": "p", "image": "i", "restartPolicy": "Always",
            "volumeMounts": [{"name": "v", "mountPath": "/v", "subPath": "a"}],
            "env": [{"name": "X", "value": null}],
        }))
        .unwrap();
        assert_eq!(ok.restart_policy.as_deref(), Some("Always"));
        for (written, expected) in [
            (
                serde_json::json!({"name": "p", "imagePullPolcy": "Always"}),
                "unknown field `imagePullPolcy`",
            ),
            (
                serde_json::json!({"name": "p", "volumeMounts": [{"name": "v", "mountPath": "/v", "subpath": "a"}]}),
                "volumeMounts[0]: unknown field `subpath`",
            ),
            (
                serde_json::json!({"name": "p", "ports": [{"containerPort": "x"}]}),
                "ports[0].containerPort: invalid type",
            ),
        ] {
            let err = decode_strict::<core::Container>(&written).unwrap_err();
            assert!(err.starts_with(expected), "{err}\n  expected: {expected}");
        }
    }

    #[test]
    fn what_rigger_pods_lack_is_named() {
        let kube: core::Container = decode_strict(&serde_json::json!({
            "name": "p", "image": "i",
            "volumeMounts": [{"name": "v", "mountPath": "/v", "subPath": "a"}],
        }))
        .unwrap();
        let err = to_rigger::<_, rigger_proto::pod::Container>(&kube).unwrap_err();
        assert!(
            err.starts_with("volumeMounts[0].subPath: Rigger's agent does not carry this out"),
            "{err}"
        );
        let kube: core::Container = decode_strict(
            &serde_json::json!({"name": "p", "image": "i", "restartPolicy": "Always"}),
        )
        .unwrap();
        let err = to_rigger::<_, rigger_proto::pod::Container>(&kube).unwrap_err();
        assert!(err.starts_with("restartPolicy: Rigger's agent"), "{err}");
    }
}
