//! Rigger as kruise-daemon beside OpenKruise v1.9.0's own manager, on the lab's real
//! cluster (`scripts/lab-kruise up --without-daemon`, `scripts/lab-rigger up
//! --beside-kruise`): Kruise's manager turns ImagePullJobs and ImageListPullJobs into
//! NodeImage specs and computes their status from the NodeImages' status, which Rigger's
//! agents write as they pull. The scenarios are Kruise's own end-to-end tests of these
//! kinds (`test/e2e/apps/{v1alpha1,v1beta1}/pullimages.go`, `imagelistpulljobs.go` of
//! Kruise v1.9.0), written again here with the lab's images; each names the one it
//! follows. Kruise's fake NodeImage (a NodeImage with no node, which no daemon answers) is
//! left out: it tests Kruise's manager alone.
//!
//! `make test` runs these in a stage of their own (nextest's `beside-kruise` profile).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::real_cluster::RealCluster;
use rigger_integration_tests::{unique_image, wait_until};
use serde_json::Value;

fn gone(cluster: &RealCluster, namespace: &str, kind: &str, name: &str) -> bool {
    cluster.get_json(&[kind, name, "-n", namespace]).is_none()
}

/// The image's name (without its tag) and tag, as a NodeImage keys them.
fn name_and_tag(image: &str) -> (&str, &str) {
    image.rsplit_once(':').unwrap()
}

/// Whether NodeImage `node`'s spec asks for `image`.
fn in_node_image_spec(cluster: &RealCluster, node: &str, image: &str) -> bool {
    let (name, tag) = name_and_tag(image);
    cluster
        .get_json(&["nodeimage", node])
        .and_then(|n| n["spec"]["images"][name]["tags"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .any(|t| t["tag"] == tag)
}

/// The copies Kruise's manager made of `namespace/secret` in kruise-daemon-config.
fn synced_secrets(cluster: &RealCluster, namespace: &str, secret: &str) -> Vec<Value> {
    let key = format!("{namespace}/{secret}");
    cluster
        .get_json(&["secrets", "-n", "kruise-daemon-config"])
        .and_then(|list| list["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|s| {
            s["metadata"]["annotations"]["imagepulljobs.kruise.io/source-key"] == key.as_str()
        })
        .collect()
}

fn pull_secret(cluster: &RealCluster, namespace: &str, name: &str, password: &str) {
    // Credentials for the cluster's registry, which asks for none: the agent offers them
    // and is let in either way.
    let config = serde_json::json!({"auths": {cluster.registry.as_str(): {"username": "kruise", "password": password}}});
    cluster.apply(
        &serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {".dockerconfigjson": config.to_string()},
        })
        .to_string(),
    );
}

/// Kruise e2e "pull image with secret and ttl cleaned" (v1beta1) and "create an always
/// job to pull an image on all real nodes": every node pulls, the job goes at its TTL,
/// and with it the tag from the NodeImages and the secret's copy in kruise-daemon-config.
#[test]
fn an_always_job_with_a_secret_pulls_on_every_node_and_goes_at_its_ttl() {
    let cluster = RealCluster::beside_kruise();
    let ns = cluster.namespace("kruise-always");
    let nodes = cluster.nodes();
    let image = cluster.image(&unique_image("kruise-always", 2, 1 << 20));
    pull_secret(cluster, &ns.name, "pull-secret", "one");
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: test-imagepulljob, namespace: {ns}}}\n\
         spec:\n  image: {image}\n  parallelism: 4\n  pullSecrets: [pull-secret]\n  \
         pullPolicy: {{timeoutSeconds: 50, backoffLimit: 2}}\n  \
         completionPolicy: {{type: Always, activeDeadlineSeconds: 50, ttlSecondsAfterFinished: 20}}\n",
        ns = ns.name
    ));
    cluster.wait_status(
        &ns.name,
        "imagepulljob",
        "test-imagepulljob",
        Duration::from_secs(10),
        |s| s["desired"] == nodes.len(),
    );
    // (The copy made while a job runs is checked with the Never job, which keeps
    // running: this one may complete, and its copy go, within a second.)
    let done = cluster.wait_status(
        &ns.name,
        "imagepulljob",
        "test-imagepulljob",
        Duration::from_secs(180),
        |s| !s["completionTime"].is_null(),
    );
    assert_eq!(done["succeeded"], nodes.len(), "{done}");
    for node in &nodes {
        assert!(cluster.has_image(node, &image), "{node} has no {image}");
    }
    wait_until(
        "the job to go at its TTL (20 s)",
        Duration::from_secs(45),
        || gone(cluster, &ns.name, "imagepulljob", "test-imagepulljob").then_some(()),
    );
    wait_until(
        "the tag to leave the NodeImages",
        Duration::from_secs(25),
        || {
            nodes
                .iter()
                .all(|n| !in_node_image_spec(cluster, n, &image))
                .then_some(())
        },
    );
    wait_until("the copied secret to go", Duration::from_secs(10), || {
        synced_secrets(cluster, &ns.name, "pull-secret")
            .is_empty()
            .then_some(())
    });
}

