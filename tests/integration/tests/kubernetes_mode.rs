//! Kubernetes mode on a real API server (the lab's, `scripts/lab-k8s`): Rigger's CRDs
//! take Kruise's examples in both versions, the controller keeps its store on the API
//! server with the same guarantees as the embedded store and etcd, and a job applied
//! with kubectl is carried out by the lab's containerd nodes registered as Nodes,
//! chosen by labels set with `kubectl label node`.
//!
//! No kubelet runs here: Nodes are objects the test creates, and the agents are real
//! agents on the lab's containerd nodes, named as those Nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::kubernetes::{Cluster, corpus};
use rigger_integration_tests::{
    Agent, Controller, Lab, TestNamespace, repo_root, unique_image, wait_until,
};
use rigger_store::{KubernetesSettings, KubernetesStore, Precondition, Store, StoreError};

#[test]
fn every_kruise_example_applies_with_kubectl_in_both_versions() {
    let cluster = Cluster::get();
    let namespace = cluster.namespace("corpus");
    let node = format!("corpus-node-{}", std::process::id());
    for file in [
        "imagepulljob-v1alpha1.yaml",
        "imagepulljob-v1beta1.yaml",
        "imagelistpulljob-v1alpha1.yaml",
        "imagelistpulljob-v1beta1.yaml",
        "containerrecreaterequest-v1alpha1.yaml",
        "containerrecreaterequest-v1beta1.yaml",
        "sidecarset-v1alpha1.yaml",
        "sidecarset-v1beta1.yaml",
        "nodeimage-v1alpha1.yaml",
        "nodeimage-v1beta1.yaml",
    ] {
        let document = corpus(file, "c1", &node, "registry.invalid/app:1");
        let out = cluster.kubectl_stdin(
            &["apply", "--dry-run=server", "-n", &namespace.name],
            &document,
        );
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The API server refuses what Kruise's refuses, with the field named.
    let typo = corpus(
        "sidecarset-refused.yaml",
        "c2",
        &node,
        "registry.invalid/app:1",
    );
    let out = cluster.kubectl_stdin(&["apply", "--dry-run=server"], &typo);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("podInjectPolcy"),
        "{stderr}"
    );
    let bad = "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {name: bad}\n\
               spec: {image: a, parallelism: {x: 1}}\n";
    let out = cluster.kubectl_stdin(&["apply", "--dry-run=server", "-n", &namespace.name], bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("spec.parallelism"),
        "{stderr}"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The store on the lab's API server, its client on `rt` (a kube client lives on the
/// runtime that made it).
fn connect(rt: &tokio::runtime::Runtime, cluster: &Cluster, namespace: &str) -> Store {
    rt.block_on(async {
        Store::new(
            // As an administrator: this exercises the store's whole interface, not the
            // controller's calls (the RBAC test watches those).
            KubernetesStore::connect(
                &KubernetesSettings {
                    kubeconfig: Some(cluster.kubeconfig.clone()),
                    namespace: namespace.to_owned(),
                    kruise_manager: false,
                    write_node_images: true,
                },
                std::time::Duration::from_secs(15),
            )
            .await
            .unwrap(),
        )
    })
}

#[test]
fn the_store_keeps_its_promises_on_the_api_server() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let namespace = cluster.namespace("store");
    let rt = runtime();
    let store = connect(&rt, cluster, &namespace.name);
    // The controller's records: the same behaviour as the embedded store and etcd.
    rt.block_on(rigger_store::conformance_of(
        &store,
        "ImagePullJob.nodes",
        "Node.labels",
        &namespace.name,
    ))
    .unwrap();

    // A user's kind is its custom resource; its status the status subresource.
    let job = serde_json::json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": "warm", "namespace": namespace.name},
        "spec": {"image": "registry.invalid/app:1", "selector": {"names": ["n1"]},
                 "completionPolicy": {"type": "Never"}},
    });
    let key = rigger_store::ObjectKey::new("ImagePullJob", &namespace.name, "warm");
    let status_key = rigger_store::ObjectKey::new("ImagePullJob.status", &namespace.name, "warm");
    let created = rt
        .block_on(store.put(
            key.clone(),
            job.to_string().into_bytes(),
            Precondition::Absent,
        ))
        .unwrap();
    let read = rt
        .block_on(
            store.get_object::<rigger_api::image_pull_job::ImagePullJob>(&namespace.name, "warm"),
        )
        .unwrap()
        .unwrap();
    assert_eq!(read.revision, created);
    assert_eq!(read.value.spec.image, "registry.invalid/app:1");
    let status = serde_json::json!({"desired": 1, "active": 0, "succeeded": 1, "failed": 0});
    let with_status = rt
        .block_on(store.put(
            status_key.clone(),
            status.to_string().into_bytes(),
            Precondition::Any,
        ))
        .unwrap();
    assert!(with_status > created);
    let shown = cluster.kubectl_ok(&["get", "imagepulljobs", "-n", &namespace.name]);
    let header: Vec<&str> = shown.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "AGE"],
        "{shown}"
    );
    let row: Vec<&str> = shown.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..5], ["warm", "1", "0", "1", "0"], "{shown}");
    // A write at the revision before the status is stale.
    let stale = rt.block_on(store.put(
        key.clone(),
        job.to_string().into_bytes(),
        Precondition::Revision(created),
    ));
    assert!(
        matches!(stale, Err(StoreError::Conflict { .. })),
        "{stale:?}"
    );
    // Bytes that are not an object the API server takes are refused, naming the key.
    let refused = rt
        .block_on(store.put(key.clone(), b"{\"spec\": 7}".to_vec(), Precondition::Any))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("ImagePullJob"), "{refused}");
    rt.block_on(store.delete(key, Precondition::Any)).unwrap();
    assert!(rt.block_on(store.get(status_key)).unwrap().is_none());
}

