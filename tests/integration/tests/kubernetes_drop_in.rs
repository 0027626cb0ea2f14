//! Rigger at Kruise's boundary, on the lab's API server: a ContainerRecreateRequest made
//! with kubectl is admitted as Kruise's webhook admits it and carried out on a
//! kubelet-shaped pod (containers started through CRI with kubelet's labels, as no kubelet
//! runs here); a NodeImage written as Kruise's manager writes it is pulled and its status
//! written as Kruise's daemon writes it; and the controller's roles in
//! `deploy/kubernetes/rbac.yaml` are exactly the calls it makes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::kubernetes::{Cluster, corpus};
use rigger_integration_tests::{Lab, TestNamespace, repo_root, unique_image, wait_until};

/// A loop that ends at once on SIGTERM (shells as PID 1 ignore it otherwise).
const IDLE: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

/// A kubelet-shaped pod `web`: the Pod made with kubectl on `node_name`, its
/// `containers` started on `node` through CRI with kubelet's labels and annotations (the
/// first with kubelet's preStop, writing `/out/prestop`), and its status written as
/// kubelet writes it (no kubelet runs here).
struct KubeletPod {
    cri: rigger_integration_tests::CriPod,
    uid: String,
    out_dir: std::path::PathBuf,
    /// Each container's id, by name.
    ids: Vec<(String, String)>,
}

fn kubelet_pod(
    cluster: &Cluster,
    namespace: &str,
    node: &rigger_integration_tests::LabNode,
    node_name: &str,
    image: &str,
    dir: &std::path::Path,
    containers: &[&str],
) -> KubeletPod {
    use rigger_integration_tests::{CriPod, CriPodSpec};
    use std::collections::HashMap;
    let pulled =
        std::process::Command::new(rigger_integration_tests::binary("rigger-bench-cri-pull"))
            .arg(&node.address)
            .arg(image)
            .output()
            .unwrap();
    assert!(
        pulled.status.success(),
        "{}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    let pod_name = "web";
    let specs: Vec<serde_json::Value> = containers
        .iter()
        .map(|name| serde_json::json!({"name": name, "image": image}))
        .collect();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": namespace},
        "spec": {"nodeName": node_name, "terminationGracePeriodSeconds": 3, "containers": specs},
    });
    let out = cluster.kubectl_stdin(&["create"], &pod.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let uid = cluster
        .get_json(&["pod", pod_name, "-n", namespace])
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let labels = HashMap::from([
        (
            "io.kubernetes.pod.namespace".to_owned(),
            namespace.to_owned(),
        ),
        ("io.kubernetes.pod.name".to_owned(), pod_name.to_owned()),
        ("io.kubernetes.pod.uid".to_owned(), uid.clone()),
    ]);
    let mut container_labels = labels.clone();
    container_labels.insert("io.kubernetes.container.name".into(), containers[0].into());
    let mut spec = CriPodSpec::on(node, pod_name, image, &["sh", "-c", IDLE]);
    spec.namespace = namespace.to_owned();
    spec.uid = uid.clone();
    spec.labels = labels;
    spec.container = containers[0].to_owned();
    spec.container_labels = container_labels;
    spec.container_annotations = HashMap::from([
        (
            "io.kubernetes.container.restartCount".to_owned(),
            "0".to_owned(),
        ),
        (
            "io.kubernetes.pod.terminationGracePeriod".to_owned(),
            "3".to_owned(),
        ),
        (
            "io.kubernetes.container.preStopHandler".to_owned(),
            r#"{"exec":{"command":["sh","-c","echo prestop > /out/prestop"]}}"#.to_owned(),
        ),
    ]);
    spec.mounts = vec![(out_dir.clone(), "/out".to_owned())];
    let mut cri = CriPod::run_spec(&spec);
    let mut ids = vec![(containers[0].to_owned(), cri.container_id.clone())];
    for name in &containers[1..] {
        ids.push(((*name).to_owned(), cri.add_container(name)));
    }
    let statuses: Vec<serde_json::Value> = ids
        .iter()
        .map(|(name, id)| {
            serde_json::json!({
                "name": name, "image": image, "imageID": "", "ready": true, "restartCount": 0,
                "containerID": format!("containerd://{id}"), "state": {"running": {}},
            })
        })
        .collect();
    let status = serde_json::json!({"status": {"phase": "Running", "containerStatuses": statuses}});
    cluster.kubectl_ok(&[
        "patch",
        "pod",
        pod_name,
        "-n",
        namespace,
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        &status.to_string(),
    ]);
    KubeletPod {
        cri,
        uid,
        out_dir,
        ids,
    }
}

