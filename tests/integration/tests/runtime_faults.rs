//! Faults of the runtime under a pull, on a containerd of the test's own (the shared lab
//! nodes must not restart or fill up under the other tests): containerd killed and
//! restarted mid-pull, and a content store that fills up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::{Command, Stdio};
use std::time::Duration;

use rigger_integration_tests::{PrivateContainerd, Proxy, binary, incoming_left, unique_image};
use serde_json::json;

fn pull(containerd: &PrivateContainerd, state: &std::path::Path, ns: &str, image: &str) -> Command {
    let mut command = Command::new(binary("rigger-agent"));
    command
        .args(["pull", "--plain-http", "--registry-config", "/nonexistent"])
        .arg("--address")
        .arg(&containerd.address)
        .arg("--state-dir")
        .arg(state)
        .args(["--namespace", ns, "--max-connections", "2", image]);
    command
}

/// `ctr images check`: every blob of the image is present and complete.
fn image_complete(containerd: &PrivateContainerd, ns: &str) -> bool {
    let check = containerd.ctr(ns, &["images", "check"]);
    let rows: Vec<&str> = check.lines().skip(1).collect();
    rows.len() == 1 && rows[0].contains("complete")
}

#[test]
fn a_pull_rides_through_a_containerd_restart_and_the_image_is_whole() {
    rides_through_a_containerd_restart(false);
}

#[test]
fn a_pull_through_content_write_resumes_its_ingests_after_a_containerd_restart() {
    rides_through_a_containerd_restart(true);
}

/// containerd restarted mid-pull; `through_api`: every byte through `Content.Write`, so
/// the pull meets the restart mid-write and resumes the ingests containerd kept. (Written
/// beside the store, the layers' bytes do not need containerd until their commit.)
fn rides_through_a_containerd_restart(through_api: bool) {
    let mut containerd = PrivateContainerd::start(None);
    let state = tempfile::tempdir().unwrap();
    // About 6 s to download: containerd goes down and comes back in the middle.
    let image = unique_image("ctd-restart", 2, 6 << 20);
    let proxy = Proxy::start(&json!([]), &["--connection-rate", "1MiB"]);
    let reference = format!("{}/{image}", proxy.address);
    let ns = "itest-ctd-restart";

    let child = pull(&containerd, state.path(), ns, &reference)
        .args(through_api.then_some("--through-content-api"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    containerd.restart();
    let first = child.wait_with_output().unwrap();
    // The pull waited for containerd, reopened its ingests where containerd kept them,
    // and finished; the image is whole.
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        image_complete(&containerd, ns),
        "{}",
        containerd.ctr(ns, &["images", "check"])
    );
    assert_eq!(
        containerd.ctr(ns, &["images", "ls", "-q"]).trim(),
        reference
    );
    if !through_api {
        return;
    }
    // (It did meet the restart: the pull's progress says so, and where it went on.)
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(
        stderr.contains(": containerd went away; waiting up to 1m for it to come back"),
        "{stderr}"
    );
    assert!(stderr.contains(": going on from "), "{stderr}");
}

#[test]
fn a_full_content_store_fails_the_pull_clearly_and_records_no_image() {
    // The disk guard lets the pull start (two 8 MiB layers, incompressible filler: ~64 MiB
    // needed by its estimate, 96 MiB free); then another writer fills the filesystem while
    // the first bytes of each layer are held back (the proxy stalls them; the agent's stall
    // timeout retries).
    let containerd = PrivateContainerd::start(Some("96m"));
    let state = tempfile::tempdir().unwrap();
    let image = unique_image("disk-full", 2, 8 << 20);
    let (manifest, _) = rigger_integration_tests::Lab::get().manifest(&image);
    let layers: Vec<String> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_owned())
        .collect();
    let stalls: Vec<_> = layers
        .iter()
        .map(|digest| json!({"path_contains": digest, "action": {"stall_after": 0}, "times": 1}))
        .collect();
    let proxy = Proxy::start(&json!(stalls), &[]);
    let reference = format!("{}/{image}", proxy.address);
    let ns = "itest-disk-full";

    let child = pull(&containerd, state.path(), ns, &reference)
        .args(["--stall-timeout", "3s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let asked_for = |digest: &str| {
        proxy
            .requests()
            .iter()
            .any(|r| r["path"].as_str().unwrap().contains(digest))
    };
    rigger_integration_tests::wait_until("both layers asked for", Duration::from_secs(20), || {
        layers.iter().all(|d| asked_for(d)).then_some(())
    });
    fill(&containerd.root.join("filler"));
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    // (The stalls' retries are progress lines that say "error" too: the failure is the
    // one line the agent ends with.)
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("rigger-agent: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    let error = errors[0];
    // The disk fills under containerd's content write (Go's "no space left on device") or
    // under the agent's own unpack into the snapshot (Rust's "No space left on device"),
    // whichever writes the byte too many.
    assert!(
        error
            .to_ascii_lowercase()
            .contains("no space left on device"),
        "{error}"
    );
    assert_eq!(containerd.ctr(ns, &["images", "ls", "-q"]).trim(), "");
    // The partial downloads went (keeping them to resume would keep the disk full): the
    // ingests and the files written beside the store.
    let active = containerd.ctr(ns, &["content", "active"]);
    assert_eq!(active.lines().count(), 1, "only the header: {active}");
    let left = incoming_left(&containerd.root);
    assert!(left.is_empty(), "{left:?} left beside the store");
    // And so did the half-unpacked layers: no snapshot is left being prepared.
    let snapshots = containerd.ctr(ns, &["snapshots", "ls"]);
    assert!(
        !snapshots.lines().skip(1).any(|row| row.contains("Active")),
        "{snapshots}"
    );
}

/// Write zeros to `path` until its filesystem is full.
fn fill(path: &std::path::Path) {
    use std::io::Write as _;
    let mut file = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 1 << 20];
    while file.write_all(&block).is_ok() {}
    let _ = file.sync_all();
}

/// containerd keeping each namespace's content apart (`content_sharing_policy =
/// "isolated"`) does not take a blob the agent wrote into its store: the bytes go through
/// `Content.Write` from the agent's file instead, the image is whole, the same in a second
/// namespace, and nothing is left beside the store.
#[test]
fn an_isolated_content_store_takes_the_bytes_through_its_api() {
    let containerd = PrivateContainerd::start_isolated();
    let state = tempfile::tempdir().unwrap();
    let image = unique_image("isolated", 2, 4 << 20);
    let lab = rigger_integration_tests::Lab::get();
    let reference = format!("{}/{image}", lab.registry);
    for ns in ["itest-isolated-a", "itest-isolated-b"] {
        let out = pull(&containerd, state.path(), ns, &reference)
            .env("RUST_LOG", "rigger_pull=info")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        // (The second namespace finds the blob in containerd's store and writes through
        // the API from the start.)
        if ns.ends_with("-a") {
            assert!(
                stderr.contains("containerd did not take the blob written beside its store"),
                "{stderr}"
            );
            // And the blobs after it go through Content.Write from their first byte.
            assert!(
                stderr.contains("containerd does not take blobs written beside its store"),
                "{stderr}"
            );
        }
        assert!(
            image_complete(&containerd, ns),
            "{}",
            containerd.ctr(ns, &["images", "check"])
        );
    }
    let left = incoming_left(&containerd.root);
    assert!(left.is_empty(), "{left:?} left beside the store");
}
