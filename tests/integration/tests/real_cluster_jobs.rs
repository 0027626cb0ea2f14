//! ImagePullJobs on the lab's real cluster (scripts/lab-cluster), Rigger deployed as users
//! deploy it: kubelet then finds the images the agents pulled, as it finds its own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::real_cluster::{RealCluster, lab_cluster, lab_rigger};
use rigger_integration_tests::{unique_image_with, wait_until};

/// Scenario 1: an ImagePullJob (v1beta1) warms exactly the nodes a label set with `kubectl
/// label node` chooses; a Deployment whose pods use that image with `IfNotPresent` then
/// starts without any pull (kubelet says the image was present), and an unchosen node has
/// no copy.
#[test]
fn a_job_warms_the_labelled_nodes_and_kubelet_then_starts_pods_without_pulling() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("warm");
    let nodes = cluster.nodes();
    assert!(
        nodes.len() >= 3,
        "the lab's cluster has three nodes: {nodes:?}"
    );
    let (chosen, unchosen) = (&nodes[..2], &nodes[2]);
    let label = format!("rigger-test-warm-{}", std::process::id());
    for node in chosen {
        cluster.kubectl_ok(&["label", "node", node, &format!("{label}=yes")]);
    }
    let image = cluster.image(&unique_image_with(
        "warm",
        3,
        256 << 10,
        &["--base", "busybox"],
    ));
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: warm, namespace: {ns}}}\n\
         spec:\n  image: {image}\n  selector: {{matchLabels: {{{label}: 'yes'}}}}\n  \
         completionPolicy: {{type: Always}}\n",
        ns = ns.name
    ));
    cluster.kubectl_ok(&[
        "-n",
        &ns.name,
        "wait",
        "imagepulljob/warm",
        "--for=jsonpath={.status.succeeded}=2",
        "--timeout=120s",
    ]);
    let status = cluster.object_status(&ns.name, "imagepulljob", "warm");
    assert_eq!(status["desired"], 2, "{status}");
    assert_eq!(status["failed"], 0, "{status}");
    for node in chosen {
        assert!(cluster.has_image(node, &image), "{node} has no {image}");
    }
    assert!(
        !cluster.has_image(unchosen, &image),
        "{unchosen} was not chosen but has {image}"
    );

    cluster.apply(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: warmed, namespace: {ns}}}\n\
         spec:\n  replicas: 2\n  selector: {{matchLabels: {{app: warmed}}}}\n  template:\n    \
         metadata: {{labels: {{app: warmed}}}}\n    spec:\n      nodeSelector: {{{label}: 'yes'}}\n      \
         terminationGracePeriodSeconds: 1\n      containers:\n      - name: app\n        image: {image}\n        \
         imagePullPolicy: IfNotPresent\n        command: [/bin/sleep, '3600']\n",
        ns = ns.name
    ));
    cluster.rollout_status(&ns.name, "deployment/warmed", Duration::from_secs(120));
    let pods = cluster
        .get_json(&["pods", "-n", &ns.name, "-l", "app=warmed"])
        .unwrap();
    for pod in pods["items"].as_array().unwrap() {
        let name = pod["metadata"]["name"].as_str().unwrap();
        let events = cluster.events_of(&ns.name, name);
        assert!(
            events
                .iter()
                .any(|e| e.starts_with("Pulled: ") && e.contains("already present on machine")),
            "kubelet did not find {image} present for {name}: {events:?}"
        );
        assert!(
            !events.iter().any(|e| e.starts_with("Pulling: ")),
            "kubelet pulled {image} for {name}: {events:?}"
        );
    }
    for node in chosen {
        cluster.kubectl_ok(&["label", "node", node, &format!("{label}-")]);
    }
}

/// Scenario 4: a node that joins after a `completionPolicy: Never` job started (a kubelet
/// started later, its agent the DaemonSet's) gets the job's image without anybody
/// touching the job.
#[test]
fn a_node_that_joins_later_gets_the_images_of_a_job_that_never_completes() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("joins");
    let image = cluster.image(&unique_image_with(
        "joins",
        2,
        128 << 10,
        &["--base", "none"],
    ));
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: always, namespace: {ns}}}\n\
         spec:\n  image: {image}\n  completionPolicy: {{type: Never}}\n",
        ns = ns.name
    ));
    let before = cluster.nodes().len() as u64;
    wait_until("every node to pull", Duration::from_secs(120), || {
        (cluster.object_status(&ns.name, "imagepulljob", "always")["succeeded"] == before)
            .then_some(())
    });

    // The new node's agent certificate first (what provisioning a node does), then its
    // kubelet; the DaemonSet puts an agent on it.
    let index = (1..)
        .find(|i| !cluster.dir.join(format!("nodes/kube-{i}")).exists())
        .unwrap();
    let node = format!("kube-{index}");
    lab_rigger(&["certs", &node]);
    let joined = lab_cluster(&["join", "2.1", &index.to_string()]);
    assert_eq!(joined, node);
    let left = Leave(node.clone());
    wait_until(
        "the job to count the new node",
        Duration::from_secs(180),
        || {
            let status = cluster.object_status(&ns.name, "imagepulljob", "always");
            (status["succeeded"] == before + 1).then_some(())
        },
    );
    assert!(cluster.has_image(&node, &image), "{node} has no {image}");

    // The node leaves (its Node deleted): a job over every node no longer waits for it.
    drop(left);
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: after, namespace: {ns}}}\n\
         spec:\n  image: {image}\n  completionPolicy: {{type: Always}}\n",
        ns = ns.name
    ));
    let status = wait_until(
        "the job after the node left",
        Duration::from_secs(90),
        || {
            let status = cluster.object_status(&ns.name, "imagepulljob", "after");
            status["completionTime"].is_string().then_some(status)
        },
    );
    assert_eq!(status["desired"], before, "{status}");
    assert_eq!(status["succeeded"], before, "{status}");
}

