//! The SidecarSet webhook's answer to one admission review of a Pod (pure): the
//! SidecarSets matching the new pod are injected at the version each gives it, and the
//! answer is a JSON patch (RFC 6902, as the API server takes it) that replaces only the
//! lists injection adds to — containers, init containers, volumes, pull secrets — and
//! the annotations. The pod's own entries in those lists are written back exactly as
//! they were sent, so fields of a newer Kubernetes than Rigger's types know stay with
//! the container that had them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use rigger_api::sidecar_set::{self, History, SidecarSet, Versioned, injected_revision};
use serde_json::{Value, json};

/// What the webhook injects from: every SidecarSet with its recorded versions.
pub type Catalog = [(SidecarSet, History)];

/// The lists of a pod's spec that injection adds to.
const INJECTED_LISTS: [&str; 4] = [
    "initContainers",
    "containers",
    "volumes",
    "imagePullSecrets",
];

/// The answer to `request` (`sent` is the pod as the API server sent it, every field):
/// allowed, with the sidecars of the catalog's sets that match the pod as a patch (the
/// webhook is called once per matching SidecarSet, each call with its own; a pod's
/// annotations, which its creator writes, neither skip nor steer it); refused, with the
/// reason, when a version asked for is not recorded or a sidecar's name is one the pod
/// has. `chance` decides `injectionStrategy.revision.policy: Partial`.
pub fn answer(
    request: &AdmissionRequest<Pod>,
    sent: &Value,
    catalog: &Catalog,
    namespace_labels: &BTreeMap<String, String>,
    now: &str,
    chance: f64,
) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let (Operation::Create, Some(pod), None) =
        (&request.operation, &request.object, &request.sub_resource)
    else {
        return response;
    };
    let mut pod = pod.clone();
    // A pod being created may leave its namespace to the request.
    if pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        pod.metadata.namespace.clone_from(&request.namespace);
    }
    let what = format!(
        "pod {}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata
            .name
            .as_deref()
            .or(pod.metadata.generate_name.as_deref())
            .unwrap_or_default()
    );
    let versions = match versions_for(&pod, catalog, namespace_labels, chance) {
        Ok(versions) => versions,
        Err(reason) => return response.deny(format!("{what}: {reason}")),
    };
    if versions.is_empty() {
        return response;
    }
    if let Err(error) = sidecar_set::inject_kube(&mut pod, &versions, namespace_labels, now) {
        return response.deny(format!("{what}: {error}"));
    }
    let patch = match patch_of(sent, &pod) {
        Ok(patch) => patch,
        Err(error) => {
            return response.deny(format!("{what}: the sidecars cannot be written: {error}"));
        }
    };
    match response.clone().with_patch(patch) {
        Ok(patched) => patched,
        Err(error) => response.deny(format!("{what}: the sidecars cannot be written: {error}")),
    }
}

/// The patch from `sent` to `injected`: each list injection added to, whole, with the
/// pod's own entries as sent (by name); the annotations.
fn patch_of(sent: &Value, injected: &Pod) -> Result<json_patch::Patch, serde_json::Error> {
    let after = serde_json::to_value(injected)?;
    let mut operations = Vec::new();
    for list in INJECTED_LISTS {
        let Some(new) = after["spec"][list].as_array() else {
            continue;
        };
        let own = sent["spec"][list].as_array();
        let merged: Vec<Value> = new
            .iter()
            .map(|entry| {
                own.and_then(|own| own.iter().find(|o| o["name"] == entry["name"]))
                    .unwrap_or(entry)
                    .clone()
            })
            .collect();
        if own.is_some_and(|own| *own == merged) {
            continue;
        }
        operations.push(json!({"op": "add", "path": format!("/spec/{list}"), "value": merged}));
    }
    let annotations = &after["metadata"]["annotations"];
    if *annotations != sent["metadata"]["annotations"] && annotations.is_object() {
        operations
            .push(json!({"op": "add", "path": "/metadata/annotations", "value": annotations}));
    }
    serde_json::from_value(Value::Array(operations))
}