/// Kruise e2e "never completion pull job with updated pull secrets" and "create a never
/// job to pull an image on all nodes": a changed secret reaches its copy, every node
/// pulls, and the job never completes; deleted, its tag leaves the NodeImages.
#[test]
fn a_never_job_pulls_on_every_node_follows_its_secret_and_never_completes() {
    let cluster = RealCluster::beside_kruise();
    let ns = cluster.namespace("kruise-never");
    let nodes = cluster.nodes();
    let image = cluster.image(&unique_image("kruise-never", 2, 1 << 20));
    pull_secret(cluster, &ns.name, "pull-secret", "one");
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata: {{name: test-imagepulljob, namespace: {ns}}}\n\
         spec:\n  image: {image}\n  parallelism: 4\n  pullSecrets: [pull-secret]\n  \
         pullPolicy: {{timeoutSeconds: 50, backoffLimit: 2}}\n  completionPolicy: {{type: Never}}\n",
        ns = ns.name
    ));
    let copies = wait_until("the secret copied", Duration::from_secs(10), || {
        let copies = synced_secrets(cluster, &ns.name, "pull-secret");
        (copies.len() == 1).then_some(copies)
    });
    let source = cluster
        .get_json(&["secret", "pull-secret", "-n", &ns.name])
        .unwrap();
    assert_eq!(
        copies[0]["data"], source["data"],
        "the copy differs from its source"
    );
    pull_secret(cluster, &ns.name, "pull-secret", "two");
    let source = cluster
        .get_json(&["secret", "pull-secret", "-n", &ns.name])
        .unwrap();
    wait_until(
        "the changed secret to reach its copy",
        Duration::from_secs(10),
        || {
            let copies = synced_secrets(cluster, &ns.name, "pull-secret");
            (copies.len() == 1 && copies[0]["data"] == source["data"]).then_some(())
        },
    );
    let done = cluster.wait_status(
        &ns.name,
        "imagepulljob",
        "test-imagepulljob",
        Duration::from_secs(180),
        |s| s["succeeded"] == nodes.len(),
    );
    assert_eq!(done["desired"], nodes.len(), "{done}");
    std::thread::sleep(Duration::from_secs(3));
    let later = cluster.object_status(&ns.name, "imagepulljob", "test-imagepulljob");
    assert!(
        later["completionTime"].is_null(),
        "a Never job completed: {later}"
    );
    cluster.kubectl_ok(&[
        "-n",
        &ns.name,
        "delete",
        "imagepulljob",
        "test-imagepulljob",
    ]);
    wait_until(
        "the tag to leave the NodeImages",
        Duration::from_secs(25),
        || {
            nodes
                .iter()
                .all(|n| !in_node_image_spec(cluster, n, &image))
                .then_some(())
        },
    );
    wait_until("the copied secret to go", Duration::from_secs(10), || {
        synced_secrets(cluster, &ns.name, "pull-secret")
            .is_empty()
            .then_some(())
    });
}

/// Kruise e2e "create an always job to pull an image on one real node" and "create two
/// jobs to pull a same image": a job that names one node pulls there only; a second job
/// for the same image and node succeeds too (its NodeImage tag already pulled).
#[test]
fn jobs_naming_one_node_pull_there_only_and_a_second_job_for_the_image_succeeds() {
    let cluster = RealCluster::beside_kruise();
    let ns = cluster.namespace("kruise-one");
    let nodes = cluster.nodes();
    let image = cluster.image(&unique_image("kruise-one", 2, 1 << 20));
    for job in ["test-imagepulljob-1", "test-imagepulljob-2"] {
        cluster.apply(&format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata: {{name: {job}, namespace: {ns}}}\n\
             spec:\n  image: {image}\n  parallelism: 4\n  selector: {{names: [{node}]}}\n  \
             pullPolicy: {{timeoutSeconds: 50, backoffLimit: 2}}\n  completionPolicy: {{type: Always}}\n",
            ns = ns.name,
            node = nodes[0],
        ));
        let done = cluster.wait_status(
            &ns.name,
            "imagepulljob",
            job,
            Duration::from_secs(60),
            |s| s["succeeded"] == 1 && !s["completionTime"].is_null(),
        );
        assert_eq!(done["desired"], 1, "{done}");
    }
    assert!(
        cluster.has_image(&nodes[0], &image),
        "{} has no {image}",
        nodes[0]
    );
    for node in &nodes[1..] {
        assert!(
            !cluster.has_image(node, &image),
            "{node} was not named but has {image}"
        );
    }
    for job in ["test-imagepulljob-1", "test-imagepulljob-2"] {
        cluster.kubectl_ok(&["-n", &ns.name, "delete", "imagepulljob", job]);
    }
    wait_until(
        "the tag to leave the NodeImage",
        Duration::from_secs(10),
        || (!in_node_image_spec(cluster, &nodes[0], &image)).then_some(()),
    );
}

