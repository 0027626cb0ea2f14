#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::super::NAMESPACE_NAME_LABEL;
use super::*;
use crate::fields::KRUISE_API_VERSION_V1BETA1;
use crate::object::Object;

const NOW: &str = "2026-11-26T12:00:00Z";

fn set(name: &str, spec: serde_json::Value) -> Versioned {
    let mut full = json!({"selector": {"matchLabels": {"app": "web"}}});
    if let serde_json::Value::Object(fields) = spec {
        for (k, v) in fields {
            full[k] = v;
        }
    }
    let set: SidecarSet = serde_json::from_value(json!({
        "apiVersion": KRUISE_API_VERSION_V1BETA1, "kind": "SidecarSet",
        "metadata": {"name": name}, "spec": full,
    }))
    .unwrap();
    set.validate().unwrap();
    Versioned {
        set,
        revision: format!("{name}-abc"),
    }
}

fn pod(spec: serde_json::Value) -> Pod {
    let mut full = json!({"hostNetwork": true,
        "containers": [{"name": "app", "image": "r.example/app:1",
            "env": [{"name": "TZ", "value": "UTC"}, {"name": "LANG", "value": "C"}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "logs", "mountPath": "/var/log"}]}],
        "volumes": [{"name": "data", "emptyDir": {}}, {"name": "logs", "emptyDir": {}}]});
    if let serde_json::Value::Object(fields) = spec {
        for (k, v) in fields {
            full[k] = v;
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": "shop", "labels": {"app": "web", "slot": "app"},
            "annotations": {"oom/config": "{\"a\":1,\"b\":{\"c\":2}}"}},
        "spec": full,
    }))
    .unwrap()
}

fn names(containers: &[Container]) -> Vec<&str> {
    containers.iter().map(|c| c.name.as_str()).collect()
}

fn env<'a>(pod: &'a Pod, container: &str) -> Vec<(&'a str, Option<&'a str>)> {
    pod.spec
        .init_containers
        .iter()
        .chain(&pod.spec.containers)
        .find(|c| c.name == container)
        .unwrap()
        .env
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect()
}

