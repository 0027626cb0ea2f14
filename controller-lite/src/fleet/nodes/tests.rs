use super::*;

fn register(name: &str) -> Register {
    Register {
        node_name: name.to_owned(),
        labels: [("zone".to_owned(), "a".to_owned())].into(),
        agent_version: "0.1.0".to_owned(),
        inventory: None,
        tasks: Vec::new(),
        peer_address: String::new(),
        inventory_follows: false,
    }
}

fn sender() -> AgentSender {
    mpsc::channel(1).0
}

fn ready(registry: &NodeRegistry, now: SystemTime) -> Option<String> {
    registry.views(now, Duration::from_secs(30))["n1"]
        .not_ready
        .clone()
}

#[test]
fn readiness_follows_session_and_heartbeats() {
    let registry = NodeRegistry::default();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    registry.register(&register("n1"), 1, sender(), t0);
    assert_eq!(ready(&registry, t0), None);

    let late = t0 + Duration::from_secs(31);
    let reason = ready(&registry, late).unwrap();
    assert!(reason.starts_with("no heartbeat for 31s"), "{reason}");
    let object = &registry.objects(late, Duration::from_secs(30))[0];
    assert_eq!(object["status"]["conditions"][0]["status"], "False");

    assert!(registry.heartbeat("n1", 1, None, late));
    assert_eq!(ready(&registry, late), None);

    registry.disconnect("n1", 1);
    assert_eq!(
        ready(&registry, late).as_deref(),
        Some("agent disconnected")
    );
    assert!(!registry.send("n1", ControllerMessage::default()));
}

/// Seen under a loaded CI run: the controller stalled for seconds, its agents'
/// heartbeats waited unread, and the first pass after the stall found nodes silent.
#[test]
fn a_silence_this_controller_stalled_through_is_not_the_nodes() {
    let registry = NodeRegistry::default();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    registry.stall_clock().add(Duration::from_secs(5));
    registry.register(&register("n1"), 1, sender(), t0);
    // Stalls before the last heartbeat do not count.
    let late = t0 + Duration::from_secs(33);
    assert!(ready(&registry, late).is_some());

    registry.stall_clock().add(Duration::from_secs(4));
    assert_eq!(ready(&registry, late), None, "29 s of its own silence");
    let later = late + Duration::from_secs(2);
    let reason = ready(&registry, later).unwrap();
    assert!(reason.starts_with("no heartbeat for 31s"), "{reason}");
}

/// Found in the real cluster: a Node deleted (kubectl delete node) kept its agent's
/// record, and jobs over every node waited for it.
#[test]
fn in_a_cluster_an_agent_whose_node_is_gone_is_no_job_s_node() {
    let registry = NodeRegistry::default();
    let now = SystemTime::now();
    registry.register(&register("n1"), 1, sender(), now);
    registry.register(&register("gone"), 2, sender(), now);
    registry.use_cluster_labels_only();
    let chosen = |registry: &NodeRegistry| {
        let mut names: Vec<String> = registry
            .views(now, Duration::from_secs(30))
            .into_keys()
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        chosen(&registry),
        ["gone", "n1"],
        "before the Nodes are listed"
    );
    let timeout = Duration::from_secs(30);
    assert_eq!(registry.cluster_nodes_connected(now, timeout), None);
    registry.set_admin_labels(
        [
            ("n1".to_owned(), BTreeMap::new()),
            ("n2".to_owned(), BTreeMap::new()),
        ]
        .into(),
    );
    assert_eq!(
        registry.cluster_nodes_connected(now, timeout),
        Some(false),
        "n2's agent is not back"
    );
    let labels: BTreeMap<String, String> = [
        ("pool".to_owned(), "warm".to_owned()),
        (
            "node-restriction.kubernetes.io/pool".to_owned(),
            "warm".to_owned(),
        ),
    ]
    .into();
    registry.set_admin_labels([("n1".to_owned(), labels)].into());
    assert_eq!(chosen(&registry), ["n1"]);
    assert_eq!(registry.cluster_nodes_connected(now, timeout), Some(true));
    // Credentials follow only what the node's kubelet cannot set on its own Node.
    let view = &registry.views(now, Duration::from_secs(30))["n1"];
    assert_eq!(view.labels["pool"], "warm");
    assert_eq!(
        view.credential_labels,
        [(
            "node-restriction.kubernetes.io/pool".to_owned(),
            "warm".to_owned()
        )]
        .into()
    );
}

#[test]
fn nodes_share_the_strings_of_the_images_they_have_in_common() {
    let registry = NodeRegistry::default();
    let image = rigger_proto::v1::Image {
        namespace: "k8s.io".to_owned(),
        name: "registry.example/app:1".to_owned(),
        digest: "sha256:00".to_owned(),
        media_type: "application/vnd.oci.image.index.v1+json".to_owned(),
        size: 7,
    };
    for name in ["n1", "n2"] {
        let mut r = register(name);
        r.inventory = Some(NodeInventory {
            images: vec![image.clone()],
            ..NodeInventory::default()
        });
        registry.register(&r, 1, sender(), SystemTime::now());
    }
    let nodes = registry.nodes.read().unwrap();
    let name_of = |node: &str| {
        nodes[node].inventory.as_ref().unwrap().images.0[0]
            .name
            .clone()
    };
    assert!(Arc::ptr_eq(&name_of("n1"), &name_of("n2")));
    drop(nodes);
    let object = &registry.objects(SystemTime::now(), Duration::from_secs(30))[0];
    assert_eq!(
        object["status"]["images"][0]["names"][0],
        "registry.example/app:1"
    );
}

