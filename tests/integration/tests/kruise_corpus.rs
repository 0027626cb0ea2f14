//! OpenKruise's documents apply as Kruise writes them: a corpus shaped after Kruise's user
//! manuals (`tests/integration/kruise-corpus/`, every optional field used at least once,
//! in both API versions) is applied to a real controller and agent on the lab's CRI, and
//! what Kruise would do is checked on the pods; what Rigger cannot honour is refused with
//! the field named.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::{
    Lab, container_status, controller_with_agent, log_tail, repo_root, wait_until,
};
use serde_json::Value;

const IDLE: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

/// The corpus file `name` with its placeholders filled in.
fn corpus(name: &str, image: &str, id: &str) -> String {
    let path = repo_root()
        .join("tests/integration/kruise-corpus")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .replace("${IMAGE}", image)
        .replace("${ID}", id)
}

/// A pod labelled `app: <app>` whose container `app` idles with env TZ and LANG and a
/// volume of its own (what sharing and env transfer take from).
fn app_pod(name: &str, app: &str, image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: "{app}", main-container: app}}
  annotations: {{mesh.example.com/config: '{{"log":"debug","trace":true}}'}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
    env: [{{name: TZ, value: UTC}}, {{name: LANG, value: C.UTF-8}}]
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes: [{{name: data, emptyDir: {{}}}}]
"#
    )
}

