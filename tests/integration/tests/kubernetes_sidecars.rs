//! SidecarSets on the cluster's pods, on the lab's API server: Kruise's SidecarSet examples
//! applied with kubectl are injected by Rigger's webhook into Pods created with kubectl,
//! field for field as Kruise's webhook injects them; and while no controller answers,
//! a pod a SidecarSet matches is refused (never started without its sidecars) and every
//! other pod is created.
//!
//! No kubelet runs here: these pods are never started; what is checked is the Pod the
//! API server stores, which is what kubelet would run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::kubernetes::{Cluster, Made, corpus};
use rigger_integration_tests::wait_until;
use serde_json::{Value, json};

/// Apply corpus example `file` (filled with `id`) with kubectl.
fn apply(cluster: &Cluster, file: &str, id: &str) {
    let out = cluster.kubectl_stdin(&["apply"], &corpus(file, id, "unused", "busybox:1.36"));
    assert!(
        out.status.success(),
        "{file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Create `pod` with kubectl; the stored Pod.
fn create(cluster: &Cluster, pod: &Value) -> Result<Value, String> {
    let out = cluster.kubectl_stdin(&["create", "-o", "json"], &pod.to_string());
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A pod's annotations with JSON values read (their keys' order does not count).
fn annotations(pod: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for (key, value) in pod["metadata"]["annotations"].as_object().unwrap() {
        let text = value.as_str().unwrap();
        let value = serde_json::from_str::<Value>(text)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::String(text.to_owned()));
        out.insert(key.clone(), value);
    }
    Value::Object(out)
}

/// `spec` as the API server writes it: Go writes a container's `resources` always (an
/// empty struct is not omitted), so every container has it.
fn stored(mut spec: Value) -> Value {
    for list in ["initContainers", "containers"] {
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for container in containers.into_iter().flatten() {
            if container.get("resources").is_none() {
                container["resources"] = json!({});
            }
        }
    }
    spec
}

/// Kruise's records of set `set` on a pod: its name, its sidecars (sorted), a hash, the
/// time; and the hash without images in its own annotation.
fn assert_recorded(pod: &Value, set: &str, sidecars: &[&str]) {
    let annotations = annotations(pod);
    let version = &annotations["kruise.io/sidecarset-hash"][set];
    assert_eq!(version["sidecarSetName"], set, "{annotations:#}");
    assert_eq!(version["sidecarList"], json!(sidecars), "{annotations:#}");
    assert!(version["hash"].as_str().is_some_and(|h| !h.is_empty()));
    assert!(
        version["updateTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert!(
        version["controllerRevision"]
            .as_str()
            .is_some_and(|r| r.starts_with(&format!("{set}-")))
    );
    let without_image = &annotations["kruise.io/sidecarset-hash-without-image"][set];
    assert_eq!(without_image["sidecarList"], json!(sidecars));
    assert!(without_image.get("controllerRevision").is_none());
    let list: Vec<&str> = annotations["kruise.io/sidecarset-injected-list"]
        .as_str()
        .unwrap()
        .split(',')
        .collect();
    assert!(list.contains(&set), "{annotations:#}");
}

#[test]
fn kruises_sidecarset_examples_are_injected_into_pods_made_with_kubectl_field_for_field() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let namespace = cluster.namespace("sidecars");
    // The pods' namespace: the controller's own is never sent to the webhook.
    let apps = cluster.namespace("sidecar-apps");
    let dir = tempfile::tempdir().unwrap();
    let id = format!("sc{}", std::process::id());
    let _controller = cluster.controller(dir.path(), &namespace.name);
    for file in [
        "sidecarset-v1beta1.yaml",
        "sidecarset-v1alpha1.yaml",
        "sidecarset-native-sidecar.yaml",
        "sidecarset-log-filebeat.yaml",
        "sidecarset-downward-api.yaml",
    ] {
        apply(cluster, file, &id);
    }
    let sets: Vec<String> = ["mesh", "agent", "native", "filebeat-sidecarset", "podinfo"]
        .iter()
        .map(|name| format!("{name}-{id}"))
        .collect();
    let _made = Made {
        cluster,
        objects: sets
            .iter()
            .map(|set| ("sidecarset".to_owned(), set.clone()))
            .collect(),
    };
    cluster.wait_for_sidecar_webhook(&sets);

    // Kruise's manual's SidecarSet (v1beta1, every field): a pod of the default namespace.
    let pod = create(
        cluster,
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("web-{id}"), "namespace": "default",
                "labels": {"app": format!("web-{id}"), "main-container": "app"}},
            "spec": {"containers": [{"name": "app", "image": "busybox:1.36",
                "env": [{"name": "TZ", "value": "UTC"}, {"name": "LANG", "value": "C"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "emptyDir": {}}]}}),
    )
    .unwrap();
    let idle = [
        "sh",
        "-c",
        "trap 'exit 0' TERM; while true; do sleep 0.2; done",
    ];
    assert_eq!(
        pod["spec"],
        stored(json!({
            "initContainers": [{"name": "mesh-init", "image": "busybox:1.36",
                "command": ["sh", "-c", "echo ready > /etc/mesh/state"],
                "volumeMounts": [{"name": "mesh-config", "mountPath": "/etc/mesh"}],
                "env": [{"name": "IS_INJECTED", "value": "true"}]}],
            "containers": [
                {"name": "proxy", "image": "busybox:1.36", "command": idle,
                 "env": [{"name": "IS_INJECTED", "value": "true"},
                    {"name": "TZ", "value": "UTC"}, {"name": "LANG", "value": "C"}],
                 "volumeMounts": [{"name": "mesh-config", "mountPath": "/etc/mesh"},
                    {"name": "data", "mountPath": "/data"}]},
                {"name": "app", "image": "busybox:1.36",
                 "env": [{"name": "TZ", "value": "UTC"}, {"name": "LANG", "value": "C"}],
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "logger", "image": "busybox:1.36", "command": idle,
                 "env": [{"name": "IS_INJECTED", "value": "true"}]},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "mesh-config", "emptyDir": {}}],
            "imagePullSecrets": [{"name": "mesh-registry"}],
        })),
        "{:#}",
        pod["spec"]
    );
    let set = format!("mesh-{id}");
    assert_recorded(&pod, &set, &["logger", "proxy"]);
    let patched = annotations(&pod);
    assert_eq!(patched["mesh.example.com/enabled"], "true");
    assert_eq!(patched["mesh.example.com/config"], json!({"log": "info"}));

    // v1alpha1, hot upgrade: two slots, the second on the empty image, each told its
    // version from the pod's annotations.
    let pod = create(
        cluster,
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("api-{id}"), "namespace": "default",
                "labels": {"app": format!("api-{id}")}},
            "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]}}),
    )
    .unwrap();
    let slot = |n: u8| {
        let name = format!("agent-{n}");
        json!({"name": name, "image": "busybox:1.36", "command": idle,
            "env": [{"name": "IS_INJECTED", "value": "true"},
                {"name": "SIDECARSET_VERSION", "valueFrom": {"fieldRef": {"fieldPath":
                    format!("metadata.annotations['version.sidecarset.kruise.io/{name}']")}}},
                {"name": "SIDECARSET_VERSION_ALT", "valueFrom": {"fieldRef": {"fieldPath":
                    format!("metadata.annotations['versionalt.sidecarset.kruise.io/{name}']")}}}]})
    };
    assert_eq!(
        pod["spec"]["containers"],
        stored(json!({"containers": [slot(1), slot(2), {"name": "app", "image": "busybox:1.36"}]}))
            ["containers"],
        "{:#}",
        pod["spec"]
    );
    let recorded = annotations(&pod);
    assert_eq!(recorded["version.sidecarset.kruise.io/agent-1"], "1");
    assert_eq!(recorded["versionalt.sidecarset.kruise.io/agent-1"], "0");
    assert_eq!(recorded["version.sidecarset.kruise.io/agent-2"], "0");
    assert_eq!(recorded["versionalt.sidecarset.kruise.io/agent-2"], "1");
    assert_eq!(
        recorded["kruise.io/sidecarset-working-hotupgrade-container"],
        json!({"agent": "agent-1"})
    );
    assert_eq!(recorded["agent.example.com/version"], "v1");
    assert_recorded(&pod, &format!("agent-{id}"), &["agent-1", "agent-2"]);

    // The manual's native sidecar: after the pod's own init containers.
    let pod = create(
        cluster,
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("sample-{id}"), "namespace": apps.name.as_str(),
                "labels": {"app": format!("sample-{id}")}},
            "spec": {"initContainers": [{"name": "migrate", "image": "busybox:1.36"}],
                "containers": [{"name": "main", "image": "nginx:1.25"}]}}),
    )
    .unwrap();
    assert_eq!(
        pod["spec"],
        stored(json!({
            "initContainers": [{"name": "migrate", "image": "busybox:1.36"},
                {"name": "sidecar", "image": "nginx:alpine", "restartPolicy": "Always",
                 "lifecycle": {"postStart": {"exec": {"command": ["/bin/sh", "-c", "sleep 10"]}}},
                 "env": [{"name": "IS_INJECTED", "value": "true"}]}],
            "containers": [{"name": "main", "image": "nginx:1.25"}],
        })),
        "{:#}",
        pod["spec"]
    );
    assert_recorded(&pod, &format!("native-{id}"), &["sidecar"]);

    // The log sidecar: its configMap file by subPath, its emptyDir beside the pod's own.
    let pod = create(
        cluster,
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("nginx-{id}"), "namespace": apps.name.as_str(),
                "labels": {"app": format!("nginx-{id}")}},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.25",
                "volumeMounts": [{"name": "varlog", "mountPath": "/var/log/nginx"}]}],
                "volumes": [{"name": "varlog", "emptyDir": {}}]}}),
    )
    .unwrap();
    assert_eq!(
        pod["spec"],
        stored(json!({
            "containers": [
                {"name": "filebeat", "image": "elastic/filebeat:7.7.0",
                 "args": ["-c", "/etc/filebeat.yml", "-e"],
                 "env": [{"name": "IS_INJECTED", "value": "true"}],
                 "securityContext": {"runAsUser": 0},
                 "resources": {"limits": {"memory": "200Mi"}, "requests": {"cpu": "100m", "memory": "100Mi"}},
                 "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/filebeat.yml", "readOnly": true, "subPath": "filebeat.yml"},
                    {"name": "varlog", "mountPath": "/var/log", "readOnly": true}]},
                {"name": "nginx", "image": "nginx:1.25",
                 "volumeMounts": [{"name": "varlog", "mountPath": "/var/log/nginx"}]},
            ],
            "volumes": [{"name": "varlog", "emptyDir": {}},
                {"name": "config", "configMap": {"name": "filebeat-config"}}],
        })),
        "{:#}",
        pod["spec"]
    );
    assert_recorded(&pod, &format!("filebeat-sidecarset-{id}"), &["filebeat"]);

    // A downwardAPI volume, and the app's mounts shared (subPathExpr with its variable).
    let pod = create(
        cluster,
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("info-{id}"), "namespace": apps.name.as_str(),
                "labels": {"app": format!("info-{id}")}},
            "spec": {"containers": [{"name": "app", "image": "busybox:1.36",
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "volumeMounts": [{"name": "logs", "mountPath": "/var/log", "subPathExpr": "$(POD_NAME)"}]}],
                "volumes": [{"name": "logs", "emptyDir": {}}]}}),
    )
    .unwrap();
    assert_eq!(
        pod["spec"]["containers"][0],
        json!({"name": "shipper", "resources": {}, "image": "busybox:1.36",
            "command": ["sh", "-c", "while true; do cat /etc/podinfo/labels; sleep 5; done"],
            "env": [{"name": "IS_INJECTED", "value": "true"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "volumeMounts": [{"name": "podinfo", "mountPath": "/etc/podinfo"},
                {"name": "logs", "mountPath": "/var/log", "subPathExpr": "$(POD_NAME)"}]}),
        "{:#}",
        pod["spec"]
    );
    assert_eq!(
        pod["spec"]["volumes"],
        json!([{"name": "logs", "emptyDir": {}},
            {"name": "podinfo", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}])
    );

    // A pod no SidecarSet matches is left as written.
    let plain = create(
        cluster,
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("plain-{id}"), "namespace": apps.name.as_str()},
            "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]}}),
    )
    .unwrap();
    assert_eq!(
        plain["spec"],
        stored(json!({"containers": [{"name": "app", "image": "busybox:1.36"}]}))
    );
    assert!(plain["metadata"].get("annotations").is_none());

    for name in [format!("web-{id}"), format!("api-{id}")] {
        let _ = cluster.kubectl(&["delete", "pod", "-n", "default", &name, "--wait=false"]);
    }
}