#[test]
fn a_node_whose_inventory_follows_is_ready_once_its_session_reported_it() {
    let registry = NodeRegistry::default();
    let now = SystemTime::now();
    let mut r = register("n1");
    r.inventory_follows = true;
    registry.register(&r, 7, sender(), now);
    assert_eq!(
        ready(&registry, now).as_deref(),
        Some("registered; waiting for the agent's inventory")
    );
    let inventory = NodeInventory {
        images: vec![rigger_proto::v1::Image {
            name: "registry.example/app:1".to_owned(),
            digest: format!("sha256:{}", "ab".repeat(32)),
            ..rigger_proto::v1::Image::default()
        }],
        ..NodeInventory::default()
    };
    // Another session's report (a stale or a forged one) changes nothing.
    assert_eq!(registry.inventory_report("n1", 6, &inventory, now), None);
    assert_eq!(registry.inventory_report("n2", 7, &inventory, now), None);
    assert!(ready(&registry, now).is_some());

    assert_eq!(
        registry.inventory_report("n1", 7, &inventory, now),
        Some(true)
    );
    assert_eq!(ready(&registry, now), None);
    let views = registry.views(now, Duration::from_secs(30));
    let (_, images) = views["n1"].images.as_ref().unwrap();
    assert!(images.has("registry.example/app:1"));
    // A later report replaces it; the node was not waiting any more.
    assert_eq!(
        registry.inventory_report("n1", 7, &NodeInventory::default(), now),
        Some(false)
    );
    let object = &registry.objects(now, Duration::from_secs(30))[0];
    assert_eq!(object["status"]["images"], serde_json::json!([]));
}

#[test]
fn digests_are_shown_as_reported() {
    let registry = NodeRegistry::default();
    let digests = [
        format!("sha256:{}", "0f".repeat(32)),
        format!("sha256:{}", "0F".repeat(32)),
        "sha256:short".to_owned(),
        format!("sha512:{}", "1".repeat(128)),
        String::new(),
    ];
    let mut r = register("n1");
    r.inventory = Some(NodeInventory {
        images: digests
            .iter()
            .enumerate()
            .map(|(i, digest)| rigger_proto::v1::Image {
                name: format!("registry.example/app:{i}"),
                digest: digest.clone(),
                ..rigger_proto::v1::Image::default()
            })
            .collect(),
        ..NodeInventory::default()
    });
    registry.register(&r, 1, sender(), SystemTime::now());
    let object = &registry.objects(SystemTime::now(), Duration::from_secs(30))[0];
    let shown: Vec<&str> = object["status"]["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["digest"].as_str().unwrap())
        .collect();
    assert_eq!(
        shown,
        digests.iter().map(String::as_str).collect::<Vec<_>>()
    );
}

#[test]
fn a_kubelet_pod_two_nodes_claim_is_placed_on_neither() {
    let registry = NodeRegistry::default();
    let with_pod = |node: &str, uid: &str| {
        let mut r = register(node);
        r.inventory = Some(NodeInventory {
            pods: vec![rigger_proto::v1::PodSandbox {
                id: format!("sandbox-{node}"),
                namespace: "default".to_owned(),
                name: "web".to_owned(),
                uid: uid.to_owned(),
                owner: "kubelet".to_owned(),
                state: "ready".to_owned(),
                ..rigger_proto::v1::PodSandbox::default()
            }],
            ..NodeInventory::default()
        });
        r
    };
    registry.register(&with_pod("n1", "u1"), 1, sender(), SystemTime::now());
    assert!(matches!(
        registry.kubelet_pod("default", "web"),
        KubeletPodPlace::On(node, pod) if node == "n1" && pod.uid == "u1"
    ));
    assert_eq!(
        registry.kubelet_pod("default", "db"),
        KubeletPodPlace::Nowhere
    );
    // A second node says it runs the same pod: neither is believed.
    registry.register(&with_pod("n2", "u2"), 1, sender(), SystemTime::now());
    assert_eq!(
        registry.kubelet_pod("default", "web"),
        KubeletPodPlace::ClaimedBy(vec!["n1".to_owned(), "n2".to_owned()])
    );
}

#[test]
fn a_replaced_session_cannot_touch_its_successor() {
    let registry = NodeRegistry::default();
    let now = SystemTime::now();
    registry.register(&register("n1"), 1, sender(), now);
    registry.register(&register("n1"), 2, sender(), now);
    assert!(!registry.heartbeat("n1", 1, None, now));
    registry.disconnect("n1", 1);
    assert_eq!(ready(&registry, now), None);
}

#[test]
fn an_agent_refused_for_its_version_is_a_node_not_ready_saying_why_until_it_registers_within() {
    let registry = NodeRegistry::default();
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    registry.register(&register("n1"), 1, sender(), now);
    assert_eq!(ready(&registry, now), None);

    let mut old = register("n1");
    old.agent_version = "0.0.9".to_owned();
    let refusal = rigger_version::check_agent("0.2.0", &old.agent_version).unwrap_err();
    registry.refuse(&old, &refusal, now);
    let why = ready(&registry, now).unwrap();
    assert!(
        why.contains("agent 0.0.9") && why.contains("controller 0.2.0"),
        "{why}"
    );
    assert!(!registry.send("n1", ControllerMessage::default()));
    let node = &registry.objects(now, Duration::from_secs(30))[0];
    assert_eq!(
        node["status"]["conditions"][0]["reason"],
        "AgentVersionTooOld"
    );
    assert_eq!(node["status"]["nodeInfo"]["agentVersion"], "0.0.9");

    registry.register(&register("n1"), 2, sender(), now);
    assert_eq!(ready(&registry, now), None);
}