fn child_jobs(cluster: &RealCluster, namespace: &str) -> Vec<Value> {
    cluster
        .get_json(&["imagepulljobs", "-n", namespace])
        .and_then(|list| list["items"].as_array().cloned())
        .unwrap_or_default()
}

/// Kruise e2e "create an always job to pull two images on all real nodes"
/// (ImageListPullJob, `imagePullPolicy: Always`): two child ImagePullJobs, both images on
/// every node, the list job gone at its TTL and its children with it.
#[test]
fn a_list_job_pulls_two_images_on_every_node_and_goes_at_its_ttl_with_its_children() {
    let cluster = RealCluster::beside_kruise();
    let ns = cluster.namespace("kruise-list");
    let nodes = cluster.nodes();
    let images = [
        cluster.image(&unique_image("kruise-list-a", 2, 1 << 20)),
        cluster.image(&unique_image("kruise-list-b", 1, 1 << 20)),
    ];
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImageListPullJob\nmetadata: {{name: test-imagelistpulljob, namespace: {ns}}}\n\
         spec:\n  images: [{a}, {b}]\n  parallelism: 4\n  imagePullPolicy: Always\n  \
         pullPolicy: {{timeoutSeconds: 50, backoffLimit: 2}}\n  \
         completionPolicy: {{type: Always, activeDeadlineSeconds: 50, ttlSecondsAfterFinished: 20}}\n",
        ns = ns.name,
        a = images[0],
        b = images[1],
    ));
    wait_until("two child ImagePullJobs", Duration::from_secs(10), || {
        (child_jobs(cluster, &ns.name).len() == 2).then_some(())
    });
    let done = cluster.wait_status(
        &ns.name,
        "imagelistpulljob",
        "test-imagelistpulljob",
        Duration::from_secs(120),
        |s| !s["completionTime"].is_null(),
    );
    assert_eq!(done["desired"], 2, "{done}");
    assert_eq!(done["succeeded"], 2, "{done}");
    for node in &nodes {
        for image in &images {
            assert!(cluster.has_image(node, image), "{node} has no {image}");
        }
    }
    wait_until(
        "the list job to go at its TTL (20 s)",
        Duration::from_secs(45),
        || {
            gone(
                cluster,
                &ns.name,
                "imagelistpulljob",
                "test-imagelistpulljob",
            )
            .then_some(())
        },
    );
    wait_until(
        "its child jobs to go with it",
        Duration::from_secs(30),
        || child_jobs(cluster, &ns.name).is_empty().then_some(()),
    );
}

/// Kruise e2e "create an always job to pull two images on one real node"
/// (ImageListPullJob): both images on the named node only; deleted, its children go.
#[test]
fn a_list_job_naming_one_node_pulls_both_images_there() {
    let cluster = RealCluster::beside_kruise();
    let ns = cluster.namespace("kruise-list-one");
    let nodes = cluster.nodes();
    let images = [
        cluster.image(&unique_image("kruise-list-one-a", 1, 1 << 20)),
        cluster.image(&unique_image("kruise-list-one-b", 1, 1 << 20)),
    ];
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImageListPullJob\nmetadata: {{name: test-imagelistpulljob, namespace: {ns}}}\n\
         spec:\n  images: [{a}, {b}]\n  parallelism: 4\n  selector: {{names: [{node}]}}\n  \
         pullPolicy: {{timeoutSeconds: 50, backoffLimit: 2}}\n  completionPolicy: {{type: Always}}\n",
        ns = ns.name,
        a = images[0],
        b = images[1],
        node = nodes[0],
    ));
    let done = cluster.wait_status(
        &ns.name,
        "imagelistpulljob",
        "test-imagelistpulljob",
        Duration::from_secs(120),
        |s| !s["completionTime"].is_null(),
    );
    assert_eq!(done["succeeded"], 2, "{done}");
    for image in &images {
        assert!(
            cluster.has_image(&nodes[0], image),
            "{} has no {image}",
            nodes[0]
        );
        for node in &nodes[1..] {
            assert!(
                !cluster.has_image(node, image),
                "{node} was not named but has {image}"
            );
        }
    }
    cluster.kubectl_ok(&[
        "-n",
        &ns.name,
        "delete",
        "imagelistpulljob",
        "test-imagelistpulljob",
    ]);
    wait_until("its child jobs to go", Duration::from_secs(60), || {
        child_jobs(cluster, &ns.name).is_empty().then_some(())
    });
}