/// Engines act on a user's apply when the watch delivers it, not at their next tick:
/// the store tells of changes others make to the kinds an engine reads (its own writes
/// are known by their version and wake nothing: the cache's unit tests).
#[test]
fn a_kubectl_apply_is_told_by_the_store_as_it_happens() {
    let cluster = Cluster::get();
    let namespace = cluster.namespace("store-changes");
    let rt = runtime();
    let store = connect(&rt, cluster, &namespace.name);
    let mut changes = store
        .changes("ImagePullJob")
        .expect("the Kubernetes store tells of changes");
    assert!(
        store.changes("ImagePullJob.nodes").is_none(),
        "the controller's own records are not told"
    );
    // The first list starts the watch; its first listing counts as one change.
    rt.block_on(store.list("ImagePullJob")).unwrap();
    let told = |changes: &mut tokio::sync::watch::Receiver<u64>| {
        rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(30), changes.changed()).await
        })
    };
    told(&mut changes)
        .expect("the watch's first listing is told")
        .unwrap();
    let before = *changes.borrow_and_update();
    let job = format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\n\
         metadata: {{name: applied, namespace: {}}}\n\
         spec: {{image: registry.invalid/app:1, completionPolicy: {{type: Never}}}}\n",
        namespace.name
    );
    let out = cluster.kubectl_stdin(&["apply"], &job);
    assert!(out.status.success(), "{out:?}");
    told(&mut changes)
        .expect("a kubectl apply is told")
        .unwrap();
    assert!(*changes.borrow() > before);

    // A write "whatever is there" starts from the version the watch knows, which another
    // writer may just have made stale: it still lands, once, over the newest.
    let key = rigger_store::ObjectKey::new("ImagePullJob", &namespace.name, "applied");
    let edited = cluster.kubectl_ok(&[
        "-n",
        &namespace.name,
        "patch",
        "imagepulljob",
        "applied",
        "--type=merge",
        "-p",
        r#"{"spec":{"parallelism":2}}"#,
    ]);
    assert!(edited.contains("patched"), "{edited}");
    let ours = serde_json::json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
        "metadata": {"name": "applied", "namespace": namespace.name},
        "spec": {"image": "registry.invalid/app:2", "completionPolicy": {"type": "Never"}},
    });
    let written = rt
        .block_on(store.put(key, ours.to_string().into_bytes(), Precondition::Any))
        .unwrap();
    let status_key =
        rigger_store::ObjectKey::new("ImagePullJob.status", &namespace.name, "applied");
    let status = serde_json::json!({"desired": 1, "active": 1, "succeeded": 0, "failed": 0,
                                    "message": "pulling"});
    let with_status = rt
        .block_on(store.put(
            status_key.clone(),
            status.to_string().into_bytes(),
            Precondition::Any,
        ))
        .unwrap();
    assert!(with_status > written);
    // The whole status is replaced, not merged: a field left out is gone.
    let status = serde_json::json!({"desired": 1, "active": 0, "succeeded": 1, "failed": 0});
    rt.block_on(store.put(
        status_key.clone(),
        status.to_string().into_bytes(),
        Precondition::Any,
    ))
    .unwrap();
    let read = cluster
        .get_json(&["-n", &namespace.name, "imagepulljob", "applied"])
        .unwrap();
    assert_eq!(read["spec"]["image"], "registry.invalid/app:2", "{read}");
    // A status cleared is gone from the object, which stays; clearing none is no error.
    for _ in 0..2 {
        rt.block_on(store.delete(status_key.clone(), Precondition::Any))
            .unwrap();
        let read = cluster
            .get_json(&["-n", &namespace.name, "imagepulljob", "applied"])
            .unwrap();
        assert!(read["status"].is_null(), "{read}");
    }
    rt.block_on(store.put(
        status_key,
        status.to_string().into_bytes(),
        Precondition::Any,
    ))
    .unwrap();
    assert_eq!(
        read["status"],
        serde_json::json!({"desired": 1, "active": 0, "succeeded": 1, "failed": 0}),
        "{read}"
    );
}