/// The node a test joined leaves when the test ends, passed or not.
struct Leave(String);

impl Drop for Leave {
    fn drop(&mut self) {
        let _ = std::process::Command::new(
            rigger_integration_tests::repo_root().join("scripts/lab-cluster"),
        )
        .args(["leave", &self.0])
        .status();
    }
}

/// A pull Secret marked `immutable: true` (what the API server returns with the field) is
/// read like any other: the job naming it completes.
#[test]
fn a_job_whose_pull_secret_is_immutable_completes() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("immutable");
    let image = cluster.image(&unique_image_with(
        "immutable",
        1,
        64 << 10,
        &["--base", "none"],
    ));
    let config =
        serde_json::json!({"auths": {cluster.registry.as_str(): {"auth": "cmlnZ2VyOnNlY3JldA=="}}});
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: cred, namespace: {ns}}}\ntype: kubernetes.io/dockerconfigjson\n\
         immutable: true\nstringData:\n  .dockerconfigjson: '{config}'\n",
        ns = ns.name
    ));
    let node = &cluster.nodes()[0];
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImageListPullJob\nmetadata: {{name: list, namespace: {ns}}}\n\
         spec:\n  images: [{image}]\n  selector: {{names: [{node}]}}\n  pullSecrets: [cred]\n  \
         completionPolicy: {{type: Always}}\n",
        ns = ns.name
    ));
    wait_until("the list job to complete", Duration::from_secs(120), || {
        let status = cluster.object_status(&ns.name, "imagelistpulljob", "list");
        (status["completed"] == 1).then_some(status)
    });
    let status = cluster.object_status(&ns.name, "imagelistpulljob", "list");
    assert_eq!(status["succeeded"], 1, "{status}");
    assert!(cluster.has_image(node, &image));
}

/// Kruise's manager marks its jobs with a finalizer, and a list's jobs go at the ttl of
/// its template: in both cases a job Rigger ended must stay ended. A list that finished
/// does not make again the job its ttl deleted (and goes itself at its ttl, as Kruise's
/// lists do), and a job deleted at its ttl but kept by a finalizer is not loaded again as
/// a new job: the image taken from the node meanwhile is not pulled back.
#[test]
fn jobs_ended_at_their_ttl_stay_ended_when_a_finalizer_keeps_them_or_their_list_finished() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("ended");
    let node = &cluster.nodes()[0];
    let listed = cluster.image(&unique_image_with(
        "ended-list",
        1,
        64 << 10,
        &["--base", "none"],
    ));
    let held = cluster.image(&unique_image_with(
        "ended-held",
        1,
        64 << 10,
        &["--base", "none"],
    ));
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImageListPullJob\nmetadata: {{name: list, namespace: {ns}}}\n\
         spec:\n  images: [{listed}]\n  selector: {{names: [{node}]}}\n  \
         completionPolicy: {{type: Always, ttlSecondsAfterFinished: 8}}\n---\n\
         apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: held, namespace: {ns}, \
         finalizers: [example.com/hold]}}\n\
         spec:\n  image: {held}\n  selector: {{names: [{node}]}}\n  \
         completionPolicy: {{type: Always, ttlSecondsAfterFinished: 1}}\n",
        ns = ns.name
    ));
    // The finalizer goes when the test ends, passed or not: a job it holds would keep
    // the CRD from going when the lab deletes it.
    struct Release<'a>(&'a RealCluster, &'a str);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            let _ = self.0.kubectl(&[
                "patch",
                "imagepulljob",
                "held",
                "-n",
                self.1,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]);
        }
    }
    let _release = Release(cluster, &ns.name);
    let children = || {
        cluster
            .get_json(&[
                "imagepulljob",
                "-n",
                &ns.name,
                "-l",
                "imagelistpulljob.rigger.dev/name=list",
            ])
            .and_then(|l| l["items"].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    // Its job goes at the template's ttl (8 s), and it at the same ttl, about when its
    // job does: between the two, the job is not made again.
    wait_until("the list to finish", Duration::from_secs(120), || {
        let status = cluster.object_status(&ns.name, "imagelistpulljob", "list");
        (!status["completionTime"].is_null()).then_some(())
    });
    let mut went = false;
    wait_until("the list to go at its ttl", Duration::from_secs(60), || {
        let list = cluster.get_json(&["imagelistpulljob", "list", "-n", &ns.name]);
        let count = children();
        assert!(
            !(went && count > 0 && list.is_some()),
            "the finished list made its job again"
        );
        went |= count == 0;
        list.is_none().then_some(())
    });
    wait_until("the list's job to be gone", Duration::from_secs(30), || {
        (children() == 0).then_some(())
    });
    wait_until(
        "the held job to be deleted at its ttl",
        Duration::from_secs(120),
        || {
            cluster
                .get_json(&["imagepulljob", "held", "-n", &ns.name])
                .is_some_and(|job| !job["metadata"]["deletionTimestamp"].is_null())
                .then_some(())
        },
    );
    cluster.ctr(node, &["images", "rm", "--sync", &held]);
    // Several of the controller's passes (one a second).
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !cluster.has_image(node, &held),
        "the job kept by a finalizer pulled {held} again"
    );
}
