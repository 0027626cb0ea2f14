#![allow(clippy::unwrap_used)]

use super::*;
use crate::engines::sidecar_sets::{to_upgrade, upgraded};

/// A set whose one sidecar is native (an init container with `restartPolicy: Always`).
fn native_set(image: &str) -> SidecarSet {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "SidecarSet",
        "metadata": {"name": "mesh"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "initContainers": [{"name": "proxy", "image": image, "restartPolicy": "Always"}],
        }
    }))
    .unwrap()
}

fn running(name: &str, image: &str, image_id: &str, container_id: &str) -> Value {
    json!({"name": name, "image": image, "imageID": image_id, "containerID": container_id,
           "ready": true, "state": {"running": {}}})
}

/// A ready pod the set's previous version was injected into, its proxy running `proxy`.
fn injected(set: &SidecarSet, old_hash: &str, proxy: &Value, proxy_image: &str) -> InjectedPod {
    let version = json!({"mesh": {
        "sidecarSetName": "mesh", "hash": old_hash,
        "hashWithoutImage": set.hash_without_image(), "sidecarList": ["proxy"]}});
    InjectedPod {
        namespace: "shop".to_owned(),
        name: "web-1".to_owned(),
        uid: "u1".to_owned(),
        resource_version: "7".to_owned(),
        labels: BTreeMap::from([("app".to_owned(), "web".to_owned())]),
        annotations: BTreeMap::from([(HASH_ANNOTATION.to_owned(), version.to_string())]),
        containers: vec![("app".to_owned(), "r.example/app:1".to_owned())],
        // The pod's own init container first: the sidecar's place is not the first.
        init_containers: vec![
            ("setup".to_owned(), "r.example/setup:1".to_owned()),
            ("proxy".to_owned(), proxy_image.to_owned()),
        ],
        native: ["proxy".to_owned()].into(),
        marked: ["proxy".to_owned()].into(),
        node: Some("n1".to_owned()),
        status: json!({
            "conditions": [{"type": "Ready", "status": "True"}],
            "initContainerStatuses": [proxy],
            "containerStatuses": [running("app", "r.example/app:1", "app-id", "c-app")],
        }),
    }
}

#[test]
fn a_native_sidecar_is_updated_in_place_and_counts_once_it_runs_the_new_image() {
    let old = native_set("r.example/proxy:1");
    let set = native_set("r.example/proxy:2");
    let hash = set.hash();
    assert_ne!(
        hash,
        old.hash(),
        "an init container's image is part of the version"
    );
    let pod = injected(
        &set,
        &old.hash(),
        &running("proxy", "r.example/proxy:1", "proxy-1", "c-1"),
        "r.example/proxy:1",
    );
    let member = member_of(&set, &hash, &pod).unwrap();
    assert!(!member.updated(&hash));
    assert!(!member.unavailable(&hash), "ready, on its old version");
    let members = [member];
    let chosen = to_upgrade(&set, &hash, &members);
    assert_eq!(chosen.len(), 1);
    let after = upgraded(&set, &hash, chosen[0]).unwrap();
    assert_eq!(
        after.spec.init_containers.len(),
        1,
        "only native ones are seen"
    );
    assert_eq!(after.spec.init_containers[0].image, "r.example/proxy:2");
    assert_eq!(
        after.spec.containers[0].image, "r.example/app:1",
        "the app is not touched"
    );

    let patch = patch_of(&pod, &after, "mesh", &hash, "2026-11-30T00:00:00Z");
    let operations = patch.as_array().unwrap();
    assert_eq!(operations[0]["op"], "test", "only at the version read");
    let images: Vec<&Value> = operations.iter().filter(|o| o["op"] == "replace").collect();
    assert_eq!(
        images,
        [
            &json!({"op": "replace", "path": "/spec/initContainers/1/image",
                 "value": "r.example/proxy:2"})
        ],
        "one image replaced, by its place among the init containers"
    );
    let annotations = &operations.last().unwrap()["value"];
    let state: Value =
        serde_json::from_str(annotations[IN_PLACE_STATE_ANNOTATION].as_str().unwrap()).unwrap();
    assert_eq!(
        state["mesh"]["lastContainerStatuses"]["proxy"],
        json!({"imageID": "proxy-1", "containerID": "c-1"}),
        "what ran before is recorded, to tell kubelet's restart"
    );

    // The patch applied, kubelet not yet done: the pod is at the version, unavailable.
    let mut patched = injected(
        &set,
        &hash,
        &running("proxy", "docker.io/r/proxy:1", "proxy-1", "c-1"),
        "r.example/proxy:2",
    );
    let mut kept: BTreeMap<String, String> = serde_json::from_value(annotations.clone()).unwrap();
    kept.insert(
        HASH_ANNOTATION.to_owned(),
        after.metadata.annotations[HASH_ANNOTATION].clone(),
    );
    patched.annotations = kept;
    let waiting = member_of(&set, &hash, &patched).unwrap();
    assert!(waiting.updated(&hash));
    assert!(waiting.unavailable(&hash), "the old proxy still runs");
    // kubelet restarted it on the new image.
    patched.status["initContainerStatuses"] =
        json!([running("proxy", "docker.io/r/proxy:2", "proxy-2", "c-2")]);
    let done = member_of(&set, &hash, &patched).unwrap();
    assert!(!done.unavailable(&hash), "runs the new image, ready");
}