#[test]
fn a_job_applied_with_kubectl_runs_on_the_nodes_kubectl_labelled() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let lab = Lab::get();
    let namespace = cluster.namespace("job");
    let (first, second) = (lab.first_node().clone(), lab.second_node());
    let ns = TestNamespace::on(&first, "k8s-job");
    let _ns2 = TestNamespace::on(&second, "k8s-job");
    let dir = tempfile::tempdir().unwrap();
    let id = std::process::id();
    let (chosen, other) = (format!("k8s-a-{id}"), format!("k8s-b-{id}"));
    cluster.create_node(&chosen, &[]);
    cluster.create_node(&other, &[]);
    let controller = cluster.controller(dir.path(), &namespace.name);
    let start = |node: &str, lab_node: &rigger_integration_tests::LabNode, labels: &str| {
        let state = dir.path().join(node);
        std::fs::create_dir_all(&state).unwrap();
        let mut agent = Agent::start(
            &controller,
            node,
            &lab_node.address,
            &lab_node.hosts_dir,
            &ns.name,
            &state,
        );
        agent.restart_with_node_labels(labels);
        agent
    };
    // The other node's agent claims the label: in a cluster, that is not believed.
    let _a = start(&chosen, &first, "team=x");
    let _b = start(&other, &second, "pool=warm");
    cluster.kubectl_ok(&["label", "node", &chosen, "pool=warm"]);
    let image = lab.image(&unique_image("k8s-job", 2, 64 << 10));
    let job = format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata:\n  name: warm\n\
         spec:\n  image: {image}\n  selector:\n    matchLabels: {{pool: warm}}\n  \
         completionPolicy: {{type: Always}}\n"
    );
    let out = cluster.kubectl_stdin(&["apply", "-n", &namespace.name], &job);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let waited = cluster.kubectl(&[
        "wait",
        "-n",
        &namespace.name,
        "imagepulljob/warm",
        "--for=jsonpath={.status.succeeded}=1",
        "--timeout=60s",
    ]);
    assert!(
        waited.status.success(),
        "{}\ncontroller log:\n{}",
        String::from_utf8_lossy(&waited.stderr),
        rigger_integration_tests::log_tail(&controller.log, 40)
    );
    let job = cluster
        .get_json(&["imagepulljob", "warm", "-n", &namespace.name])
        .unwrap();
    assert_eq!(job["status"]["desired"], 1, "{job}");
    let shown = cluster.kubectl_ok(&["get", "imagepulljobs", "-n", &namespace.name]);
    assert!(
        shown
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()[..5]
            == ["warm", "1", "0", "1", "0"],
        "{shown}"
    );
    // Pulled where kubectl's label said, and only there.
    assert!(
        first
            .ctr(&ns.name, &["images", "ls", "-q"])
            .contains(&image)
    );
    assert!(
        !second
            .ctr(&ns.name, &["images", "ls", "-q"])
            .contains(&image)
    );
    wait_until("the job's completion", Duration::from_secs(30), || {
        let job = cluster.get_json(&["imagepulljob", "warm", "-n", &namespace.name])?;
        job["status"]["completionTime"].is_string().then_some(())
    });
    // riggerctl reads the controller, but neither writes around the API server nor reads
    // Secrets with the controller's rights.
    let refused = controller.ctl(&["-n", &namespace.name, "get", "secret", "any"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("read Secrets with kubectl"),
        "{stderr}"
    );
    let refused = controller.apply(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {name: other}\n\
         spec: {image: registry.invalid/a:1, selector: {names: [x]}}\n",
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("write them with kubectl"),
        "{stderr}"
    );
    assert!(
        controller
            .get_json(&["imagepulljob", "warm", "-n", &namespace.name])
            .is_some()
    );
    // Each node's NodeImage, as Kruise's manager and daemon would leave it.
    let (repository, tag) = image.rsplit_once(':').unwrap();
    let node_image = wait_until("the node's NodeImage", Duration::from_secs(30), || {
        let read = cluster.get_json(&["nodeimage", &chosen])?;
        (read["status"]["succeeded"] == 1).then_some(read)
    });
    assert_eq!(
        node_image["spec"]["images"][repository]["tags"][0]["tag"], tag,
        "{node_image:#}"
    );
    assert_eq!(
        node_image["spec"]["images"][repository]["tags"][0]["ownerReferences"][0]["name"], "warm",
        "{node_image:#}"
    );
    assert_eq!(
        node_image["status"]["imageStatuses"][repository]["tags"][0]["phase"], "Succeeded",
        "{node_image:#}"
    );
    // Told as Kruise tells it: an Event on the job, with Kruise's reason.
    let events = wait_until("the job's event", Duration::from_secs(10), || {
        let events = cluster.get_json(&[
            "events",
            "-n",
            &namespace.name,
            "--field-selector",
            "involvedObject.name=warm",
        ])?;
        (!events["items"].as_array()?.is_empty()).then_some(events)
    });
    let event = &events["items"][0];
    assert_eq!(event["reason"], "PullImageSucceed", "{event:#}");
    assert_eq!(event["involvedObject"]["kind"], "ImagePullJob", "{event:#}");
    assert!(
        event["message"]
            .as_str()
            .unwrap()
            .contains("on all 1 nodes"),
        "{event:#}"
    );
}