#[test]
fn while_no_controller_answers_matched_pods_are_refused_and_others_created() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let namespace = cluster.namespace("sidecars-down");
    let apps = cluster.namespace("sidecar-apps-down");
    let dir = tempfile::tempdir().unwrap();
    let id = format!("dn{}", std::process::id());
    let mut controller = cluster.controller(dir.path(), &namespace.name);
    apply(cluster, "sidecarset-native-sidecar.yaml", &id);
    let set = format!("native-{id}");
    let _made = Made {
        cluster,
        objects: vec![("sidecarset".to_owned(), set.clone())],
    };
    cluster.wait_for_sidecar_webhook(std::slice::from_ref(&set));
    let pod = |name: &str, app: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": apps.name.as_str(), "labels": {"app": app}},
            "spec": {"containers": [{"name": "main", "image": "nginx:1.25"}]}})
    };
    let matched = format!("sample-{id}");

    controller.kill();
    // Refused, naming the webhook: never started without its sidecar.
    let refused = create(cluster, &pod("while-down", &matched)).unwrap_err();
    assert!(
        refused.contains(&format!("{set}.sidecarsets.rigger.dev"))
            && refused.contains("failed calling webhook"),
        "{refused}"
    );
    assert!(
        cluster
            .get_json(&["pod", "while-down", "-n", apps.name.as_str()])
            .is_none()
    );
    // Every other pod is created as written.
    let other = create(cluster, &pod("other", "unrelated")).unwrap();
    assert!(other["metadata"].get("annotations").is_none());

    // Back: the owner's retry gets the pod, with its sidecar.
    controller.restart();
    let mut created = None;
    wait_until(
        "the pod to be admitted again",
        Duration::from_secs(30),
        || {
            created = create(cluster, &pod("while-down", &matched)).ok();
            created.as_ref().map(|_| ())
        },
    );
    assert_eq!(
        created.unwrap()["spec"]["initContainers"][0]["name"],
        "sidecar"
    );
}

