#![allow(clippy::unwrap_used)]
use super::*;
use crate::fields::KRUISE_API_VERSION;

#[test]
fn ordered_keys_are_read_as_kruise_reads_them() {
    let term: OrderTerm =
        serde_json::from_value(serde_json::json!({"orderedKey": "rank"})).unwrap();
    // What Rigger stored before it spelled the field as Kruise does.
    let stored: OrderTerm =
        serde_json::from_value(serde_json::json!({"orderKey": "rank"})).unwrap();
    assert_eq!(term, stored);
    assert_eq!(
        serde_json::to_value(&term).unwrap(),
        serde_json::json!({"orderedKey": "rank"})
    );
    let order = |value: Option<&str>| {
        let labels = value
            .map(|v| [("rank".to_owned(), v.to_owned())].into())
            .unwrap_or_default();
        term.order_of(&labels)
    };
    assert_eq!(order(Some("5")), 5);
    assert_eq!(order(Some("sts-10")), 10);
    assert_eq!(order(Some("v2-canary")), 0);
    assert_eq!(order(Some("")), 0);
    assert_eq!(order(None), 0);
    // Digits past i64: 0, as Kruise's ParseInt error.
    assert_eq!(order(Some("99999999999999999999")), 0);
}

fn sidecar_set(spec: &serde_json::Value) -> Result<SidecarSet, String> {
    let value = serde_json::json!({
        "apiVersion": KRUISE_API_VERSION, "kind": KIND,
        "metadata": {"name": "mesh"}, "spec": spec,
    });
    let mut set: SidecarSet = serde_json::from_value(value).map_err(|e| e.to_string())?;
    Object::validate(&mut set).map_err(|e| e.to_string())?;
    Ok(set)
}

#[test]
fn kruise_shapes_apply_and_refusals_name_the_field() {
    let set = sidecar_set(&serde_json::json!({
        "selector": {"matchLabels": {"app": "web"}},
        "namespace": "shop",
        "containers": [{
            "name": "proxy", "image": "r.example/proxy:1",
            "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "r.example/empty:1"}
        }],
        "updateStrategy": {"maxUnavailable": "50%", "partition": 1,
            "priorityStrategy": {"weightPriority": [{"weight": 10, "matchSelector": {"matchLabels": {"tier": "edge"}}}]}}
    }))
    .unwrap();
    let sidecar = &set.spec.containers[0];
    let names: Vec<String> = slots_of(sidecar, sidecar.container.clone())
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["proxy-1", "proxy-2"]);
    assert!(set.matches(
        "shop",
        &BTreeMap::from([("app".to_owned(), "web".to_owned())])
    ));
    assert!(!set.matches(
        "other",
        &BTreeMap::from([("app".to_owned(), "web".to_owned())])
    ));

    let cases = [
        (
            serde_json::json!({"selector": {}, "containers": [{"name": "p", "image": "r.example/p:1"}]}),
            "spec.selector: is required",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "containers": []}),
            "spec.containers: at least one",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "containers": [{"name": "p", "image": "r.example/p:1", "upgradeStrategy": {"upgradeType": "HotUpgrade"}}]}),
            "spec.containers[0].upgradeStrategy.hotUpgradeEmptyImage: is required",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "containers": [{"name": "p", "image": ""}]}),
            "spec.containers[0].image: is required",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "customVersion": "v2", "containers": [{"name": "p", "image": "r.example/p:1"}]}),
            "spec.customVersion: is v1beta1's",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "initContainers": [{"name": "i", "image": "r.example/i:1", "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "r.example/e:1"}}]}),
            "spec.initContainers[0].upgradeStrategy.upgradeType: HotUpgrade is for containers",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "initContainers": [{"name": "i", "image": ""}]}),
            "spec.initContainers[0].image: is required",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "imagePullSecrets": [{"name": "Reg_Cred"}], "containers": [{"name": "p", "image": "r.example/p:1"}]}),
            "spec.imagePullSecrets[0].name:",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "containers": [{"name": "p", "image": "r.example/p:1", "resources": {"limits": {"cpu": "1"}}, "resourcesPolicy": {"targetContainersMode": "sum", "resourcesExpr": {"limits": {"cpu": "cpu"}}}}]}),
            "spec.containers[0].resourcesPolicy: resourcesPolicy and resources cannot be configured together",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "initContainers": [{"name": "i", "image": "r.example/i:1", "resourcesPolicy": {"targetContainersMode": "sum", "resourcesExpr": {"limits": {"cpu": "cpu"}}}}]}),
            "spec.initContainers[0].resourcesPolicy: is only for native sidecars",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "containers": [{"name": "p", "image": "r.example/p:1", "resourcesPolicy": {"targetContainersMode": "sum", "resourcesExpr": {"limits": {"cpu": "cpu*cpu"}}}}]}),
            "spec.containers[0].resourcesPolicy.resourcesExpr.limits.cpu: invalid expression: multiplication of two quantities",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "injectionStrategy": {"revision": {"policy": "Always"}}, "containers": [{"name": "p", "image": "r.example/p:1"}]}),
            "spec.injectionStrategy.revision: set revisionName or customVersion",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "injectionStrategy": {"revision": {"revisionName": "other-abc"}}, "containers": [{"name": "p", "image": "r.example/p:1"}]}),
            "spec.injectionStrategy.revision.revisionName: \"other-abc\" is not one of this SidecarSet's",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "patchPodMetadata": [{"annotations": {"kruise.io/sidecarset-hash": "{}"}}], "containers": [{"name": "p", "image": "r.example/p:1"}]}),
            "spec.patchPodMetadata[0].annotations[kruise.io/sidecarset-hash]: is kept by the sidecar injection",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "patchPodMetadata": [{"annotations": {"lifecycle.rigger.dev/state": "x"}, "patchPolicy": "Overwrite"}], "containers": [{"name": "p", "image": "r.example/p:1"}]}),
            "spec.patchPodMetadata[0].annotations[lifecycle.rigger.dev/state]: is kept",
        ),
        (
            serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "patchPodMetadata": [{"annotations": {"oom/config": "[1]"}, "patchPolicy": "MergePatchJson"}], "containers": [{"name": "p", "image": "r.example/p:1"}]}),
            "spec.patchPodMetadata[0].annotations[oom/config]: MergePatchJson takes a JSON object",
        ),
    ];
    for (spec, expected) in cases {
        let err = sidecar_set(&spec).unwrap_err();
        assert!(err.starts_with(expected), "{err}\n  expected: {expected}");
    }
}