#[test]
fn a_recreate_request_made_with_kubectl_restarts_a_kubelet_pods_container_with_its_pre_stop() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let lab = Lab::get();
    let namespace = cluster.namespace("crr");
    let node = lab.first_node().clone();
    let dir = tempfile::tempdir().unwrap();
    let node_name = format!("k8s-crr-{}", std::process::id());
    let controller = cluster.controller(dir.path(), &namespace.name);
    let agent = cluster.node_agent(&controller, dir.path(), &node_name, &[], &node, "k8s.io");
    let image = lab.image("rigger-lab/busybox:1");
    let KubeletPod {
        cri: mut cri_pod,
        uid,
        out_dir,
        ..
    } = kubelet_pod(
        cluster,
        &namespace.name,
        &node,
        &node_name,
        &image,
        dir.path(),
        &["app"],
    );
    let old_container = cri_pod.container_id.clone();

    // Kruise's example, created with kubectl: no labels, no statusContext.
    // (`${POD}` is `web`, this pod.)
    let request = corpus("containerrecreaterequest-v1alpha1.yaml", "app", "", "");
    let out = cluster.kubectl_stdin(&["apply", "-n", &namespace.name], &request);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crr = wait_until(
        "the recreate, kubelet restarting",
        Duration::from_secs(60),
        || {
            cri_pod.restart_if_exited();
            let crr = cluster.get_json(&["crr", "restart-alpha-app", "-n", &namespace.name])?;
            // Completed, and no longer active (as Kruise's manager leaves it).
            let active = crr["metadata"]["labels"]["crr.apps.kruise.io/active"].as_str();
            if crr["status"]["phase"] == "Completed" && active.is_none() {
                return Some(crr);
            }
            std::thread::sleep(Duration::from_millis(200));
            None
        },
    );
    let logs = format!(
        "{crr:#}\n{}\n{}",
        rigger_integration_tests::log_tail(&controller.log, 30),
        rigger_integration_tests::log_tail(&agent.log, 30)
    );
    // Labelled as Kruise's webhook labels it, the instance recorded from the Pod's status.
    let labels = &crr["metadata"]["labels"];
    assert_eq!(
        labels["crr.apps.kruise.io/node-name"],
        node_name.as_str(),
        "{logs}"
    );
    assert_eq!(labels["crr.apps.kruise.io/pod-uid"], uid.as_str(), "{logs}");
    assert_eq!(
        crr["spec"]["containers"][0]["statusContext"]["containerID"],
        format!("containerd://{old_container}")
    );
    let state = &crr["status"]["containerRecreateStates"][0];
    assert_eq!(
        (state["name"].as_str(), state["phase"].as_str()),
        (Some("app"), Some("Succeeded")),
        "{logs}"
    );
    assert_eq!(state["isKilled"], true, "{logs}");
    assert_eq!(
        std::fs::read_to_string(out_dir.join("prestop"))
            .unwrap()
            .trim(),
        "prestop",
        "kubelet's preStop handler ran"
    );
    assert_ne!(
        cri_pod.container_id, old_container,
        "kubelet started the next attempt"
    );
    let shown = cluster.kubectl_ok(&["get", "crr", "-n", &namespace.name]);
    let header: Vec<&str> = shown.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "PHASE", "POD", "NODE", "AGE"], "{shown}");
    assert!(shown.contains(&node_name), "{shown}");

    // A request for a pod that does not exist completes at once, saying so.
    let missing = request
        .replace("restart-alpha-app", "restart-missing")
        .replace("podName: web", "podName: nowhere");
    let out = cluster.kubectl_stdin(&["apply", "-n", &namespace.name], &missing);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crr = wait_until("the refusal", Duration::from_secs(20), || {
        let crr = cluster.get_json(&["crr", "restart-missing", "-n", &namespace.name])?;
        (crr["status"]["phase"] == "Completed").then_some(crr)
    });
    assert_eq!(crr["status"]["message"], "pod nowhere not found", "{crr:#}");
}