#[test]
fn containers_and_init_containers_go_where_their_policy_says() {
    let mut pod = pod(json!({"initContainers": [{"name": "migrate", "image": "r.example/m:1"}]}));
    let sets = [
        set(
            "mesh",
            json!({
                "initContainers": [
                    {"name": "zz-init", "image": "r.example/i:1"},
                    {"name": "aa-init", "image": "r.example/i:1"},
                    {"name": "first", "image": "r.example/i:1", "podInjectPolicy": "BeforeAppContainer"},
                ],
                "containers": [
                    {"name": "proxy", "image": "r.example/p:1"},
                    {"name": "logger", "image": "r.example/l:1", "podInjectPolicy": "AfterAppContainer"},
                ],
            }),
        ),
        set(
            "hot",
            json!({"containers": [{"name": "agent", "image": "r.example/a:1",
                "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "r.example/e:1"}}]}),
        ),
    ];
    inject(&mut pod, &sets, NOW).unwrap();
    assert_eq!(
        names(&pod.spec.init_containers),
        ["first", "migrate", "aa-init", "zz-init"]
    );
    // Sets in name order as stored; each set's containers in its order.
    assert_eq!(
        names(&pod.spec.containers),
        ["proxy", "agent-1", "agent-2", "app", "logger"]
    );
    for injected in ["first", "aa-init", "proxy", "agent-1", "logger"] {
        assert!(
            env(&pod, injected).contains(&(INJECTED_ENV, Some("true"))),
            "{injected}"
        );
    }
    assert!(!env(&pod, "app").iter().any(|(n, _)| *n == INJECTED_ENV));
    let versions = injected(&pod);
    // Sorted, as Kruise records them.
    assert_eq!(versions["mesh"].sidecar_list, ["logger", "proxy"]);
    assert_eq!(versions["mesh"].controller_revision, "mesh-abc");
    assert_eq!(versions["hot"].sidecar_list, ["agent-1", "agent-2"]);
    assert_eq!(
        pod.metadata.annotations[INJECTED_LIST_ANNOTATION],
        "hot,mesh"
    );
    crate::kinds::pod::validate(&pod).unwrap();
}

#[test]
fn shared_volumes_and_transferred_env_come_from_the_pods_own_containers() {
    let mut pod = pod(json!({}));
    let sets = [set(
        "mesh",
        json!({
            "containers": [{
                "name": "proxy", "image": "r.example/p:1",
                "env": [{"name": "LANG", "value": "en"}],
                "volumeMounts": [{"name": "certs", "mountPath": "/certs"}, {"name": "mine", "mountPath": "/var/log"}],
                "shareVolumePolicy": {"type": "enabled"},
                "transferEnv": [
                    {"sourceContainerName": "app", "envNames": ["TZ", "LANG", "MISSING"]},
                    {"sourceContainerName": "nobody", "envName": "TZ"},
                ],
            }, {
                "name": "by-label", "image": "r.example/p:1",
                "transferEnv": [{"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.labels['slot']"}}, "envName": "TZ"}],
            }],
            "volumes": [{"name": "certs", "emptyDir": {}}, {"name": "mine", "emptyDir": {}}, {"name": "unused", "emptyDir": {}}],
        }),
    )];
    inject(&mut pod, &sets, NOW).unwrap();
    let proxy = &pod.spec.containers[0];
    let mounts: Vec<(&str, &str)> = proxy
        .volume_mounts
        .iter()
        .map(|m| (m.name.as_str(), m.mount_path.as_str()))
        .collect();
    // The app's /data is shared; its /var/log is not: the sidecar mounts its own there.
    assert_eq!(
        mounts,
        [("certs", "/certs"), ("mine", "/var/log"), ("data", "/data")]
    );
    assert_eq!(
        env(&pod, "proxy"),
        [
            ("LANG", Some("en")),
            (INJECTED_ENV, Some("true")),
            ("TZ", Some("UTC"))
        ]
    );
    assert_eq!(
        env(&pod, "by-label"),
        [(INJECTED_ENV, Some("true")), ("TZ", Some("UTC"))]
    );
    let volumes: Vec<&str> = pod.spec.volumes.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        volumes,
        ["data", "logs", "certs", "mine"],
        "only what is mounted"
    );
    crate::kinds::pod::validate(&pod).unwrap();
}

#[test]
fn pull_secrets_join_the_pods_own_once_and_stay_on_reapply() {
    let mut pod = pod(json!({"imagePullSecrets": [{"name": "app-cred"}, {"name": "shared"}]}));
    let sets = [set(
        "mesh",
        json!({"containers": [{"name": "proxy", "image": "r.example/p:1"}],
            "imagePullSecrets": [{"name": "shared"}, {"name": "mesh-cred"}]}),
    )];
    inject(&mut pod, &sets, NOW).unwrap();
    let names: Vec<&str> = pod
        .spec
        .image_pull_secrets
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["app-cred", "shared", "mesh-cred"]);
    let mut again =
        self::pod(json!({"imagePullSecrets": [{"name": "app-cred"}, {"name": "shared"}]}));
    keep_injected(&mut again, &pod);
    assert_eq!(again.spec.image_pull_secrets, pod.spec.image_pull_secrets);
}