/// `riggerctl wait OBJECT --for=condition=CONDITION` succeeds.
fn wait_for_condition(
    controller: &rigger_integration_tests::Controller,
    object: &str,
    condition: &str,
) {
    let waited = controller.ctl(&[
        "wait",
        object,
        &format!("--for=condition={condition}"),
        "--timeout=30s",
    ]);
    assert!(
        waited.status.success(),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
}

fn names(pod: &Value, field: &str) -> Vec<String> {
    pod["spec"][field]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| c["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
}

fn env_of(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .map(|env| {
            env.iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap().to_owned(),
                        e["value"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// SidecarSet in both versions: the v1beta1 corpus document (init containers, placement,
/// shared volumes, transferred env, metadata patches, custom version) runs on a real
/// pod as Kruise's webhook would have shaped it; the v1alpha1 one (namespace, custom
/// version label, hot upgrade, NotUpdate, a pinned revision) applies and answers in
/// its version; every refusal names its field.
#[test]
fn kruise_sidecar_sets_apply_in_both_versions_and_shape_pods_as_kruise_does() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) = controller_with_agent(dir.path(), "corpus-node", "itest-corpus");
    let image = lab.image("rigger-lab/busybox:1");
    let id = format!("c{}", std::process::id());

    controller.apply_ok(&corpus("sidecarset-v1beta1.yaml", &image, &id));
    let pod_name = format!("web-{id}");
    controller.apply_ok(&app_pod(&pod_name, &format!("web-{id}"), &image));
    let pod = controller.get_json(&["pod", &pod_name]).unwrap();
    // Placement: BeforeAppContainer first, AfterAppContainer last, the init container
    // after the pod's own (none here).
    assert_eq!(names(&pod, "containers"), ["proxy", "app", "logger"]);
    assert_eq!(names(&pod, "initContainers"), ["mesh-init"]);
    assert_eq!(pod["spec"]["imagePullSecrets"][0]["name"], "mesh-registry");
    let proxy = container(&pod, "proxy");
    let env = env_of(proxy);
    for wanted in [("IS_INJECTED", "true"), ("TZ", "UTC"), ("LANG", "C.UTF-8")] {
        assert!(
            env.contains(&(wanted.0.to_owned(), wanted.1.to_owned())),
            "{wanted:?} in {env:?}"
        );
    }
    let mounts: Vec<&str> = proxy["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(mounts, ["/etc/mesh", "/data"], "the app's volume is shared");
    assert!(
        !env_of(container(&pod, "logger"))
            .iter()
            .any(|(n, _)| n == "TZ")
    );
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["mesh.example.com/enabled"], "true");
    assert_eq!(
        serde_json::from_str::<Value>(annotations["mesh.example.com/config"].as_str().unwrap())
            .unwrap(),
        serde_json::json!({"log": "info", "trace": true}),
        "MergePatchJson merged into the pod's value"
    );
    assert_eq!(
        annotations["kruise.io/sidecarset-injected-list"],
        format!("mesh-{id}")
    );

    // It runs: the init container ran to completion, then the three containers.
    let running = controller.ready_pod(&pod_name, Duration::from_secs(120));
    for name in ["proxy", "app", "logger"] {
        assert_eq!(
            container_status(&running, name)["ready"],
            true,
            "{name}: {}",
            log_tail(&agent.log, 20)
        );
    }

    // Status in the version applied, with the revision that injection recorded.
    let set = controller
        .get_json(&["sidecarset", &format!("mesh-{id}")])
        .unwrap();
    assert_eq!(set["apiVersion"], "apps.kruise.io/v1beta1");
    assert_eq!(set["spec"]["customVersion"], "stable");
    let latest = set["status"]["latestRevision"].as_str().unwrap().to_owned();
    assert!(latest.starts_with(&format!("mesh-{id}-")), "{set}");
    let record: Value = serde_json::from_str(
        running["metadata"]["annotations"]["kruise.io/sidecarset-hash"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record[format!("mesh-{id}")]["controllerRevision"], latest);

    // v1alpha1: applies, answers in v1alpha1, and its pinned revision (custom version v1,
    // its own current one) is what a new pod gets.
    controller.apply_ok(&corpus("sidecarset-v1alpha1.yaml", &image, &id));
    let alpha = controller
        .get_json(&["sidecarset", &format!("agent-{id}")])
        .unwrap();
    assert_eq!(alpha["apiVersion"], "apps.kruise.io/v1alpha1");
    assert_eq!(alpha["spec"]["namespace"], "default");
    assert_eq!(
        alpha["spec"]["updateStrategy"]["priorityStrategy"]["orderPriority"][0]["orderedKey"],
        "rank"
    );
    let api_pod = format!("api-{id}");
    controller.apply_ok(&app_pod(&api_pod, &format!("api-{id}"), &image));
    let pod = controller.get_json(&["pod", &api_pod]).unwrap();
    assert_eq!(names(&pod, "containers"), ["agent-1", "agent-2", "app"]);
    assert_eq!(
        pod["metadata"]["annotations"]["agent.example.com/version"],
        "v1"
    );

    for (i, document) in corpus("sidecarset-refused.yaml", &image, &id)
        .split("\n---\n")
        .enumerate()
    {
        let expected = document
            .lines()
            .find_map(|l| l.strip_prefix("# refused: "))
            .unwrap_or_else(|| panic!("document {i} says what is refused"));
        let out = controller.apply(document);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "document {i} was accepted");
        assert!(
            stderr.contains(expected),
            "document {i}: {stderr}\n  expected: {expected}"
        );
    }

    for (kind, name) in [
        ("pod", pod_name.as_str()),
        ("pod", api_pod.as_str()),
        ("sidecarset", &format!("mesh-{id}")),
        ("sidecarset", &format!("agent-{id}")),
    ] {
        assert!(controller.ctl(&["delete", kind, name]).status.success());
    }
}

/// Kruise's `injectionStrategy`: a new version with `revision.customVersion` pinned to
/// the old one (and updates paused) gives new pods the old version; `paused` gives them
/// nothing; a revision that was never recorded refuses the pod, naming what there is.
#[test]
fn a_pinned_injection_revision_gives_new_pods_the_recorded_version() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, _agent) = controller_with_agent(dir.path(), "pin-node", "itest-pin");
    let (old_image, new_image) = (
        lab.image("rigger-lab/busybox:1"),
        // An image of its own: only its reference must differ.
        lab.image(&rigger_integration_tests::unique_image_with(
            "pinned-sidecar",
            1,
            4096,
            &["--base", "busybox"],
        )),
    );
    let id = format!("p{}", std::process::id());
    let set = |image: &str, custom: &str, injection: &str| {
        format!(
            r#"apiVersion: apps.kruise.io/v1beta1
kind: SidecarSet
metadata:
  name: pin-{id}
spec:
  selector: {{matchLabels: {{app: "pin-{id}"}}}}
  customVersion: {custom}
  updateStrategy: {{paused: true}}
  injectionStrategy: {injection}
  containers:
  - name: proxy
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
"#
        )
    };
    let image_of_proxy = |pod: &str| {
        controller.apply_ok(&app_pod(pod, &format!("pin-{id}"), &old_image));
        let pod = controller.get_json(&["pod", pod]).unwrap();
        pod["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "proxy")
            .map(|c| c["image"].as_str().unwrap().to_owned())
    };
    controller.apply_ok(&set(&old_image, "stable", "{}"));
    assert_eq!(
        image_of_proxy(&format!("a-{id}")).as_deref(),
        Some(old_image.as_str())
    );
    let stable = controller
        .get_json(&["sidecarset", &format!("pin-{id}")])
        .unwrap()["status"]["latestRevision"]
        .as_str()
        .unwrap()
        .to_owned();

    controller.apply_ok(&set(
        &new_image,
        "next",
        "{revision: {customVersion: stable, policy: Always}}",
    ));
    assert_eq!(
        image_of_proxy(&format!("b-{id}")).as_deref(),
        Some(old_image.as_str())
    );
    controller.apply_ok(&set(
        &new_image,
        "next",
        &format!("{{revision: {{revisionName: {stable}}}}}"),
    ));
    assert_eq!(
        image_of_proxy(&format!("c-{id}")).as_deref(),
        Some(old_image.as_str())
    );
    controller.apply_ok(&set(&new_image, "next", "{}"));
    assert_eq!(
        image_of_proxy(&format!("d-{id}")).as_deref(),
        Some(new_image.as_str())
    );
    controller.apply_ok(&set(&new_image, "next", "{paused: true}"));
    assert_eq!(image_of_proxy(&format!("e-{id}")), None);

    controller.apply_ok(&set(
        &new_image,
        "next",
        "{revision: {customVersion: never-recorded}}",
    ));
    let out = controller.apply(&app_pod(
        &format!("f-{id}"),
        &format!("pin-{id}"),
        &old_image,
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("customVersion \"never-recorded\" is not among its revisions")
            && stderr.contains(&format!("{stable} (stable)")),
        "{stderr}"
    );
    assert!(
        controller.get_json(&["pod", &format!("f-{id}")]).is_none(),
        "nothing stored"
    );
}

/// ContainerRecreateRequest in both versions: v1beta1 with Kruise's full containers[]
/// (a preStop of the request's own runs instead of the container's; a statusContext
/// naming an instance that is gone leaves the running one alone), v1alpha1 with names
/// only (statusContext filled in from the pod's status, the container's own preStop).
#[test]
fn kruise_recreate_requests_honour_pre_stop_and_status_context() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) = controller_with_agent(dir.path(), "crr-corpus", "itest-crr-corpus");
    let image = lab.image("rigger-lab/busybox:1");
    let id = format!("r{}", std::process::id());
    let out = dir.path().join("out");
    let pod_name = format!("crr-{id}");
    let hook = |name: &str| {
        format!(
            "  - name: {name}\n    image: {image}\n    command: [\"sh\", \"-c\", \"{IDLE}\"]\n    volumeMounts: [{{name: out, mountPath: /out}}]\n    lifecycle: {{preStop: {{exec: {{command: [\"sh\", \"-c\", \"echo own > /out/{name}-prestop\"]}}}}}}\n"
        )
    };
    controller.apply_ok(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod_name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 5\n  volumes:\n  - name: out\n    hostPath: {{path: {}, type: DirectoryOrCreate}}\n  containers:\n{}{}",
        out.display(),
        hook("app"),
        hook("web"),
    ));
    let container_id = |name: &str| {
        let pod = controller.get_json(&["pod", &pod_name]).unwrap();
        container_status(&pod, name)["containerID"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    controller.ready_pod(&pod_name, Duration::from_secs(120));
    let (app_before, web_before) = (container_id("app"), container_id("web"));
    let completed = |name: &str| {
        wait_until(
            &format!("{name} to complete"),
            Duration::from_secs(90),
            || {
                let crr = controller.get_json(&["crr", name])?;
                (crr["status"]["phase"] == "Completed").then_some(crr)
            },
        )
    };
    let state = |crr: &Value, container: &str| {
        crr["status"]["containerRecreateStates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == container)
            .cloned()
            .unwrap()
    };

    let document = corpus("containerrecreaterequest-v1beta1.yaml", &image, &id)
        .replace("${POD}", &pod_name)
        .replace("${GONE}", &"0".repeat(64));
    controller.apply_ok(&document);
    let crr = completed(&format!("restart-{id}"));
    assert_eq!(crr["apiVersion"], "apps.kruise.io/v1beta1");
    assert_eq!(
        crr["status"]["conditions"][0]["type"], "PreRecreateGrace",
        "{crr}"
    );
    wait_for_condition(
        &controller,
        &format!("crr/restart-{id}"),
        "PreRecreateGrace",
    );
    assert_eq!(state(&crr, "app")["phase"], "Succeeded", "{crr}");
    assert_eq!(state(&crr, "web")["phase"], "Succeeded", "{crr}");
    assert!(
        state(&crr, "web")["message"]
            .as_str()
            .unwrap()
            .starts_with("already recreated"),
        "{crr}"
    );
    assert_eq!(
        crr["spec"]["containers"][0]["statusContext"]["containerID"], app_before,
        "filled in from the pod's status: {crr}"
    );
    wait_until("app's next instance", Duration::from_secs(60), || {
        let now = container_id("app");
        (!now.is_empty() && now != app_before).then_some(())
    });
    assert_eq!(container_id("web"), web_before, "web was not stopped");
    assert_eq!(
        std::fs::read_to_string(out.join("override-prestop"))
            .unwrap()
            .trim(),
        "override",
        "{}",
        log_tail(&agent.log, 20)
    );
    assert!(
        !out.join("app-prestop").exists(),
        "the request's hook ran instead"
    );
    assert!(!out.join("web-prestop").exists(), "web was left alone");

    controller.ready_pod(&pod_name, Duration::from_secs(60));
    let app_now = container_id("app");
    controller.apply_ok(
        &corpus("containerrecreaterequest-v1alpha1.yaml", &image, &id).replace("${POD}", &pod_name),
    );
    let crr = completed(&format!("restart-alpha-{id}"));
    assert_eq!(crr["apiVersion"], "apps.kruise.io/v1alpha1");
    assert!(
        crr["status"].get("conditions").is_none(),
        "v1alpha1 has none: {crr}"
    );
    assert_eq!(
        crr["spec"]["containers"][0]["statusContext"]["containerID"],
        app_now
    );
    assert_eq!(state(&crr, "app")["phase"], "Succeeded", "{crr}");
    assert_eq!(
        std::fs::read_to_string(out.join("app-prestop"))
            .unwrap()
            .trim(),
        "own",
        "the container's own hook"
    );
    for (kind, name) in [
        ("crr", format!("restart-{id}")),
        ("crr", format!("restart-alpha-{id}")),
        ("pod", pod_name.clone()),
    ] {
        assert!(controller.ctl(&["delete", kind, &name]).status.success());
    }
}

/// ImageListPullJob in both versions: one ImagePullJob per image, labelled as the
/// list's; Kruise's counts; an image dropped from the list takes its job with it, and so
/// does deleting the list; a job applied with the owner label does not become a list's.
#[test]
fn kruise_image_list_pull_jobs_pull_every_image_through_one_job_each() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let node = "list-node";
    let (controller, agent) = controller_with_agent(dir.path(), node, "itest-list");
    let id = format!("l{}", std::process::id());
    let images = [
        lab.image(&rigger_integration_tests::unique_image("list-a", 1, 4096)),
        lab.image(&rigger_integration_tests::unique_image("list-b", 1, 4096)),
    ];
    let fill = |name: &str| {
        corpus(name, "", &id)
            .replace("${IMAGE1}", &images[0])
            .replace("${IMAGE2}", &images[1])
            .replace("${NODE}", node)
    };
    let list_name = format!("warm-{id}");
    controller.apply_ok(&fill("imagelistpulljob-v1beta1.yaml"));
    let list = wait_until("both images pulled", Duration::from_secs(120), || {
        let list = controller.get_json(&["imagelistpulljob", &list_name])?;
        (list["status"]["succeeded"] == 2).then_some(list)
    });
    assert_eq!(list["apiVersion"], "apps.kruise.io/v1beta1");
    assert_eq!(list["status"]["desired"], 2, "{list}");
    assert_eq!(list["status"]["completed"], 2, "{list}");
    assert!(list["status"]["completionTime"].is_string(), "{list}");
    let jobs = controller
        .get_json(&[
            "imagepulljobs",
            "-l",
            &format!("imagelistpulljob.rigger.dev/name={list_name}"),
        ])
        .unwrap();
    let jobs = jobs["items"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    for job in jobs {
        assert_eq!(job["spec"]["pullPolicy"]["backoffLimit"], 3);
        assert_eq!(job["spec"]["pullSecrets"][0], format!("regcred-{id}"));
        assert_eq!(
            job["status"]["succeeded"],
            1,
            "{job}\n{}",
            log_tail(&agent.log, 20)
        );
    }
    let table = controller.ctl(&["get", "imagelistpulljobs"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.lines().any(|l| l.starts_with(&list_name)
            && l.split_whitespace()
                .skip(1)
                .take(4)
                .eq(["2", "0", "2", "2"])),
        "{table}"
    );

    // The node's NodeImage: the two pulls, with their jobs as owners; read-only.
    let node_image = controller.get_json(&["nodeimage", node]).unwrap();
    assert_eq!(node_image["apiVersion"], "apps.kruise.io/v1beta1");
    assert_eq!(node_image["status"]["desired"], 2, "{node_image}");
    assert_eq!(node_image["status"]["succeeded"], 2, "{node_image}");
    for image in &images {
        let (name, tag) = image.rsplit_once(':').unwrap();
        let owners = &node_image["spec"]["images"][name]["tags"][0];
        assert_eq!(owners["tag"], tag, "{node_image}");
        assert_eq!(
            owners["ownerReferences"][0]["kind"], "ImagePullJob",
            "{node_image}"
        );
        let status = &node_image["status"]["imageStatuses"][name]["tags"][0];
        assert_eq!(status["phase"], "Succeeded", "{node_image}");
        assert!(
            status["imageID"].as_str().unwrap().contains("@sha256:"),
            "{node_image}"
        );
    }
    let table = controller.ctl(&["get", "nodeimages"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().take(5).eq([node, "2", "0", "2", "0"])),
        "{table}"
    );
    for file in ["nodeimage-v1beta1.yaml", "nodeimage-v1alpha1.yaml"] {
        let document = corpus(file, "", &id).replace("${NODE}", node);
        let refused = controller.apply(&document);
        let expected = document
            .lines()
            .find_map(|l| l.strip_prefix("# refused: "))
            .unwrap();
        assert!(!refused.status.success(), "{file} was applied");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains(expected),
            "{file}"
        );
    }

    // A forged owner label is not kept: the job stays nobody's.
    controller.apply_ok(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata:\n  name: forged-{id}\n  labels: {{imagelistpulljob.rigger.dev/name: {list_name}}}\nspec:\n  image: {}\n  selector: {{names: [no-such-node]}}\n",
        images[0]
    ));
    let forged = controller
        .get_json(&["imagepulljob", &format!("forged-{id}")])
        .unwrap();
    assert!(
        forged["metadata"]["labels"]
            .get("imagelistpulljob.rigger.dev/name")
            .is_none(),
        "{forged}"
    );

    // An image dropped from the list: its job goes.
    let one = fill("imagelistpulljob-v1beta1.yaml").replace(&format!("  - {}\n", images[1]), "");
    controller.apply_ok(&one);
    let list = controller
        .get_json(&["imagelistpulljob", &list_name])
        .unwrap();
    assert_eq!(list["status"]["desired"], 1, "{list}");
    let jobs = controller
        .get_json(&[
            "imagepulljobs",
            "-l",
            &format!("imagelistpulljob.rigger.dev/name={list_name}"),
        ])
        .unwrap();
    assert_eq!(jobs["items"].as_array().unwrap().len(), 1, "{jobs}");

    // v1alpha1, completion policy Never: pulls, never completes.
    controller.apply_ok(&fill("imagelistpulljob-v1alpha1.yaml"));
    let keep = wait_until(
        "the v1alpha1 list's image",
        Duration::from_secs(120),
        || {
            let list = controller.get_json(&["imagelistpulljob", &format!("keep-{id}")])?;
            (list["status"]["succeeded"] == 1).then_some(list)
        },
    );
    assert_eq!(keep["apiVersion"], "apps.kruise.io/v1alpha1");
    assert!(keep["status"].get("completionTime").is_none(), "{keep}");

    // Deleting a list deletes its jobs; the forged job is not among them.
    for list in [list_name, format!("keep-{id}")] {
        assert!(
            controller
                .ctl(&["delete", "imagelistpulljob", &list])
                .status
                .success()
        );
    }
    let left = controller.get_json(&["imagepulljobs"]).unwrap();
    let left: Vec<&str> = left["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        left,
        [format!("forged-{id}")],
        "only the forged job is left"
    );
}

/// ImagePullJob in both versions, every optional field: by node names with a pull
/// secret, sandbox config and deadlines (v1beta1); by the pods a node runs and by label
/// expressions (v1alpha1); each answers in its version and pulls on the node.
#[test]
fn kruise_image_pull_jobs_apply_in_both_versions() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let node = "job-corpus";
    let (controller, agent) = controller_with_agent(dir.path(), node, "itest-job-corpus");
    let id = format!("j{}", std::process::id());
    let image = lab.image(&rigger_integration_tests::unique_image(
        "job-corpus",
        1,
        4096,
    ));
    let busybox = lab.image("rigger-lab/busybox:1");
    let fill = |name: &str| corpus(name, &image, &id).replace("${NODE}", node);
    // The pod the v1alpha1 job's podSelector finds.
    controller.apply_ok(&app_pod(
        &format!("corpus-{id}"),
        &format!("corpus-{id}"),
        &busybox,
    ));
    controller.ready_pod(&format!("corpus-{id}"), Duration::from_secs(120));
    let labelled = controller.ctl(&["label", "node", node, &format!("pool=corpus-{id}")]);
    assert!(
        labelled.status.success(),
        "{}",
        String::from_utf8_lossy(&labelled.stderr)
    );
    controller.apply_ok(&fill("imagepulljob-v1beta1.yaml"));
    controller.apply_ok(&fill("imagepulljob-v1alpha1.yaml"));
    for (name, version) in [
        (format!("job-{id}"), "apps.kruise.io/v1beta1"),
        (format!("by-pods-{id}"), "apps.kruise.io/v1alpha1"),
        (format!("by-labels-{id}"), "apps.kruise.io/v1alpha1"),
    ] {
        let job = wait_until(&format!("{name} to pull"), Duration::from_secs(120), || {
            let job = controller.get_json(&["imagepulljob", &name])?;
            (job["status"]["succeeded"] == 1).then_some(job)
        });
        assert_eq!(job["apiVersion"], version, "{job}");
        assert_eq!(
            job["status"]["desired"],
            1,
            "{job}\n{}",
            log_tail(&agent.log, 20)
        );
    }
    let job = controller
        .get_json(&["imagepulljob", &format!("job-{id}")])
        .unwrap();
    assert_eq!(
        job["spec"]["sandboxConfig"]["annotations"]["example.com/why"],
        "corpus"
    );
    assert_eq!(job["spec"]["pullPolicy"]["backoffLimit"], 2);
    wait_for_condition(&controller, &format!("imagepulljob/job-{id}"), "Complete");
}
