//! riggerctl where kubectl users expect kubectl's behaviour: `apply -f DIR [-R]`,
//! `delete -f FILE|DIR`, `-o name`, `-o jsonpath=`, `-l`, `--field-selector`,
//! `wait --for=delete|jsonpath=`. Against a real controller.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeSet;
use std::process::Output;

use rigger_integration_tests::Controller;

fn job(api_version: &str, name: &str) -> String {
    format!(
        "apiVersion: {api_version}\nkind: ImagePullJob\nmetadata:\n  name: {name}\nspec:\n  image: registry.example/app:1\n  selector:\n    names: [no-such-node]\n"
    )
}

fn stdout_lines(out: &Output) -> BTreeSet<String> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn apply_and_delete_read_files_and_directories_as_kubectl_does() {
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(manifests.join("more")).unwrap();
    std::fs::write(
        manifests.join("a.yaml"),
        format!(
            "{}---\n{}",
            job("apps.kruise.io/v1alpha1", "one"),
            job("apps.kruise.io/v1beta1", "two")
        ),
    )
    .unwrap();
    std::fs::write(manifests.join("README.md"), "not a manifest").unwrap();
    std::fs::write(
        manifests.join("more/b.yml"),
        job("rigger.dev/v1alpha1", "three"),
    )
    .unwrap();
    let dir_arg = manifests.to_str().unwrap();
    let names = || stdout_lines(&controller.ctl(&["get", "imagepulljobs", "-o", "name"]));

    // A directory: its files, not its subdirectories.
    let applied = stdout_lines(&controller.ctl(&["apply", "-f", dir_arg]));
    assert_eq!(
        applied,
        set(&[
            "imagepulljob.apps.kruise.io/one created",
            "imagepulljob.apps.kruise.io/two created"
        ])
    );
    assert_eq!(
        names(),
        set(&[
            "imagepulljob.apps.kruise.io/one",
            "imagepulljob.apps.kruise.io/two"
        ])
    );
    // -R: the subdirectory too; what is there already is unchanged.
    let applied = stdout_lines(&controller.ctl(&["apply", "-R", "-f", dir_arg]));
    assert!(
        applied.contains("imagepulljob.rigger.dev/three created"),
        "{applied:?}"
    );
    assert!(
        applied.contains("imagepulljob.apps.kruise.io/one unchanged"),
        "{applied:?}"
    );
    assert_eq!(names().len(), 3);
    // -o jsonpath: kubectl's templates, over the List or over one object.
    let out = controller.ctl(&[
        "get",
        "imagepulljobs",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}={.apiVersion}{"\n"}{end}"#,
    ]);
    assert_eq!(
        stdout_lines(&out),
        set(&[
            "one=apps.kruise.io/v1alpha1",
            "two=apps.kruise.io/v1beta1",
            "three=rigger.dev/v1alpha1"
        ])
    );
    let out = controller.ctl(&["get", "imagepulljob", "two", "-o", "jsonpath={.spec.image}"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "registry.example/app:1"
    );
    // -l and --field-selector, applied by the controller.
    controller.apply_ok(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata:\n  name: labelled\n  labels: {team: web, tier: front}\nspec:\n  image: registry.example/app:1\n  selector:\n    names: [no-such-node]\n",
    );
    let get = |args: &[&str]| {
        let mut all = vec!["get", "imagepulljobs", "-o", "name"];
        all.extend_from_slice(args);
        stdout_lines(&controller.ctl(&all))
    };
    let labelled = set(&["imagepulljob.apps.kruise.io/labelled"]);
    assert_eq!(get(&["-l", "team=web"]), labelled);
    assert_eq!(get(&["-l", "team in (web,db),tier!=back,!drain"]), labelled);
    assert_eq!(get(&["-l", "team"]), labelled);
    assert_eq!(get(&["-l", "!team"]).len(), 3);
    assert_eq!(
        get(&["--field-selector", "metadata.name=two"]),
        set(&["imagepulljob.apps.kruise.io/two"])
    );
    assert_eq!(get(&["--field-selector", "metadata.name!=two"]).len(), 3);
    let out = controller.ctl(&["get", "imagepulljobs", "-l", "team in web"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("label selector"), "{stderr}");
    let out = controller.ctl(&["get", "imagepulljobs", "--field-selector", "spec.image=x"]);
    assert!(!out.status.success());
    controller.ctl(&["delete", "imagepulljob", "labelled"]);

    // wait --for=jsonpath: a value, or any value.
    let out = controller.ctl(&[
        "wait",
        "imagepulljob/two",
        "--for=jsonpath={.apiVersion}=apps.kruise.io/v1beta1",
        "--timeout=5s",
    ]);
    assert_eq!(stdout_lines(&out), set(&["imagepulljob/two condition met"]));
    let out = controller.ctl(&[
        "wait",
        "imagepulljob/two",
        "--for=jsonpath={.spec.image}=other:2",
        "--timeout=1s",
    ]);
    assert!(!out.status.success());
    let out = controller.ctl(&["get", "imagepulljobs", "-o", "jsonpath={range .items[*]}"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("without {end}"), "{stderr}");

    // A broken file anywhere in the tree: one line naming it, nothing applied.
    std::fs::write(manifests.join("more/c.yaml"), "kind: [").unwrap();
    std::fs::write(
        manifests.join("d.yaml"),
        job("apps.kruise.io/v1beta1", "four"),
    )
    .unwrap();
    let out = controller.ctl(&["apply", "-R", "-f", dir_arg]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("c.yaml: document 1"), "{stderr}");
    assert_eq!(names().len(), 3, "nothing applied");
    std::fs::remove_file(manifests.join("more/c.yaml")).unwrap();
    std::fs::remove_file(manifests.join("d.yaml")).unwrap();

    // delete -f FILE: each object of the file, by its kind, namespace and name.
    let a = manifests.join("a.yaml");
    let deleted = stdout_lines(&controller.ctl(&["delete", "-f", a.to_str().unwrap()]));
    assert_eq!(
        deleted,
        set(&[
            "imagepulljob.apps.kruise.io/one deleted",
            "imagepulljob.apps.kruise.io/two deleted"
        ])
    );
    assert_eq!(names(), set(&["imagepulljob.rigger.dev/three"]));
    // Again: they are gone, which is an error naming them, unless --ignore-not-found.
    let out = controller.ctl(&["delete", "-f", a.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("imagepulljob.apps.kruise.io/one"),
        "{stderr}"
    );
    let out = controller.ctl(&["delete", "--ignore-not-found", "-f", a.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // wait --for=delete: a timeout while it is there; met once it is deleted meanwhile.
    let out = controller.ctl(&["wait", "imagepulljob/three", "--for=delete", "--timeout=1s"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("to be deleted"), "{stderr}");
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            controller.ctl(&[
                "wait",
                "imagepulljob/three",
                "--for=delete",
                "--timeout=30s",
            ])
        });
        std::thread::sleep(std::time::Duration::from_secs(1));
        // A directory, recursively.
        stdout_lines(&controller.ctl(&["delete", "-R", "--ignore-not-found", "-f", dir_arg]));
        let out = waiting.join().unwrap();
        assert_eq!(
            stdout_lines(&out),
            set(&["imagepulljob/three condition met"])
        );
    });
    assert!(names().is_empty());
    // Gone already: met at once.
    stdout_lines(&controller.ctl(&["wait", "imagepulljob/three", "--for=delete"]));
}

/// `apply --dry-run=server -o yaml` shows the object as the controller would store it
/// (defaults filled in) and stores nothing; `--dry-run=client` does not ask the
/// controller; `-o name` after a real apply names what was applied.
#[test]
fn dry_runs_show_the_object_as_it_would_be_stored() {
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, job("apps.kruise.io/v1beta1", "planned")).unwrap();
    let file = file.to_str().unwrap();

    let out = controller.ctl(&["apply", "--dry-run=server", "-o", "json", "-f", file]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the object");
    assert_eq!(shown["apiVersion"], "apps.kruise.io/v1beta1", "{shown}");
    assert_eq!(shown["metadata"]["namespace"], "default", "{shown}");
    assert_eq!(
        shown["spec"]["pullPolicy"]["timeoutSeconds"], 600,
        "{shown}"
    );
    assert_eq!(shown["spec"]["imagePullPolicy"], "IfNotPresent", "{shown}");
    let out = controller.ctl(&["apply", "--dry-run=server", "-o", "yaml", "-f", file]);
    let yaml = String::from_utf8_lossy(&out.stdout);
    assert!(yaml.contains("timeoutSeconds: 600"), "{yaml}");
    let listed = controller.get_json(&["imagepulljobs"]).unwrap();
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        0,
        "nothing stored"
    );

    // A bare --dry-run is the server's check too; a refusal names the field.
    std::fs::write(
        dir.path().join("bad.yaml"),
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata:\n  name: bad\nspec:\n  image: a:1\n  parallelism: \"150%\"\n",
    )
    .unwrap();
    let bad = dir.path().join("bad.yaml");
    let out = controller.ctl(&["apply", "--dry-run", "-f", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("spec.parallelism"));
    // Client: the files alone.
    let out = controller.ctl(&["apply", "--dry-run=client", "-o", "name", "-f", file]);
    assert_eq!(
        stdout_lines(&out),
        set(&["imagepulljob.apps.kruise.io/planned"])
    );

    let out = controller.ctl(&["apply", "-o", "name", "-f", file]);
    assert_eq!(
        stdout_lines(&out),
        set(&["imagepulljob.apps.kruise.io/planned"])
    );
    assert!(controller.get_json(&["imagepulljob", "planned"]).is_some());
}

/// Nodes and NodeImages are the controller's to show: an apply or a delete of one is
/// refused with the reason, and nothing is stored.
#[test]
fn read_only_kinds_are_neither_applied_nor_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    for (kind, api_version, why) in [
        ("Node", "v1", "a node exists while its agent is registered"),
        (
            "NodeImage",
            "apps.kruise.io/v1alpha1",
            "each node's is read from its inventory",
        ),
    ] {
        let file = dir.path().join(format!("{kind}.yaml"));
        std::fs::write(
            &file,
            format!("apiVersion: {api_version}\nkind: {kind}\nmetadata:\n  name: node-a\n"),
        )
        .unwrap();
        let out = controller.ctl(&["apply", "-f", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{kind} applied");
        assert!(
            stderr.contains(&format!("{kind} objects are read-only")) && stderr.contains(why),
            "{stderr}"
        );
        let out = controller.ctl(&["delete", &kind.to_ascii_lowercase(), "node-a"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{kind} deleted");
        assert!(stderr.contains("read-only"), "{stderr}");
    }
    let nodes = controller.get_json(&["nodes"]).unwrap();
    assert_eq!(nodes["items"].as_array().unwrap().len(), 0, "{nodes}");
}

/// `get -w` follows the controller's Watch: the objects there are, then each change as
/// it happens (a re-applied spec, a deletion), without listing everything again.
#[test]
fn get_watch_prints_each_change_as_it_happens() {
    use std::io::{BufRead as _, BufReader};
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    controller.apply_ok(&job("apps.kruise.io/v1beta1", "before"));
    let args = ["get", "imagepulljobs", "-w", "-o", "name"];
    let mut watcher = controller
        .ctl_command("viewer", &controller.endpoints, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = watcher.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = || {
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("a line from get -w")
    };
    assert_eq!(
        next(),
        "imagepulljob.apps.kruise.io/before",
        "what there is first"
    );
    controller.apply_ok(&job("apps.kruise.io/v1beta1", "after"));
    assert_eq!(next(), "imagepulljob.apps.kruise.io/after", "a new object");
    controller.apply_ok(
        &job("apps.kruise.io/v1beta1", "after").replace("spec:\n", "spec:\n  parallelism: 3\n"),
    );
    assert_eq!(
        next(),
        "imagepulljob.apps.kruise.io/after",
        "a change to it"
    );
    // Its status follows (the controller takes in the new spec); once settled, nothing
    // is printed again: the watch sends changes, not the list every second.
    std::thread::sleep(std::time::Duration::from_secs(3));
    while rx.try_recv().is_ok() {}
    let extra = rx.recv_timeout(std::time::Duration::from_secs(3));
    assert!(extra.is_err(), "{extra:?}");
    watcher.kill().unwrap();
    let _ = watcher.wait();
}

/// Kubernetes' whole ObjectMeta: `generateName` makes a name; `resourceVersion` is
/// refused on create and, on an update, must be the stored one (`get -o json` shows it);
/// `ownerReferences` and `finalizers` are kept; a delete of an object with finalizers
/// only marks it (`deletionTimestamp`), and it goes once an apply leaves it none.
#[test]
fn object_metadata_is_kubernetes_whole() {
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let with_metadata = |metadata: &str| {
        format!(
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata:\n{metadata}spec:\n  image: registry.example/app:1\n  selector:\n    names: [no-such-node]\n"
        )
    };
    let created = controller.apply_ok(&with_metadata("  generateName: warm-\n"));
    let listed = controller.get_json(&["imagepulljobs"]).unwrap();
    let name = listed["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        name.starts_with("warm-") && name.len() == 10,
        "{name}: {created}"
    );
    assert_eq!(listed["items"][0]["metadata"]["generateName"], "warm-");

    let out = controller.apply(&with_metadata("  name: fresh\n  resourceVersion: \"7\"\n"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("metadata.resourceVersion: must not be set on create"),
        "{stderr}"
    );

    let held = "  name: held\n  finalizers: [example.com/hold]\n  ownerReferences:\n  - {apiVersion: apps/v1, kind: Deployment, name: web, uid: 2f1c, controller: true}\n";
    controller.apply_ok(&with_metadata(held));
    let stored = controller.get_json(&["imagepulljob", "held"]).unwrap();
    assert_eq!(
        stored["metadata"]["finalizers"],
        serde_json::json!(["example.com/hold"])
    );
    assert_eq!(stored["metadata"]["ownerReferences"][0]["name"], "web");
    let version = stored["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    // An update made from an older version is a conflict.
    let stale = format!(
        "{held}  resourceVersion: \"{}\"\n",
        version.parse::<u64>().unwrap() - 1
    );
    let out = controller.apply(&with_metadata(&stale));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the object has been modified"), "{stderr}");

    let out = controller.ctl(&["delete", "imagepulljob", "held"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let marked = controller
        .get_json(&["imagepulljob", "held"])
        .expect("kept while it has finalizers");
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    controller.apply_ok(&with_metadata("  name: held\n"));
    assert!(
        controller.get_json(&["imagepulljob", "held"]).is_none(),
        "gone with its last finalizer"
    );
}

/// `apply && wait`, the line of every CI pipeline, a hundred times in a row: the wait
/// sees the object its apply just wrote, even while another watch keeps the
/// controller's feed of that kind (and its listing, up to a second old) alive.
#[test]
fn apply_then_wait_sees_the_write_every_time() {
    use std::process::Stdio;

    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let mut watcher = controller
        .ctl_command(
            "viewer",
            &controller.endpoints,
            &["get", "imagepulljobs", "-w", "-o", "name"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for i in 0..100 {
        let name = format!("rw-{i}");
        controller.apply_ok(&job("apps.kruise.io/v1beta1", &name));
        let out = controller.ctl(&[
            "wait",
            &format!("imagepulljob/{name}"),
            &format!("--for=jsonpath={{.metadata.name}}={name}"),
            "--timeout=10s",
        ]);
        assert!(
            out.status.success(),
            "try {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = watcher.kill();
    let _ = watcher.wait();
}