#[test]
fn kruises_v1beta1_recreate_example_runs_on_a_two_container_kubelet_pod_with_its_own_pre_stop() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let lab = Lab::get();
    let namespace = cluster.namespace("crr-beta");
    let node = lab.first_node().clone();
    let dir = tempfile::tempdir().unwrap();
    let node_name = format!("k8s-crr-beta-{}", std::process::id());
    let controller = cluster.controller(dir.path(), &namespace.name);
    let agent = cluster.node_agent(&controller, dir.path(), &node_name, &[], &node, "k8s.io");
    let image = lab.image("rigger-lab/busybox:1");
    let KubeletPod {
        cri: mut pod,
        out_dir,
        ids,
        ..
    } = kubelet_pod(
        cluster,
        &namespace.name,
        &node,
        &node_name,
        &image,
        dir.path(),
        &["app", "web"],
    );
    let (old_app, web) = (ids[0].1.clone(), ids[1].1.clone());
    // Kruise's v1beta1 example: `app` with a preStop of the request's own (not run in a
    // cluster), `web` naming an instance that runs no more (so it counts as recreated, and
    // is not stopped).
    let request = corpus("containerrecreaterequest-v1beta1.yaml", "beta", "", "");
    let out = cluster.kubectl_stdin(&["apply", "-n", &namespace.name], &request);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crr = wait_until(
        "the recreate, kubelet restarting",
        Duration::from_secs(90),
        || {
            pod.restart_if_exited();
            let crr = cluster.get_json(&["crr", "restart-beta", "-n", &namespace.name])?;
            if crr["status"]["phase"] == "Completed" {
                return Some(crr);
            }
            std::thread::sleep(Duration::from_millis(200));
            None
        },
    );
    let logs = format!(
        "{crr:#}\n{}\n{}",
        rigger_integration_tests::log_tail(&controller.log, 30),
        rigger_integration_tests::log_tail(&agent.log, 30)
    );
    let state_of = |name: &str| {
        crr["status"]["containerRecreateStates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(state_of("app")["phase"], "Succeeded", "{logs}");
    assert_eq!(state_of("web")["phase"], "Succeeded", "{logs}");
    // In a cluster the hook is the container's own (kubelet's), as Kruise's webhook makes
    // it: the preStop the request brings is not run.
    assert_eq!(
        std::fs::read_to_string(out_dir.join("prestop"))
            .unwrap_or_default()
            .trim(),
        "prestop",
        "kubelet's preStop ran\n{logs}"
    );
    assert!(
        !out_dir.join("override-prestop").exists(),
        "the request's own preStop was run\n{logs}"
    );
    assert_ne!(
        pod.container_id, old_app,
        "kubelet started app's next attempt"
    );
    // `web`'s named instance was gone: the one running was left alone.
    let listed = node.ctr("k8s.io", &["containers", "ls", "-q"]);
    assert!(listed.contains(&web), "web was stopped\n{logs}");
}

#[test]
fn a_node_image_written_as_kruises_manager_writes_it_is_pulled_and_its_status_reads_as_kruises_daemon_writes_it()
 {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let lab = Lab::get();
    let namespace = cluster.namespace("nodeimage");
    let node = lab.first_node().clone();
    let ns = TestNamespace::on(&node, "k8s-nodeimage");
    let dir = tempfile::tempdir().unwrap();
    let node_name = format!("k8s-ni-{}", std::process::id());
    let controller = cluster.controller_with(dir.path(), &namespace.name, &["--kruise-manager"]);
    let agent = cluster.node_agent(&controller, dir.path(), &node_name, &[], &node, &ns.name);
    let reference = lab.image(&unique_image("k8s-nodeimage", 2, 64 << 10));
    let (repository, tag) = reference.rsplit_once(':').unwrap();
    // As Kruise's manager writes it for an ImagePullJob (owner, createdAt, version).
    let node_image = serde_json::json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
        "metadata": {"name": node_name, "labels": {"kubernetes.io/hostname": node_name}},
        "spec": {"images": {
            repository: {"tags": [{
                "tag": tag, "createdAt": "2026-11-26T10:00:00Z", "version": 2,
                "pullPolicy": {"timeoutSeconds": 600, "backoffLimit": 3, "ttlSecondsAfterFinished": 300},
                "imagePullPolicy": "IfNotPresent",
                "ownerReferences": [{"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
                                     "namespace": "default", "name": "warm", "uid": "0f4c6c1e"}],
            }]},
            "registry.invalid/secret-elsewhere": {
                "pullSecrets": [{"namespace": "default", "name": "stolen"}],
                "tags": [{"tag": "1"}],
            },
        }},
    });
    let out = cluster.kubectl_stdin(&["create"], &node_image.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = wait_until("the NodeImage's status", Duration::from_secs(60), || {
        let read = cluster.get_json(&["nodeimage", &node_name])?;
        (read["status"]["succeeded"] == 1 && read["status"]["failed"] == 1).then_some(read)
    });
    let logs = format!(
        "{read:#}\n{}\n{}",
        rigger_integration_tests::log_tail(&controller.log, 20),
        rigger_integration_tests::log_tail(&agent.log, 20)
    );
    let status = &read["status"];
    assert_eq!(
        (
            status["desired"].as_u64(),
            status["pulling"].as_u64(),
            status["waiting"].as_u64()
        ),
        (Some(2), Some(0), Some(0)),
        "{logs}"
    );
    let pulled = &status["imageStatuses"][repository]["tags"][0];
    assert_eq!(pulled["tag"], tag, "{logs}");
    assert_eq!(pulled["phase"], "Succeeded", "{logs}");
    assert_eq!(pulled["progress"], 100, "{logs}");
    assert_eq!(pulled["version"], 2, "{logs}");
    assert!(
        pulled["imageID"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{repository}@sha256:")),
        "{logs}"
    );
    assert!(
        pulled["startTime"].is_string() && pulled["completionTime"].is_string(),
        "{logs}"
    );
    // A secret outside Kruise's daemon namespace is never sent to a node.
    let refused = &status["imageStatuses"]["registry.invalid/secret-elsewhere"]["tags"][0];
    assert_eq!(refused["phase"], "Failed", "{logs}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("kruise-daemon-config"),
        "{logs}"
    );
    // The image is on the node, as containerd's own pull leaves it.
    assert!(
        node.ctr(&ns.name, &["images", "ls", "-q"])
            .contains(&reference),
        "{logs}"
    );
    let shown = cluster.kubectl_ok(&["get", "nodeimage", &node_name]);
    let header: Vec<&str> = shown.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "DESIRED", "PULLING", "SUCCEED", "FAILED", "AGE"],
        "{shown}"
    );
    let _ = cluster.kubectl(&["delete", "nodeimage", &node_name, "--wait=false"]);
}