#[test]
fn pod_metadata_is_patched_by_policy() {
    let mut pod = pod(json!({}));
    pod.metadata
        .annotations
        .insert("team".to_owned(), "shop".to_owned());
    let sets = [set(
        "mesh",
        json!({
            "containers": [{"name": "proxy", "image": "r.example/p:1"}],
            "patchPodMetadata": [
                {"annotations": {"team": "mesh", "mesh/enabled": "true"}},
                {"annotations": {"mesh/port": "15001"}, "patchPolicy": "Overwrite"},
                {"annotations": {"oom/config": "{\"b\":{\"c\":null,\"d\":3}}", "new/json": "{\"x\":1}"}, "patchPolicy": "MergePatchJson"},
            ],
        }),
    )];
    inject(&mut pod, &sets, NOW).unwrap();
    let annotations = &pod.metadata.annotations;
    assert_eq!(annotations["team"], "shop", "Retain keeps the pod's value");
    assert_eq!(annotations["mesh/enabled"], "true");
    assert_eq!(annotations["mesh/port"], "15001");
    assert_eq!(annotations["oom/config"], r#"{"a":1,"b":{"d":3}}"#);
    assert_eq!(annotations["new/json"], r#"{"x":1}"#);

    // A pod value that is not JSON cannot be merged into: the pod is refused, naming why.
    let mut broken = self::pod(json!({}));
    broken
        .metadata
        .annotations
        .insert("oom/config".to_owned(), "not json".to_owned());
    let err = inject(&mut broken, &sets, NOW).unwrap_err().to_string();
    assert!(
        err.starts_with("metadata.annotations: SidecarSet mesh: patchPodMetadata: the pod's annotation oom/config is not JSON"),
        "{err}"
    );
}

#[test]
fn paused_injection_non_matching_pods_and_name_clashes() {
    let paused = set(
        "mesh",
        json!({"containers": [{"name": "proxy", "image": "r.example/p:1"}],
            "injectionStrategy": {"paused": true}}),
    );
    let mut untouched = pod(json!({}));
    let before = untouched.clone();
    inject(&mut untouched, &[paused], NOW).unwrap();
    assert_eq!(untouched, before);

    let other = set(
        "other",
        json!({"selector": {"matchLabels": {"app": "db"}}, "containers": [{"name": "proxy", "image": "r.example/p:1"}]}),
    );
    inject(&mut untouched, &[other], NOW).unwrap();
    assert_eq!(untouched, before);

    // A sidecar named like the pod's own container (or an init container) is refused:
    // the pod's container is never replaced.
    for (name, spec) in [
        (
            "app",
            json!({"containers": [{"name": "app", "image": "r.example/p:1"}]}),
        ),
        (
            "migrate",
            json!({"initContainers": [{"name": "migrate", "image": "r.example/p:1"}]}),
        ),
    ] {
        let mut pod =
            pod(json!({"initContainers": [{"name": "migrate", "image": "r.example/m:1"}]}));
        let err = inject(&mut pod, &[set("mesh", spec)], NOW)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "container \"{name}\" is also injected by SidecarSet mesh"
            )),
            "{err}"
        );
    }
}

#[test]
fn a_reapplied_pod_keeps_its_sidecars_where_they_stood() {
    let sets = [set(
        "mesh",
        json!({
            "initContainers": [{"name": "setup", "image": "r.example/i:1", "volumeMounts": [{"name": "certs", "mountPath": "/certs"}]}],
            "containers": [
                {"name": "proxy", "image": "r.example/p:1"},
                {"name": "logger", "image": "r.example/l:1", "podInjectPolicy": "AfterAppContainer"},
            ],
            "volumes": [{"name": "certs", "emptyDir": {}}],
        }),
    )];
    let mut stored = pod(json!({}));
    inject(&mut stored, &sets, NOW).unwrap();
    // The owner applies its own manifest again, image changed.
    let mut again = pod(json!({}));
    again.spec.containers[0].image = "r.example/app:2".to_owned();
    keep_injected(&mut again, &stored);
    assert_eq!(names(&again.spec.containers), ["proxy", "app", "logger"]);
    assert_eq!(names(&again.spec.init_containers), ["setup"]);
    assert_eq!(again.spec.containers[1].image, "r.example/app:2");
    assert!(again.spec.volumes.iter().any(|v| v.name == "certs"));
    assert_eq!(injected(&again), injected(&stored));
    crate::kinds::pod::check_in_place_change(&stored.spec, &again.spec).unwrap();
}