#[test]
fn a_pods_own_init_container_named_like_a_native_sidecar_is_never_changed() {
    let old = native_set("r.example/proxy:1");
    let set = native_set("r.example/proxy:2");
    let hash = set.hash();
    let proxy = running("proxy", "r.example/proxy:1", "proxy-1", "c-1");
    // Its own "proxy" is an ordinary init container: the set's sidecar was not injected
    // as native here (and the pod says so in neither place).
    let mut own = injected(&set, &old.hash(), &proxy, "r.example/proxy:1");
    own.native.clear();
    if let Some(member) = member_of(&set, &hash, &own) {
        assert!(
            upgraded(&set, &hash, &member).is_none(),
            "nothing to change"
        );
    }
    // A forged list naming a container the webhook did not inject: not a member.
    let mut forged = injected(&set, &old.hash(), &proxy, "r.example/proxy:1");
    forged.marked.clear();
    assert!(member_of(&set, &hash, &forged).is_none());
}

/// A kube Pod the webhook injected, at `version`, with a status of its own.
fn kube_pod(version: &str, pod_ip: &str, proxy_ready: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1",
            "resourceVersion": version, "labels": {"app": "web"},
            "annotations": {HASH_ANNOTATION: "{}"}},
        "spec": {"nodeName": "n1", "containers": [
            {"name": "app", "image": "app:1"},
            {"name": "proxy", "image": "proxy:1", "env": [{"name": "IS_INJECTED", "value": "true"}]}]},
        "status": {
            "phase": "Running", "podIP": pod_ip, "startTime": "2026-11-30T09:00:00Z",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-30T09:00:00Z"}],
            "containerStatuses": [
                {"name": "app", "image": "app:1", "imageID": "i-app", "containerID": "c-app",
                 "ready": true, "restartCount": 0, "started": true,
                 "state": {"running": {"startedAt": "2026-11-30T09:00:01Z"}}},
                {"name": "proxy", "image": "proxy:1", "imageID": "i-proxy", "containerID": "c-proxy",
                 "ready": proxy_ready, "restartCount": 0,
                 "state": {"running": {"startedAt": "2026-11-30T09:00:01Z"}}}],
        },
    }))
    .unwrap()
}

#[test]
fn a_status_change_the_rollout_does_not_read_keeps_the_newest_version_and_wakes_nothing() {
    let pods = InjectedPods::default();
    pods.apply(Event::Init);
    pods.apply(Event::InitApply(kube_pod("7", "10.244.1.5", true)));
    pods.apply(Event::InitDone);
    let kept = pods.snapshot().unwrap();
    assert_eq!(kept.len(), 1);
    // Only what the rollout reads is kept of the status.
    assert_eq!(
        kept[0].status["containerStatuses"][1],
        json!({"name": "proxy", "image": "proxy:1", "imageID": "i-proxy",
               "containerID": "c-proxy", "ready": true, "state": {"running": {}}})
    );
    assert_eq!(
        kept[0].status["conditions"],
        json!([{"type": "Ready", "status": "True"}])
    );

    // A new version changing only what the rollout ignores: no pass is woken, and the
    // version kept is the new one (the patch's test must name it). (The listing's own
    // wake-up is taken first.)
    let _ = futures::FutureExt::now_or_never(pods.changed.notified());
    let woken = pods.changed.notified();
    let mut woken = std::pin::pin!(woken);
    woken.as_mut().enable();
    pods.apply(Event::Apply(kube_pod("8", "10.244.1.6", true)));
    assert!(
        futures::FutureExt::now_or_never(woken.as_mut()).is_none(),
        "a pass was woken for a change the rollout does not read"
    );
    assert_eq!(pods.snapshot().unwrap()[0].resource_version, "8");
    // A sidecar no longer ready is a change.
    pods.apply(Event::Apply(kube_pod("9", "10.244.1.6", false)));
    assert!(futures::FutureExt::now_or_never(woken).is_some());
}