#[test]
fn killing_the_leader_mid_job_hands_the_lease_over_and_nothing_is_pulled_twice() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let lab = Lab::get();
    let namespace = cluster.namespace("ha");
    let (first, second) = (lab.first_node().clone(), lab.second_node());
    let ns = TestNamespace::on(&first, "k8s-ha");
    let _ns2 = TestNamespace::on(&second, "k8s-ha");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = cluster.controller_kubeconfig.to_str().unwrap().to_owned();
    let mut replicas = Controller::replicas_with(
        dir.path(),
        2,
        &[
            "--store",
            "kubernetes",
            "--kubeconfig",
            &kubeconfig,
            "--kubernetes-namespace",
            &namespace.name,
            "--leader-lease",
            "3s",
            // Two replicas on one host: each its own webhook port (no pod here has
            // sidecars, so the API server never calls it).
            "--sidecar-webhook-listen",
            "127.0.0.1:0",
            "--sidecar-webhook-url",
            "https://127.0.0.1:9443",
        ],
    );
    wait_until("a leader", Duration::from_secs(20), || {
        (replicas.iter().filter(|r| r.is_leader()).count() == 1).then_some(())
    });
    let id = std::process::id();
    let names = [format!("k8s-ha-a-{id}"), format!("k8s-ha-b-{id}")];
    let mut agents = Vec::new();
    for (name, node) in names.iter().zip([&first, &second]) {
        cluster.create_node(name, &[]);
        let state = dir.path().join(name);
        std::fs::create_dir_all(&state).unwrap();
        agents.push(Agent::start(
            &replicas[0],
            name,
            &node.address,
            &node.hosts_dir,
            &ns.name,
            &state,
        ));
    }
    // Big enough to be mid-pull when the leader dies; one node at a time.
    let image = lab.image(&unique_image("k8s-ha", 2, 3 << 20));
    let job = format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: warm\n\
         spec:\n  image: {image}\n  parallelism: 1\n  selector:\n    names: [{}, {}]\n  \
         completionPolicy: {{type: Always}}\n",
        names[0], names[1]
    );
    let out = cluster.kubectl_stdin(&["apply", "-n", &namespace.name], &job);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until("a node to pull", Duration::from_secs(60), || {
        let job = cluster.get_json(&["imagepulljob", "warm", "-n", &namespace.name])?;
        (job["status"]["active"] == 1 || job["status"]["succeeded"] == 1).then_some(())
    });
    let leader = replicas.iter_mut().find(|r| r.is_leader()).unwrap();
    leader.kill();
    let waited = cluster.kubectl(&[
        "wait",
        "-n",
        &namespace.name,
        "imagepulljob/warm",
        "--for=jsonpath={.status.succeeded}=2",
        "--timeout=90s",
    ]);
    let logs = || {
        replicas
            .iter()
            .map(|r| rigger_integration_tests::log_tail(&r.log, 30))
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    assert!(
        waited.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&waited.stderr),
        logs()
    );
    let successor = replicas
        .iter()
        .find(|r| r.is_leader())
        .expect("a replica took over");
    // Each node pulled once: the successor continued from what the API server holds.
    let job = successor
        .get_json(&["imagepulljob", "warm", "-n", &namespace.name])
        .unwrap();
    for node in job["status"]["nodes"].as_array().unwrap() {
        assert_eq!(
            node["attempts"],
            1,
            "no node pulled twice: {node:#}\n{}",
            logs()
        );
    }
    let lease = cluster
        .get_json(&["lease", "rigger-controller", "-n", &namespace.name])
        .unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1, "{lease:#}");
    drop(agents);
}