#[test]
fn merge_patches_follow_rfc_7386() {
    let cases = [
        (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
        (
            json!({"a": "b"}),
            json!({"b": "c"}),
            json!({"a": "b", "b": "c"}),
        ),
        (json!({"a": "b"}), json!({"a": null}), json!({})),
        (
            json!({"a": [1]}),
            json!({"a": {"b": 1}}),
            json!({"a": {"b": 1}}),
        ),
        (json!([1]), json!({"a": 1}), json!({"a": 1})),
        (
            json!({"a": {"b": 1}}),
            json!({"a": {"c": null}}),
            json!({"a": {"b": 1}}),
        ),
    ];
    for (mut target, patch, expected) in cases {
        merge_patch(&mut target, &patch);
        assert_eq!(target, expected);
    }
}

/// The labels of the test pods' namespace, as the API server has them.
fn shop() -> BTreeMap<String, String> {
    BTreeMap::from([(NAMESPACE_NAME_LABEL.to_owned(), "shop".to_owned())])
}

/// A Pod as `kubectl create` sends it to the webhook.
fn kube_pod(spec: &serde_json::Value) -> core::Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": "shop", "labels": {"app": "nginx"}},
        "spec": spec,
    }))
    .unwrap()
}

fn kube_set(name: &str, version: &str, spec: &serde_json::Value) -> Versioned {
    let set: SidecarSet = serde_json::from_value(json!({
        "apiVersion": version, "kind": "SidecarSet",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    set.validate().unwrap();
    Versioned {
        set,
        revision: format!("{name}-abc"),
    }
}

/// Kruise's annotations for one injected set, as its webhook writes them (JSON values
/// read, so that their keys' order does not count).
fn kruise_annotations(set: &SidecarSet, sidecars: &[&str]) -> serde_json::Value {
    let name = &set.metadata.name;
    json!({
        HASH_ANNOTATION: {name: {"updateTimestamp": NOW, "sidecarSetName": name,
            "hash": set.hash(), "sidecarList": sidecars, "controllerRevision": format!("{name}-abc")}},
        HASH_WITHOUT_IMAGE_ANNOTATION: {name: {"updateTimestamp": NOW, "sidecarSetName": name,
            "hash": set.hash_without_image(), "sidecarList": sidecars}},
        INJECTED_LIST_ANNOTATION: name,
    })
}

/// A pod's annotations with JSON values read.
fn read_annotations(pod: &core::Pod) -> serde_json::Value {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    serde_json::Value::Object(
        annotations
            .into_iter()
            .map(|(k, v)| {
                let value = serde_json::from_str(&v)
                    .ok()
                    .filter(serde_json::Value::is_object)
                    .unwrap_or(serde_json::Value::String(v));
                (k, value)
            })
            .collect(),
    )
}

#[test]
fn kruise_log_sidecar_with_a_configmap_subpath_is_injected_field_for_field() {
    // openkruise.io docs/best-practices/log-container-sidecarset.md (v1alpha1).
    let versioned = kube_set(
        "filebeat-sidecarset",
        crate::fields::KRUISE_API_VERSION,
        &json!({
            "selector": {"matchLabels": {"app": "nginx"}},
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": 1},
            "containers": [{
                "name": "filebeat", "image": "elastic/filebeat:7.7.0",
                "args": ["-c", "/etc/filebeat.yml", "-e"],
                "securityContext": {"runAsUser": 0},
                "resources": {"limits": {"memory": "200Mi"}, "requests": {"cpu": "100m", "memory": "100Mi"}},
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/filebeat.yml", "readOnly": true, "subPath": "filebeat.yml"},
                    {"name": "varlog", "mountPath": "/var/log", "readOnly": true},
                ],
            }],
            "volumes": [
                {"name": "config", "configMap": {"name": "filebeat-config"}},
                {"name": "varlog", "emptyDir": {}},
                {"name": "unused", "emptyDir": {}},
            ],
        }),
    );
    let mut pod = kube_pod(
        &json!({"containers": [{"name": "nginx", "image": "nginx:1.25",
        "volumeMounts": [{"name": "varlog", "mountPath": "/var/log/nginx"}]}],
        "volumes": [{"name": "varlog", "emptyDir": {}}]}),
    );
    inject_kube(&mut pod, std::slice::from_ref(&versioned), &shop(), NOW).unwrap();
    assert_eq!(
        read_annotations(&pod),
        kruise_annotations(&versioned.set, &["filebeat"])
    );
    pod.metadata.annotations = None;
    let expected = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-0", "namespace": "shop", "labels": {"app": "nginx"}},
        "spec": {
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
            // The pod's own `varlog` wins; `config` joins; `unused` is mounted by no sidecar.
            "volumes": [{"name": "varlog", "emptyDir": {}},
                {"name": "config", "configMap": {"name": "filebeat-config"}}],
        },
    });
    assert_eq!(serde_json::to_value(&pod).unwrap(), expected);
}

