#![allow(clippy::unwrap_used)]
use super::*;

fn policy(json: serde_json::Value) -> ResourcesPolicy {
    serde_json::from_value(json).unwrap()
}

/// A container: limits (cpu, memory) and requests (cpu, memory), `""` for none.
fn container(name: &str, limits: [&str; 2], requests: [&str; 2]) -> core::Container {
    let map = |values: [&str; 2]| {
        let map: BTreeMap<String, KubeQuantity> = RESOURCES
            .iter()
            .zip(values)
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| ((*k).to_owned(), KubeQuantity(v.to_owned())))
            .collect();
        (!map.is_empty()).then_some(map)
    };
    core::Container {
        name: name.to_owned(),
        resources: Some(core::ResourceRequirements {
            limits: map(limits),
            requests: map(requests),
            ..core::ResourceRequirements::default()
        }),
        ..core::Container::default()
    }
}

/// The resources as `[limits cpu, limits memory, requests cpu, requests memory]`.
fn shown(resources: &core::ResourceRequirements) -> [String; 4] {
    let get = |map: &Option<BTreeMap<String, KubeQuantity>>, key: &str| {
        map.as_ref()
            .and_then(|m| m.get(key))
            .map_or(String::new(), |q| q.0.clone())
    };
    [
        get(&resources.limits, "cpu"),
        get(&resources.limits, "memory"),
        get(&resources.requests, "cpu"),
        get(&resources.requests, "memory"),
    ]
}

fn computed(
    policy: &ResourcesPolicy,
    init: &[core::Container],
    pod: &[core::Container],
) -> Result<[String; 4], String> {
    let targets = policy.targets(init, pod, &BTreeSet::new())?;
    Ok(shown(&policy.resources(&targets)?))
}

/// Kruise 1.9's own cases (`TestApplyResourcesPolicy`, and the e2e stories 4 and 5).
#[test]
fn resources_are_computed_from_the_matched_containers_as_kruise_computes_them() {
    let app1 = container("app1", ["200m", "200Mi"], ["50m", "100Mi"]);
    let app2 = container("app2", ["400m", "400Mi"], ["100m", "200Mi"]);
    let half = serde_json::json!({"limits": {"cpu": "cpu*50%", "memory": "200Mi"},
                                  "requests": {"cpu": "cpu*50%", "memory": "100Mi"}});
    let p = policy(serde_json::json!({"targetContainersMode": "sum", "resourcesExpr": half}));
    assert_eq!(
        computed(&p, &[], &[app1.clone(), app2]).unwrap(),
        ["300m", "200Mi", "75m", "100Mi"]
    );

    let engines = [
        container("large.engine.v4", ["200m", "200Mi"], ["50m", "100Mi"]),
        container("large.engine.v8", ["400m", "400Mi"], ["100m", "200Mi"]),
    ];
    let floor = serde_json::json!({"limits": {"cpu": "max(cpu*50%, 50m)", "memory": "200Mi"},
                                   "requests": {"cpu": "max(cpu*50%, 50m)", "memory": "100Mi"}});
    let max = policy(serde_json::json!({"targetContainersMode": "max",
        "targetContainersNameRegex": "^large.engine.v.*$", "resourcesExpr": floor}));
    assert_eq!(
        computed(&max, &[], &engines).unwrap(),
        ["200m", "200Mi", "50m", "100Mi"]
    );
    let v4 = policy(serde_json::json!({"targetContainersMode": "sum",
        "targetContainersNameRegex": "^large.engine.v4$", "resourcesExpr": floor}));
    assert_eq!(
        computed(&v4, &[], &engines).unwrap(),
        ["100m", "200Mi", "50m", "100Mi"]
    );

    let none = policy(serde_json::json!({"targetContainersMode": "sum",
        "targetContainersNameRegex": "^nonexistent$", "resourcesExpr": {"limits": {"cpu": "cpu*50%"}}}));
    assert_eq!(
        computed(&none, &[], std::slice::from_ref(&app1)).unwrap_err(),
        "no containers match the regex pattern \"^nonexistent$\""
    );

    let shares = serde_json::json!({"limits": {"cpu": "cpu*50%", "memory": "memory*30%"},
                                    "requests": {"cpu": "cpu*30%", "memory": "memory*20%"}});
    let sum = policy(serde_json::json!({"targetContainersMode": "sum", "resourcesExpr": shares}));
    // A target without a CPU limit: the sidecar has none either.
    let a1 = container("app1", ["200m", "200Mi"], ["100m", "100Mi"]);
    let a2 = container("app2", ["", "400Mi"], ["50m", "200Mi"]);
    assert_eq!(
        computed(&sum, &[], &[a1.clone(), a2]).unwrap(),
        ["", "180Mi", "45m", "60Mi"]
    );
    // A target without requests counts 0.
    let bare = container("app2", ["400m", "400Mi"], ["", ""]);
    assert_eq!(
        computed(&sum, &[], &[a1.clone(), bare]).unwrap(),
        ["300m", "180Mi", "30m", "20Mi"]
    );
    let fractions = serde_json::json!({"limits": {"cpu": "cpu*40%", "memory": "memory*30%"},
                                       "requests": {"cpu": "cpu*25%", "memory": "memory*20%"}});
    let max =
        policy(serde_json::json!({"targetContainersMode": "max", "resourcesExpr": fractions}));
    let cpu_only = container("app2", ["400m", ""], ["200m", ""]);
    assert_eq!(
        computed(&max, &[], &[a1, cpu_only]).unwrap(),
        ["160m", "", "50m", "20Mi"]
    );

    // Native sidecars count, plain init containers do not.
    let mut native = container("app1", ["400m", "800Mi"], ["200m", "400Mi"]);
    native.restart_policy = Some("Always".to_owned());
    let plain = container("app2", ["400m", "800Mi"], ["200m", "400Mi"]);
    let main = container("app2", ["600m", "1200Mi"], ["300m", "600Mi"]);
    let floors = serde_json::json!({"limits": {"cpu": "max(cpu*30%, 50m)", "memory": "max(memory*25%, 100Mi)"},
                                    "requests": {"cpu": "cpu*20%", "memory": "memory*15%"}});
    let p = policy(serde_json::json!({"targetContainersMode": "sum",
        "targetContainersNameRegex": "^app.*$", "resourcesExpr": floors}));
    assert_eq!(
        computed(&p, &[native, plain], &[main]).unwrap(),
        ["300m", "500Mi", "100m", "150Mi"]
    );

    // Kruise's e2e story 5.
    let story = serde_json::json!({
        "limits": {"cpu": "cpu*50% + 100m", "memory": "max(memory*20% + 100Mi, 200Mi)"},
        "requests": {"cpu": "cpu*30% + 50m", "memory": "memory*15% + 50Mi"}});
    let p = policy(serde_json::json!({"targetContainersMode": "sum", "resourcesExpr": story}));
    let pod = [
        container("app1", ["200m", "400Mi"], ["100m", "200Mi"]),
        container("app2", ["400m", "600Mi"], ["200m", "300Mi"]),
    ];
    assert_eq!(
        computed(&p, &[], &pod).unwrap(),
        ["400m", "300Mi", "140m", "125Mi"]
    );
}