#[test]
fn a_namespace_selector_matches_the_namespaces_own_labels() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let namespace = cluster.namespace("sidecars-ns");
    let team = cluster.namespace_labelled("sidecar-team", &[("team", "payments")]);
    let other = cluster.namespace("sidecar-other");
    let dir = tempfile::tempdir().unwrap();
    let id = format!("ns{}", std::process::id());
    let set = format!("team-{id}");
    let _made = Made {
        cluster,
        objects: vec![("sidecarset".to_owned(), set.clone())],
    };
    let _controller = cluster.controller(dir.path(), &namespace.name);
    let out = cluster.kubectl_stdin(
        &["apply"],
        &format!(
            "apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
             spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  \
             namespaceSelector: {{matchLabels: {{team: payments}}}}\n  \
             containers: [{{name: audit, image: r.example/audit:1}}]\n"
        ),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cluster.wait_for_sidecar_webhook(std::slice::from_ref(&set));
    let pod = |namespace: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": namespace, "labels": {"app": set}},
            "spec": {"containers": [{"name": "app", "image": "r.example/app:1"}]}})
    };
    let labelled = create(cluster, &pod(&team.name)).unwrap();
    let names: Vec<&str> = labelled["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["audit", "app"],
        "the team's namespace gets the sidecar"
    );
    let unlabelled = create(cluster, &pod(&other.name)).unwrap();
    assert_eq!(
        unlabelled["spec"]["containers"].as_array().unwrap().len(),
        1
    );
}