/// `(group, resource, verb)` every rule of the controller's roles in
/// `deploy/kubernetes/rbac.yaml` grants.
fn granted() -> std::collections::BTreeSet<rigger_integration_tests::kubernetes::Call> {
    let text = std::fs::read_to_string(repo_root().join("deploy/kubernetes/rbac.yaml")).unwrap();
    let mut granted = std::collections::BTreeSet::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value = serde_json::to_value(
            <serde_yaml_ng::Value as serde::Deserialize>::deserialize(document).unwrap(),
        )
        .unwrap();
        let role = matches!(value["kind"].as_str(), Some("ClusterRole" | "Role"));
        if !role || value["metadata"]["name"] != "rigger-controller" {
            continue;
        }
        for rule in value["rules"].as_array().unwrap() {
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        granted.insert((
                            group.as_str().unwrap().to_owned(),
                            resource.as_str().unwrap().to_owned(),
                            verb.as_str().unwrap().to_owned(),
                        ));
                    }
                }
            }
        }
    }
    granted
}

/// The lab API server authorizes everything, so the roles are checked against what the
/// controller does: every call it made in the audit log (this test's scenario, which
/// exercises every engine, and every other test's so far) is granted, and every right
/// granted was used by this scenario — the roles are exactly the code's calls.
#[test]
fn the_controllers_roles_grant_exactly_the_calls_it_makes() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let lab = Lab::get();
    let namespace = cluster.namespace("rbac");
    let node = lab.first_node().clone();
    let ns = TestNamespace::on(&node, "k8s-rbac");
    let dir = tempfile::tempdir().unwrap();
    let mark = cluster.audit_mark();
    let node_name = format!("k8s-rbac-{}", std::process::id());
    let controller = cluster.controller(dir.path(), &namespace.name);
    let _agent = cluster.node_agent(&controller, dir.path(), &node_name, &[], &node, &ns.name);
    let image = lab.image(&unique_image("k8s-rbac", 1, 16 << 10));
    let repository = image.rsplit_once(':').unwrap().0;
    let apply = |yaml: &str| {
        let out = cluster.kubectl_stdin(&["apply", "-n", &namespace.name], yaml);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // A list with a pull secret: its job made, pulled, its status written; then the list
    // deleted at its ttl, and its job and the job's records with it.
    apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: cred}}\ntype: kubernetes.io/dockerconfigjson\n\
         stringData: {{.dockerconfigjson: '{{\"auths\":{{}}}}'}}\n---\n\
         apiVersion: apps.kruise.io/v1beta1\nkind: ImageListPullJob\nmetadata: {{name: list}}\n\
         spec:\n  images: [{image}]\n  selector: {{names: [{node_name}]}}\n  pullSecrets: [cred]\n  \
         completionPolicy: {{type: Always, ttlSecondsAfterFinished: 20}}\n"
    ));
    wait_until("the list to pull", Duration::from_secs(60), || {
        let list = cluster.get_json(&["imagelistpulljob", "list", "-n", &namespace.name])?;
        (list["status"]["succeeded"] == 1).then_some(())
    });
    // Rigger alone writes each node's NodeImage: spec from the jobs, status from the pulls
    // (made, then changed as the jobs come and go).
    let name = node_name.as_str();
    let tagged = |with: bool| {
        move || {
            let read = cluster.get_json(&["nodeimage", name])?;
            let asked = read["spec"]["images"][repository].is_object();
            (asked == with && read["status"]["imageStatuses"][repository].is_object()).then_some(())
        }
    };
    wait_until(
        "the node's NodeImage to ask for the image",
        Duration::from_secs(30),
        tagged(true),
    );
    // NodeImages are written every 10 s: the ttl (20 s) comes after the write above.
    wait_until("the list to go at its ttl", Duration::from_secs(60), || {
        cluster
            .get_json(&["imagelistpulljob", "list", "-n", &namespace.name])
            .is_none()
            .then_some(())
    });
    wait_until("the list's job to go", Duration::from_secs(30), || {
        let jobs = cluster.get_json(&["imagepulljobs", "-n", &namespace.name])?;
        jobs["items"].as_array()?.is_empty().then_some(())
    });
    wait_until(
        "the node's NodeImage to ask no more",
        Duration::from_secs(30),
        tagged(false),
    );
    // A recreate request for a Pod (labelled, its status written, removed after its TTL).
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": namespace.name},
        "spec": {"nodeName": node_name, "containers": [{"name": "app", "image": image}]},
    });
    assert!(
        cluster
            .kubectl_stdin(&["create"], &pod.to_string())
            .status
            .success()
    );
    let status = serde_json::json!({"status": {"containerStatuses": [{
        "name": "app", "image": image, "imageID": "", "ready": true, "restartCount": 0,
        "containerID": format!("containerd://{}", "0".repeat(64)),
    }]}});
    cluster.kubectl_ok(&[
        "patch",
        "pod",
        "web",
        "-n",
        &namespace.name,
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        &status.to_string(),
    ]);
    apply(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\nmetadata: {name: r}\n\
         spec:\n  podName: web\n  containers: [{name: app}]\n  ttlSecondsAfterFinished: 1\n",
    );
    wait_until(
        "the request to complete and go",
        Duration::from_secs(60),
        || {
            cluster
                .get_json(&["crr", "r", "-n", &namespace.name])
                .is_none()
                .then_some(())
        },
    );
    // A SidecarSet (its webhook entry written, its certificate's Secret filled, its
    // status written) injected into a pod made with kubectl, whose sidecar image is then
    // updated in place (the pod patched). The controller's namespace is never sent to
    // the webhook: the pod lives in another.
    let apps = cluster.namespace("rbac-apps");
    let set = format!("rbac-{}", std::process::id());
    let sidecar_set = |image: &str| {
        format!(
            "apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
             spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  \
             containers: [{{name: proxy, image: {image}}}]\n"
        )
    };
    apply(&sidecar_set("r.example/proxy:1"));
    cluster.wait_for_sidecar_webhook(std::slice::from_ref(&set));
    let injected = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "side", "namespace": apps.name, "labels": {"app": set}},
        "spec": {"containers": [{"name": "app", "image": "r.example/app:1"}]},
    });
    let out = cluster.kubectl_stdin(&["create"], &injected.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let statuses: Vec<serde_json::Value> = ["proxy", "app"]
        .map(|name| {
            serde_json::json!({
                "name": name, "image": "x", "imageID": format!("sha256:{name}"), "ready": true,
                "restartCount": 0, "state": {"running": {}},
                "containerID": format!("containerd://{name}"),
            })
        })
        .into();
    let running = serde_json::json!({"status": {
        "conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": statuses}});
    cluster.kubectl_ok(&[
        "patch",
        "pod",
        "side",
        "-n",
        &apps.name,
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        &running.to_string(),
    ]);
    apply(&sidecar_set("r.example/proxy:2"));
    wait_until(
        "the sidecar updated in place",
        Duration::from_secs(30),
        || {
            let pod = cluster.get_json(&["pod", "side", "-n", &apps.name])?;
            (pod["spec"]["containers"][0]["image"] == "r.example/proxy:2").then_some(())
        },
    );
    let _ = cluster.kubectl(&["delete", "sidecarset", &set, "--wait=false"]);
    // Lease renewals and the records' clean-up land.
    std::thread::sleep(Duration::from_secs(2));

    let granted = granted();
    let everything = cluster.calls_since("rigger-controller", 0);
    let not_granted: Vec<_> = everything.difference(&granted).collect();
    assert!(
        not_granted.is_empty(),
        "calls the roles do not grant: {not_granted:?}"
    );
    let mut used = cluster.calls_since("rigger-controller", mark);
    // Read only when a write meets a conflict (the store reads the version there is): a
    // NodeImage is written at the version listed, and this scenario changes none under it.
    used.insert((
        "apps.kruise.io".to_owned(),
        "nodeimages".to_owned(),
        "get".to_owned(),
    ));
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "rights granted that the code did not use here: {unused:?}\nused: {used:?}"
    );
    // And the kustomization builds with kubectl's own kustomize.
    let built = cluster.kubectl_ok(&[
        "kustomize",
        repo_root().join("deploy/kubernetes").to_str().unwrap(),
    ]);
    for kind in [
        "CustomResourceDefinition",
        "ClusterRole",
        "Role",
        "Deployment",
        "DaemonSet",
    ] {
        assert!(
            built.contains(&format!("kind: {kind}\n")),
            "kustomize output has no {kind}"
        );
    }
}