#[test]
fn kruise_native_sidecar_goes_after_the_pods_init_containers() {
    // openkruise.io docs/user-manuals/sidecarset.md, "support k8s 1.28 Sidecar Containers".
    let versioned = kube_set(
        "test-sidecarset",
        crate::fields::KRUISE_API_VERSION_V1BETA1,
        &json!({
            "selector": {"matchLabels": {"app": "nginx"}},
            "updateStrategy": {"type": "NotUpdate"},
            "initContainers": [{"name": "sidecar", "image": "nginx:alpine", "restartPolicy": "Always",
                "lifecycle": {"postStart": {"exec": {"command": ["/bin/sh", "-c", "sleep 10"]}}}}],
        }),
    );
    let mut pod = kube_pod(&json!({
        "initContainers": [{"name": "migrate", "image": "r.example/m:1"}],
        "containers": [{"name": "nginx", "image": "nginx:1.25"}]}));
    inject_kube(&mut pod, std::slice::from_ref(&versioned), &shop(), NOW).unwrap();
    let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
    assert_eq!(
        spec["initContainers"],
        json!([{"name": "migrate", "image": "r.example/m:1"},
            {"name": "sidecar", "image": "nginx:alpine", "restartPolicy": "Always",
             "lifecycle": {"postStart": {"exec": {"command": ["/bin/sh", "-c", "sleep 10"]}}},
             "env": [{"name": "IS_INJECTED", "value": "true"}]}])
    );
    assert_eq!(
        spec["containers"],
        json!([{"name": "nginx", "image": "nginx:1.25"}])
    );
    assert_eq!(
        read_annotations(&pod),
        kruise_annotations(&versioned.set, &["sidecar"])
    );
    // A native sidecar's change is a new version, as in Kruise.
    let mut changed = versioned.set.clone();
    changed.spec.init_containers[0].container.image = Some("nginx:1.27-alpine".to_owned());
    assert_ne!(changed.hash(), versioned.set.hash());
    assert_eq!(
        changed.hash_without_image(),
        versioned.set.hash_without_image()
    );
}