/// The SidecarSets to inject into `pod`, each at its version: those matching it and not
/// recorded on it yet.
fn versions_for(
    pod: &Pod,
    catalog: &Catalog,
    namespace_labels: &BTreeMap<String, String>,
    chance: f64,
) -> Result<Vec<Versioned>, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let mut versions = Vec::new();
    for (set, history) in catalog {
        // A set Rigger refuses is injected nowhere (the rollout reports it).
        if set.validate_served().is_err()
            || set.spec.injection_strategy.paused
            || !set.matches_in(namespace, namespace_labels, &labels)
        {
            continue;
        }
        let (set, revision) =
            injected_revision(set, history, &labels, chance).map_err(|e| e.to_string())?;
        versions.push(Versioned { set, revision });
    }
    Ok(versions)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kube::core::admission::AdmissionReview;
    use serde_json::json;

    const NOW: &str = "2026-11-26T12:00:00Z";

    fn shop() -> BTreeMap<String, String> {
        BTreeMap::from([(
            rigger_api::sidecar_set::NAMESPACE_NAME_LABEL.to_owned(),
            "shop".to_owned(),
        )])
    }

    fn catalog() -> Vec<(SidecarSet, History)> {
        let set: SidecarSet = serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet",
            "metadata": {"name": "mesh"},
            "spec": {"selector": {"matchLabels": {"app": "web"}},
                "containers": [{"name": "proxy", "image": "r.example/proxy:1",
                    "volumeMounts": [{"name": "conf", "mountPath": "/etc/proxy", "subPath": "proxy.yaml"}]}],
                "volumes": [{"name": "conf", "configMap": {"name": "proxy"}}]},
        }))
        .unwrap();
        let mut history = History::default();
        history.record(&set);
        vec![(set, history)]
    }

    /// An admission review of a pod as the API server sends it (what `kubectl create`
    /// made, namespace left to the request).
    fn review(pod: &serde_json::Value, operation: &str) -> AdmissionRequest<Pod> {
        let review: AdmissionReview<Pod> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "0f6c", "operation": operation,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "name": "", "namespace": "shop",
                "userInfo": {"username": "alice"},
                "object": pod,
            },
        }))
        .unwrap();
        review.try_into().unwrap()
    }

    fn patched(pod: &serde_json::Value, response: &AdmissionResponse) -> serde_json::Value {
        let patch: json_patch::Patch =
            serde_json::from_slice(response.patch.as_deref().unwrap()).unwrap();
        let mut pod = pod.clone();
        json_patch::patch(&mut pod, &patch).unwrap();
        pod
    }

    #[test]
    fn a_matching_pod_gets_its_sidecars_as_a_patch_and_keeps_what_rigger_does_not_know() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "web-", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "r.example/app:1",
                    // A field of a newer Kubernetes: it stays with its container.
                    "futureContainerField": 7}],
                // And one of the pod's.
                "futureField": {"keep": true}}});
        let response = answer(&review(&pod, "CREATE"), &pod, &catalog(), &shop(), NOW, 0.5);
        assert!(response.allowed);
        let after = patched(&pod, &response);
        assert_eq!(after["spec"]["futureField"], json!({"keep": true}));
        assert_eq!(after["spec"]["containers"][0]["name"], "proxy");
        assert!(
            after["spec"]["containers"][0]
                .get("futureContainerField")
                .is_none()
        );
        assert_eq!(after["spec"]["containers"][1]["name"], "app");
        assert_eq!(after["spec"]["containers"][1]["futureContainerField"], 7);
        assert_eq!(
            after["spec"]["containers"][0]["volumeMounts"][0]["subPath"],
            "proxy.yaml"
        );
        assert_eq!(after["spec"]["volumes"][0]["configMap"]["name"], "proxy");
        assert_eq!(
            after["metadata"]["annotations"]["kruise.io/sidecarset-injected-list"],
            "mesh"
        );
        // The namespace stays the request's to set.
        assert!(after["metadata"].get("namespace").is_none());

        // Kruise's annotations written by the pod's creator do not opt it out.
        let mut forged = pod;
        forged["metadata"]["annotations"] = after["metadata"]["annotations"].clone();
        let response = answer(
            &review(&forged, "CREATE"),
            &forged,
            &catalog(),
            &shop(),
            NOW,
            0.5,
        );
        assert_eq!(
            patched(&forged, &response)["spec"]["containers"][0]["name"],
            "proxy"
        );
    }

    #[test]
    fn other_pods_operations_and_clashes() {
        let other = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db", "labels": {"app": "db"}},
            "spec": {"containers": [{"name": "db", "image": "r.example/db:1"}]}});
        let response = answer(
            &review(&other, "CREATE"),
            &other,
            &catalog(),
            &shop(),
            NOW,
            0.5,
        );
        assert!(response.allowed && response.patch.is_none());
        let web = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "r.example/app:1"}]}});
        let update = answer(&review(&web, "UPDATE"), &web, &catalog(), &shop(), NOW, 0.5);
        assert!(update.allowed && update.patch.is_none());
        let clash = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "proxy", "image": "r.example/mine:1"}]}});
        let refused = answer(
            &review(&clash, "CREATE"),
            &clash,
            &catalog(),
            &shop(),
            NOW,
            0.5,
        );
        assert!(!refused.allowed);
        assert!(
            refused.result.message.starts_with("pod shop/w: spec.containers: container \"proxy\" is also injected by SidecarSet mesh"),
            "{}",
            refused.result.message
        );
    }
}