#[test]
fn each_version_keeps_its_own_fields() {
    let spec = |extra: serde_json::Value| {
        let mut spec = serde_json::json!({"selector": {"matchLabels": {"a": "b"}},
            "containers": [{"name": "p", "image": "r.example/p:1"}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    };
    let decode = |version: &str, spec: serde_json::Value, labels: serde_json::Value| {
        let set: SidecarSet = serde_json::from_value(serde_json::json!({
            "apiVersion": version, "kind": KIND,
            "metadata": {"name": "mesh", "labels": labels}, "spec": spec,
        }))
        .unwrap();
        set.validate().map(|()| set).map_err(|e| e.to_string())
    };
    let beta = crate::fields::KRUISE_API_VERSION_V1BETA1;
    let set = decode(
        beta,
        spec(serde_json::json!({"customVersion": "v2"})),
        serde_json::json!({}),
    )
    .unwrap();
    assert_eq!(set.custom_version(), Some("v2"));
    let alpha = decode(
        KRUISE_API_VERSION,
        spec(serde_json::json!({"namespace": "shop"})),
        serde_json::json!({CUSTOM_VERSION_LABEL: "v2"}),
    )
    .unwrap();
    assert_eq!(alpha.custom_version(), Some("v2"));
    let err = decode(
        beta,
        spec(serde_json::json!({"namespace": "shop"})),
        serde_json::json!({}),
    )
    .unwrap_err();
    assert!(
        err.starts_with("spec.namespace: is v1alpha1's; in v1beta1 write namespaceSelector"),
        "{err}"
    );
    // What v1alpha1's namespace means, v1beta1 says with a selector.
    let selected = decode(
        beta,
        spec(serde_json::json!({"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "shop"}}})),
        serde_json::json!({}),
    )
    .unwrap();
    let labels = BTreeMap::from([("a".to_owned(), "b".to_owned())]);
    for namespace in ["shop", "other"] {
        assert_eq!(
            alpha.matches(namespace, &labels),
            selected.matches(namespace, &labels)
        );
    }
    // Stored as applied: each answers in its own version.
    assert_eq!(serde_json::to_value(&set).unwrap()["apiVersion"], beta);
    assert_eq!(
        serde_json::to_value(&alpha).unwrap()["spec"]["namespace"],
        "shop"
    );
}

#[test]
fn the_hash_follows_the_containers_only() {
    let spec = serde_json::json!({"selector": {"matchLabels": {"a": "b"}},
        "containers": [{"name": "p", "image": "r.example/p:1"}]});
    let a = sidecar_set(&spec).unwrap();
    let mut b = a.clone();
    b.spec.update_strategy.paused = true;
    assert_eq!(a.hash(), b.hash());
    b.spec.containers[0].container.image = Some("r.example/p:2".to_owned());
    assert_ne!(a.hash(), b.hash());
}

#[test]
fn kruises_published_examples_are_valid_sidecar_sets() {
    let corpus =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/integration/kruise-corpus");
    for file in [
        "sidecarset-v1alpha1.yaml",
        "sidecarset-v1beta1.yaml",
        "sidecarset-native-sidecar.yaml",
        "sidecarset-log-filebeat.yaml",
        "sidecarset-downward-api.yaml",
    ] {
        let text = std::fs::read_to_string(corpus.join(file))
            .unwrap()
            .replace("${ID}", "t1")
            .replace("${IMAGE}", "r.example/i:1");
        let set: SidecarSet =
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        set.validate().unwrap_or_else(|e| panic!("{file}: {e}"));
    }
}

#[test]
fn a_set_served_in_the_stored_version_keeps_what_its_version_wrote() {
    // v1alpha1's spec.namespace, read back as v1beta1 (no conversion webhook).
    let served: SidecarSet = serde_json::from_value(serde_json::json!({
        "apiVersion": crate::fields::KRUISE_API_VERSION_V1BETA1, "kind": KIND,
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "namespace": "default",
            "containers": [{"name": "p", "image": "r.example/p:1"}]},
    }))
    .unwrap();
    assert!(served.validate().is_err(), "applied so, it is refused");
    served.validate_served().unwrap();
    assert!(served.matches(
        "default",
        &BTreeMap::from([("a".to_owned(), "b".to_owned())])
    ));
    // What no version allows stays refused.
    let mut empty = served;
    empty.spec.selector = crate::fields::LabelSelector::default();
    assert!(
        empty
            .validate_served()
            .unwrap_err()
            .to_string()
            .starts_with("spec.selector: is required")
    );
}