#[test]
fn kruises_pull_job_examples_applied_with_kubectl_are_carried_out_on_the_lab_nodes() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let lab = Lab::get();
    let namespace = cluster.namespace("corpus-run");
    let node = lab.first_node().clone();
    let ns = TestNamespace::on(&node, "k8s-corpus");
    let dir = tempfile::tempdir().unwrap();
    let id = format!("{}", std::process::id());
    let node_name = format!("k8s-corpus-{id}");
    // The Node as the examples select it: by name, and by kubectl's labels.
    let controller = cluster.controller(dir.path(), &namespace.name);
    let agent = cluster.node_agent(
        &controller,
        dir.path(),
        &node_name,
        &[("pool", &format!("corpus-{id}"))],
        &node,
        &ns.name,
    );
    // A Pod of the cluster on the node, for the podSelector example.
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": namespace.name, "labels": {"app": format!("corpus-{id}")}},
        "spec": {"nodeName": node_name, "containers": [{"name": "app", "image": "busybox"}]},
    });
    let out = cluster.kubectl_stdin(&["create"], &pod.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let images: Vec<String> = (1..=4)
        .map(|i| lab.image(&unique_image(&format!("k8s-corpus-{i}"), 1, 32 << 10)))
        .collect();
    let fill = |file: &str, image: &str| {
        std::fs::read_to_string(
            repo_root()
                .join("tests/integration/kruise-corpus")
                .join(file),
        )
        .unwrap()
        .replace("${ID}", &id)
        .replace("${NODE}", &node_name)
        .replace("${IMAGE1}", &images[2])
        .replace("${IMAGE2}", &images[3])
        .replace("${IMAGE}", image)
    };
    for (file, image) in [
        ("imagepulljob-v1alpha1.yaml", &images[0]),
        ("imagepulljob-v1beta1.yaml", &images[1]),
        ("imagelistpulljob-v1alpha1.yaml", &images[2]),
        ("imagelistpulljob-v1beta1.yaml", &images[3]),
    ] {
        let out = cluster.kubectl_stdin(&["apply", "-n", &namespace.name], &fill(file, image));
        assert!(
            out.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let logs = || {
        format!(
            "{}\n{}",
            rigger_integration_tests::log_tail(&controller.log, 200),
            rigger_integration_tests::log_tail(&agent.log, 200)
        )
    };
    // Each job pulled on the node: by the Pod's labels, the Node's labels, its name.
    for job in [
        format!("by-pods-{id}"),
        format!("by-labels-{id}"),
        format!("job-{id}"),
    ] {
        wait_until(&format!("{job} to pull"), Duration::from_secs(60), || {
            let job = cluster.get_json(&["imagepulljob", &job, "-n", &namespace.name])?;
            (job["status"]["succeeded"] == 1).then_some(())
        });
    }
    // Each list made its jobs and reports them, as Kruise's columns show.
    for (list, count) in [(format!("keep-{id}"), 1), (format!("warm-{id}"), 2)] {
        let status = wait_until(&format!("{list} to pull"), Duration::from_secs(60), || {
            let list = cluster.get_json(&["imagelistpulljob", &list, "-n", &namespace.name])?;
            (list["status"]["succeeded"] == count).then_some(list["status"].clone())
        });
        assert_eq!(status["desired"], count, "{status:#}\n{}", logs());
    }
    let shown = cluster.kubectl_ok(&["get", "imagelistpulljobs", "-n", &namespace.name]);
    let header: Vec<&str> = shown.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "TOTAL", "SUCCEEDED", "COMPLETED", "AGE"],
        "{shown}"
    );
    let listed = node.ctr(&ns.name, &["images", "ls", "-q"]);
    for image in &images {
        assert!(
            listed.contains(image.as_str()),
            "{image} not on the node:\n{listed}\n{}",
            logs()
        );
    }
    // A list edited into something the API server takes but Rigger cannot read keeps the
    // jobs it has (it only makes no more).
    let keep = format!("keep-{id}");
    cluster.kubectl_ok(&[
        "patch",
        "imagelistpulljob",
        &keep,
        "-n",
        &namespace.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"parallelism":"most"}}"#,
    ]);
    std::thread::sleep(Duration::from_secs(3));
    let jobs = cluster
        .get_json(&["imagepulljobs", "-n", &namespace.name])
        .unwrap();
    let kept = jobs["items"].as_array().unwrap().iter().any(|j| {
        j["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&format!("{keep}-"))
    });
    assert!(kept, "the unreadable list's job was deleted\n{}", logs());
    // A list deleted with kubectl takes its jobs with it.
    cluster.kubectl_ok(&[
        "delete",
        "imagelistpulljob",
        &format!("warm-{id}"),
        "-n",
        &namespace.name,
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let jobs = cluster
            .get_json(&["imagepulljobs", "-n", &namespace.name])
            .unwrap();
        let left = jobs["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| {
                j["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with(&format!("warm-{id}-"))
            })
            .count();
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the list's {left} jobs stay\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