#[test]
fn the_sets_own_sidecars_are_never_targets_and_the_regex_searches_names() {
    let p = policy(serde_json::json!({"targetContainersMode": "sum",
        "targetContainersNameRegex": "app", "resourcesExpr": {"limits": {"cpu": "cpu"}}}));
    let pod = [
        container("myapp-2", ["1", ""], ["", ""]),
        container("app-proxy", ["5", ""], ["", ""]),
    ];
    let sidecars: BTreeSet<String> = ["app-proxy".to_owned()].into();
    let targets = p.targets(&[], &pod, &sidecars).unwrap();
    assert_eq!(targets.len(), 1);
    assert_eq!(shown(&p.resources(&targets).unwrap())[0], "1");
}

#[test]
fn a_policy_is_checked_as_kruises_webhook_checks_it_and_stricter_where_no_pod_could_pass() {
    let check = |json: serde_json::Value| {
        policy(json)
            .validate("spec.containers[0].resourcesPolicy")
            .map_err(|e| e.to_string())
    };
    let ok = |expr: serde_json::Value| {
        check(serde_json::json!({"targetContainersMode": "sum", "resourcesExpr": expr}))
    };
    assert!(
        ok(
            serde_json::json!({"limits": {"cpu": "0.5*cpu - 0.3*max(0, cpu-4) + 0.3*max(0, cpu-8)",
                                             "memory": "max(memory*50%, 100Mi)"}})
        )
        .is_ok()
    );
    assert!(
        ok(serde_json::json!({"requests": {"cpu": "max( cpu * 0.5 , 50m )", "memory": "100Mi"}}))
            .is_ok()
    );
    assert!(
        ok(serde_json::json!({"limits": {}})).is_ok(),
        "Kruise accepts empty limits"
    );
    for (expr, path, cause) in [
        (
            serde_json::json!({}),
            "resourcesExpr",
            "at least one of limits or requests",
        ),
        (
            serde_json::json!({"limits": {"cpu": "memory*2"}}),
            "resourcesExpr.limits.cpu",
            "undefined variable: memory",
        ),
        (
            serde_json::json!({"requests": {"memory": "cpu"}}),
            "resourcesExpr.requests.memory",
            "undefined variable: cpu",
        ),
        (
            serde_json::json!({"limits": {"cpu": "cpu - 2"}}),
            "resourcesExpr.limits.cpu",
            "negative",
        ),
        (
            serde_json::json!({"limits": {"memory": "memory - 100Mi"}}),
            "resourcesExpr.limits.memory",
            "negative",
        ),
        (
            serde_json::json!({"limits": {"cpu": "cpu*cpu"}}),
            "resourcesExpr.limits.cpu",
            "multiplication of two quantities",
        ),
        (
            serde_json::json!({"limits": {"cpu": "max(cpu*50%)"}}),
            "resourcesExpr.limits.cpu",
            "exactly 2 arguments",
        ),
    ] {
        let error = ok(expr.clone()).unwrap_err();
        assert!(
            error.contains(&format!("spec.containers[0].resourcesPolicy.{path}"))
                && error.contains(cause),
            "{expr}: {error}"
        );
    }
    for (regex, cause) in [
        ("", "invalid empty regex"),
        ("[invalid(regex", "invalid regex pattern"),
    ] {
        let error = check(
            serde_json::json!({"targetContainersMode": "max", "targetContainersNameRegex": regex,
            "resourcesExpr": {"limits": {"cpu": "cpu"}}}),
        )
        .unwrap_err();
        assert!(
            error.contains("targetContainersNameRegex") && error.contains(cause),
            "{error}"
        );
    }
    // A mode Kruise's CRD refuses, and fields Kruise does not know, do not decode.
    for json in [
        serde_json::json!({"targetContainersMode": "avg", "resourcesExpr": {"limits": {"cpu": "cpu"}}}),
        serde_json::json!({"targetContainersMode": "sum", "resourcesExpr": {"limits": {"gpu": "1"}}}),
    ] {
        assert!(serde_json::from_value::<ResourcesPolicy>(json).is_err());
    }
}