#[test]
fn shared_mounts_are_copied_whole_with_the_env_their_sub_path_expr_names() {
    let versioned = kube_set(
        "logs",
        crate::fields::KRUISE_API_VERSION_V1BETA1,
        &json!({
            "selector": {"matchLabels": {"app": "nginx"}},
            "containers": [{"name": "shipper", "image": "r.example/s:1",
                "shareVolumePolicy": {"type": "enabled"},
                "volumeMounts": [{"name": "podinfo", "mountPath": "/etc/podinfo"},
                    {"name": "mine", "mountPath": "/data"}]}],
            "volumes": [{"name": "podinfo", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}],
        }),
    );
    let mut pod = kube_pod(
        &json!({"containers": [{"name": "nginx", "image": "nginx:1.25",
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "logs", "mountPath": "/var/log", "subPathExpr": "$(POD_NAME)"}]}],
        "volumes": [{"name": "data", "emptyDir": {}}, {"name": "logs", "emptyDir": {}}]}),
    );
    inject_kube(&mut pod, std::slice::from_ref(&versioned), &shop(), NOW).unwrap();
    let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
    let shipper = &spec["containers"][0];
    // The sidecar's own /data wins over the pod's; the pod's /var/log comes whole, and
    // the variable its subPathExpr names with it.
    assert_eq!(
        shipper["volumeMounts"],
        json!([{"name": "podinfo", "mountPath": "/etc/podinfo"}, {"name": "mine", "mountPath": "/data"},
            {"name": "logs", "mountPath": "/var/log", "subPathExpr": "$(POD_NAME)"}])
    );
    assert_eq!(
        shipper["env"],
        json!([{"name": "IS_INJECTED", "value": "true"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
    );
    assert_eq!(
        spec["volumes"][2],
        json!({"name": "podinfo", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}})
    );
}

#[test]
fn what_only_kubelet_runs_is_refused_for_riggers_own_pods_naming_the_field() {
    let versioned = kube_set(
        "native",
        crate::fields::KRUISE_API_VERSION_V1BETA1,
        &json!({"selector": {"matchLabels": {"app": "web"}},
            "initContainers": [{"name": "sidecar", "image": "r.example/s:1", "restartPolicy": "Always"}]}),
    );
    let err = Object::validate(&mut versioned.set.clone())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("spec.initContainers[0]: restartPolicy: Rigger's agent does not carry this out on its own pods; kubelet does, in Kubernetes mode"),
        "{err}"
    );
    let mut pod = pod(json!({}));
    let err = inject(&mut pod, &[versioned], NOW).unwrap_err().to_string();
    assert!(
        err.contains("restartPolicy: Rigger's agent does not carry this out"),
        "{err}"
    );
}

#[test]
fn sets_injected_one_call_at_a_time_end_up_as_all_at_once() {
    // The webhook is called once per matching SidecarSet, each call injecting its own.
    let sets = [
        kube_set(
            "a-mesh",
            KRUISE_API_VERSION_V1BETA1,
            &json!({"selector": {"matchLabels": {"app": "nginx"}},
                "containers": [{"name": "proxy", "image": "r.example/p:1"},
                    {"name": "logger", "image": "r.example/l:1", "podInjectPolicy": "AfterAppContainer"}],
                "initContainers": [{"name": "a-init", "image": "r.example/i:1"}]}),
        ),
        kube_set(
            "b-audit",
            KRUISE_API_VERSION_V1BETA1,
            &json!({"selector": {"matchLabels": {"app": "nginx"}},
                "containers": [{"name": "audit", "image": "r.example/a:1"},
                    {"name": "shipper", "image": "r.example/s:1", "podInjectPolicy": "AfterAppContainer"}],
                "initContainers": [{"name": "b-init", "image": "r.example/i:1"}]}),
        ),
    ];
    let spec = json!({"initContainers": [{"name": "migrate", "image": "r.example/m:1"}],
        "containers": [{"name": "nginx", "image": "nginx:1.25"}]});
    let mut at_once = kube_pod(&spec);
    inject_kube(&mut at_once, &sets, &shop(), NOW).unwrap();
    let mut one_by_one = kube_pod(&spec);
    for set in &sets {
        inject_kube(&mut one_by_one, std::slice::from_ref(set), &shop(), NOW).unwrap();
    }
    let names = |pod: &core::Pod, list: &str| -> Vec<String> {
        serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap()[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names(&one_by_one, "containers"),
        ["proxy", "audit", "nginx", "logger", "shipper"]
    );
    assert_eq!(
        names(&one_by_one, "containers"),
        names(&at_once, "containers")
    );
    assert_eq!(
        names(&one_by_one, "initContainers"),
        names(&at_once, "initContainers")
    );
    assert_eq!(read_annotations(&one_by_one), read_annotations(&at_once));
}

#[test]
fn a_sidecars_resources_come_from_the_pods_containers_and_a_pod_none_matches_is_refused() {
    // Kruise 1.9's e2e story: a sidecar sized from the app's containers, hot-upgraded
    // slots alike, the set's other sidecar never a target.
    let versioned = kube_set(
        "sized",
        crate::fields::KRUISE_API_VERSION_V1BETA1,
        &json!({
            "selector": {"matchLabels": {"app": "nginx"}},
            "containers": [
                {"name": "proxy", "image": "r.example/p:1",
                 "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "r.example/e:1"},
                 "resourcesPolicy": {"targetContainersMode": "sum", "resourcesExpr": {
                    "limits": {"cpu": "cpu*50% + 100m", "memory": "max(memory*20% + 100Mi, 200Mi)"},
                    "requests": {"cpu": "cpu*30% + 50m", "memory": "memory*15% + 50Mi"}}}},
                {"name": "logger", "image": "r.example/l:1",
                 "resources": {"limits": {"cpu": "8", "memory": "8Gi"}}},
            ],
        }),
    );
    let mut pod = kube_pod(&json!({"containers": [
        {"name": "app1", "image": "r.example/a:1",
         "resources": {"limits": {"cpu": "200m", "memory": "400Mi"}, "requests": {"cpu": "100m", "memory": "200Mi"}}},
        {"name": "app2", "image": "r.example/a:1",
         "resources": {"limits": {"cpu": "400m", "memory": "600Mi"}, "requests": {"cpu": "200m", "memory": "300Mi"}}},
    ]}));
    inject_kube(&mut pod, std::slice::from_ref(&versioned), &shop(), NOW).unwrap();
    let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
    for slot in ["proxy-1", "proxy-2"] {
        let container = spec["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == slot)
            .unwrap();
        assert_eq!(
            container["resources"],
            json!({"limits": {"cpu": "400m", "memory": "300Mi"},
                   "requests": {"cpu": "140m", "memory": "125Mi"}}),
            "{slot}"
        );
    }
    // No container matches: the pod is refused, naming the set, the sidecar and why.
    let strict = kube_set(
        "strict",
        crate::fields::KRUISE_API_VERSION_V1BETA1,
        &json!({
            "selector": {"matchLabels": {"app": "nginx"}},
            "containers": [{"name": "proxy", "image": "r.example/p:1",
                "resourcesPolicy": {"targetContainersMode": "max", "targetContainersNameRegex": "^db$",
                    "resourcesExpr": {"limits": {"cpu": "cpu"}}}}],
        }),
    );
    let mut pod = kube_pod(&json!({"containers": [{"name": "nginx", "image": "nginx:1.25"}]}));
    let error = inject_kube(&mut pod, std::slice::from_ref(&strict), &shop(), NOW)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("SidecarSet strict: sidecar proxy: resourcesPolicy: no containers match the regex pattern \"^db$\""),
        "{error}"
    );
}

#[test]
fn a_native_sidecar_another_set_injected_is_no_target_of_a_resources_policy() {
    // The webhook is called once per set: the pod it sees for the second set already has
    // the first set's native sidecar, marked injected. Kruise injects all sets at once, so
    // that sidecar is never a target there either.
    let sized = kube_set(
        "sized",
        crate::fields::KRUISE_API_VERSION_V1BETA1,
        &json!({
            "selector": {"matchLabels": {"app": "nginx"}},
            "containers": [{"name": "proxy", "image": "r.example/p:1",
                "resourcesPolicy": {"targetContainersMode": "sum",
                    "resourcesExpr": {"limits": {"cpu": "cpu"}}}}],
        }),
    );
    let mut pod = kube_pod(&json!({
        "initContainers": [{"name": "mesh", "image": "r.example/m:1", "restartPolicy": "Always",
            "env": [{"name": "IS_INJECTED", "value": "true"}],
            "resources": {"limits": {"cpu": "2"}}}],
        "containers": [{"name": "nginx", "image": "nginx:1.25", "resources": {"limits": {"cpu": "100m"}}}]}));
    inject_kube(&mut pod, std::slice::from_ref(&sized), &shop(), NOW).unwrap();
    let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
    let proxy = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "proxy")
        .unwrap();
    assert_eq!(proxy["resources"]["limits"]["cpu"], "100m", "{spec}");
}
