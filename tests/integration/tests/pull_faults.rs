//! The pull engine against a misbehaving registry (rigger-lab-proxy injects the faults):
//! it retries, falls back, resumes, or fails with a clear reason — and never leaves a
//! corrupt image behind.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::{Command, Output};

use rigger_integration_tests::{
    Lab, Proxy, TestNamespace, assert_ok, binary, image_records, unique_image,
};
use serde_json::json;

fn pull_through(proxy: &str, ns: &str, repo_tag: &str, extra: &[&str]) -> Output {
    let lab = Lab::get();
    Command::new(binary("rigger-agent"))
        .args(["pull", "--plain-http", "--registry-config", "/nonexistent"])
        .arg("--address")
        .arg(&lab.containerd_address)
        .args(["--namespace", ns])
        .args(extra)
        .arg(format!("{proxy}/{repo_tag}"))
        .output()
        .unwrap()
}

fn blob_requests(proxy: &Proxy) -> Vec<serde_json::Value> {
    proxy
        .requests()
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().contains("/blobs/sha256:"))
        .collect()
}

/// The proxy's requests for the blob `digest`.
fn requests_for(proxy: &Proxy, digest: &str) -> Vec<serde_json::Value> {
    blob_requests(proxy)
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().contains(digest))
        .collect()
}

fn layer_digest(repo_tag: &str) -> String {
    let (manifest, _) = Lab::get().manifest(repo_tag);
    manifest["layers"][0]["digest"].as_str().unwrap().to_owned()
}

#[test]
fn retries_429_and_503_with_retry_after_and_500() {
    let image = unique_image("fault-429", 1, 1 << 20);
    let proxy = Proxy::start(
        &json!([
            {"path_contains": "/blobs/", "action": {"status": 429, "retry_after": 1}, "times": 2},
            {"path_contains": "/blobs/", "action": {"status": 503, "retry_after": 1}, "times": 1},
            {"path_contains": "/blobs/", "action": {"status": 500}, "times": 1}
        ]),
        &[],
    );
    let ns = TestNamespace::new("fault-429");
    assert_ok(&pull_through(&proxy.address, &ns.name, &image, &[]));
    let statuses: Vec<u64> = blob_requests(&proxy)
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(&statuses[..4], &[429, 429, 503, 500], "{statuses:?}");
    assert!(
        statuses[4..].iter().all(|s| *s == 200 || *s == 206),
        "{statuses:?}"
    );
    assert_eq!(image_records(&ns.name).len(), 1);
}

#[test]
fn a_reset_mid_blob_resumes_from_the_offset_containerd_holds() {
    let image = unique_image("fault-reset", 1, 4 << 20);
    let layer = layer_digest(&image);
    let proxy = Proxy::start(
        &json!([{"path_contains": layer, "action": {"reset_after": 300000}, "times": 1}]),
        &[],
    );
    let ns = TestNamespace::new("fault-reset");
    let out = pull_through(&proxy.address, &ns.name, &image, &[]);
    assert_ok(&out);
    // The progress says so: the layer stalled, then went on from what containerd held.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let short = &layer.trim_start_matches("sha256:")[..12];
    assert!(
        stderr.contains(&format!("layer {short}: retrying after:")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("layer {short}: going on from ")),
        "{stderr}"
    );
    let blobs = blob_requests(&proxy);
    let resumed = blobs
        .iter()
        .find_map(|r| r["range"].as_str())
        .unwrap_or_else(|| panic!("a ranged request after the reset: {blobs:?}"));
    // It starts where the reset cut the first response, not at 0.
    let start: u64 = resumed
        .trim_start_matches("bytes=")
        .split('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(start > 0 && start <= 300_000, "{resumed}");
}

#[test]
fn a_truncated_body_is_resumed_and_the_image_is_whole() {
    let image = unique_image("fault-truncate", 1, 4 << 20);
    let layer = layer_digest(&image);
    let proxy = Proxy::start(
        &json!([{"path_contains": layer, "action": {"truncate_after": 500000}, "times": 1}]),
        &[],
    );
    let ns = TestNamespace::new("fault-truncate");
    assert_ok(&pull_through(&proxy.address, &ns.name, &image, &[]));
    let fetches = requests_for(&proxy, &layer);
    assert!(
        fetches.len() >= 2 && fetches[0]["fault"].as_str().is_some(),
        "the truncated layer was fetched again: {fetches:?}"
    );
    // The image is recorded only once every blob matched its digest.
    assert_eq!(image_records(&ns.name).len(), 1);
    assert!(active_ingests(&ns.name).is_empty(), "no ingest left behind");
}

#[test]
fn a_wrong_digest_is_downloaded_again() {
    let image = unique_image("fault-digest", 1, 1 << 20);
    let layer = layer_digest(&image);
    let proxy = Proxy::start(
        &json!([{"path_contains": layer, "action": {"corrupt": true}, "times": 1}]),
        &[],
    );
    let ns = TestNamespace::new("fault-digest");
    assert_ok(&pull_through(&proxy.address, &ns.name, &image, &[]));
    let fetches = requests_for(&proxy, &layer).len();
    assert!(fetches >= 2, "the corrupt layer was fetched again");
    assert_eq!(image_records(&ns.name).len(), 1);
}

#[test]
fn a_registry_that_always_corrupts_fails_clearly_and_records_nothing() {
    let image = unique_image("fault-corrupt", 1, 1 << 20);
    let proxy = Proxy::start(
        &json!([{"path_contains": "/blobs/", "action": {"corrupt": true}, "times": 1000}]),
        &[],
    );
    let ns = TestNamespace::new("fault-corrupt");
    let out = pull_through(&proxy.address, &ns.name, &image, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let last = stderr.trim_end().lines().last().unwrap();
    assert!(last.starts_with("rigger-agent: error:"), "{stderr}");
    assert!(last.contains(&image), "names the image: {last}");
    assert!(
        image_records(&ns.name).is_empty(),
        "no image record is left"
    );
    // No snapshot either.
    assert!(
        Lab::get()
            .ctr(&ns.name, &["snapshots", "ls"])
            .lines()
            .count()
            <= 1
    );
}

#[test]
fn a_stalled_transfer_is_retried() {
    let image = unique_image("fault-stall", 1, 1 << 20);
    let layer = layer_digest(&image);
    let proxy = Proxy::start(
        &json!([{"path_contains": layer, "action": {"stall_after": 1000}, "times": 1}]),
        &[],
    );
    let ns = TestNamespace::new("fault-stall");
    assert_ok(&pull_through(
        &proxy.address,
        &ns.name,
        &image,
        &["--stall-timeout", "1s"],
    ));
    assert!(blob_requests(&proxy).len() >= 2);
}

#[test]
fn falls_back_to_the_next_host_on_server_errors() {
    let lab = Lab::get();
    let image = unique_image("fault-fallback", 1, 1 << 20);
    // A mirror that fails everything, listed before the real registry.
    let broken = Proxy::start(
        &json!([{"path_contains": "/v2/", "action": {"status": 503}, "times": 1000}]),
        &[],
    );
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path().join(&lab.registry);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("hosts.toml"),
        format!(
            "server = \"http://{}\"\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
            lab.registry, broken.address
        ),
    )
    .unwrap();
    let ns = TestNamespace::new("fault-fallback");
    let out = Command::new(binary("rigger-agent"))
        .args(["pull", "--registry-config"])
        .arg(certs.path())
        .arg("--address")
        .arg(&lab.containerd_address)
        .args(["--namespace", &ns.name])
        .arg(lab.image(&image))
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(!broken.requests().is_empty(), "the mirror was tried first");
    assert_eq!(image_records(&ns.name).len(), 1);
}

/// Unfinished ingests in `ns`, from containerd's Content.ListStatuses: (ref, offset).
fn active_ingests(ns: &str) -> Vec<(String, u64)> {
    use containerd_client::services::v1::ListStatusesRequest;
    use containerd_client::services::v1::content_client::ContentClient;
    use rigger_runtime::{DEFAULT_CONNECT_TIMEOUT, Runtime, namespaced};
    let lab = Lab::get();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let runtime = Runtime::connect(&lab.containerd_address, DEFAULT_CONNECT_TIMEOUT)
            .await
            .unwrap();
        let request = namespaced(ListStatusesRequest { filters: vec![] }, ns).unwrap();
        ContentClient::new(runtime.channel())
            .list_statuses(request)
            .await
            .unwrap()
            .into_inner()
            .statuses
            .into_iter()
            .map(|s| (s.r#ref, u64::try_from(s.offset).unwrap()))
            .collect()
    })
}

/// Bytes of `layer` an interrupted pull wrote beside containerd's content store (a
/// layer this big is written there, not through `Content.Write`).
fn incoming_len(layer: &str) -> Option<u64> {
    let path = rigger_integration_tests::incoming_dir(&Lab::get().containerd_root)
        .join(layer.trim_start_matches("sha256:"));
    std::fs::metadata(path).ok().map(|m| m.len())
}

#[test]
fn a_killed_pull_resumes_where_its_bytes_stopped() {
    a_killed_pull_resumes(false);
}

#[test]
fn a_killed_pull_through_content_write_resumes_where_containerd_stopped() {
    a_killed_pull_resumes(true);
}

/// A pull killed mid-layer, run again: only the bytes missing are fetched. `through_api`:
/// every byte through `Content.Write`, so containerd's ingest holds them.
fn a_killed_pull_resumes(through_api: bool) {
    use rigger_integration_tests::{Daemon, wait_until};
    use std::time::Duration;

    let held = |layer: &str, ns: &str| match through_api {
        true => active_ingests(ns)
            .into_iter()
            .find(|(r, _)| r.contains(layer))
            .map(|(_, n)| n),
        false => incoming_len(layer),
    };
    let api_flag: &[&str] = match through_api {
        true => &["--through-content-api"],
        false => &[],
    };

    let lab = Lab::get();
    let image = unique_image("resume", 1, 16 << 20);
    let layer = layer_digest(&image);
    let ns = TestNamespace::new("resume");
    // A slow registry, so the pull is surely mid-layer when it is killed.
    let slow = Proxy::start(&json!([]), &["--connection-rate", "1MiB"]);
    let mut first = Daemon::spawn(
        Command::new(binary("rigger-agent"))
            .args(["pull", "--plain-http", "--registry-config", "/nonexistent"])
            .arg("--address")
            .arg(&lab.containerd_address)
            .args(["--namespace", &ns.name, "--max-connections", "1"])
            .args(api_flag)
            .arg(format!("{}/{image}", slow.address))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    );
    wait_until("a partly written layer", Duration::from_secs(60), || {
        held(&layer, &ns.name).filter(|n| *n > 1 << 20)
    });
    nix::sys::signal::kill(first.pid(), nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = first.child.wait();
    let offset = held(&layer, &ns.name).unwrap();

    // Restart through an unthrottled path: only the missing bytes are fetched. One
    // connection, as before the kill: with more, a stream that is slow on a loaded
    // machine is split into ranges mid-way (tested by
    // a_killed_parallel_pull_refetches_less_than_a_range_per_layer).
    let fast = Proxy::start(&json!([]), &[]);
    assert_ok(&pull_through(
        &fast.address,
        &ns.name,
        &image,
        &[&["--max-connections", "1"], api_flag].concat(),
    ));
    let layer_requests: Vec<serde_json::Value> = fast
        .requests()
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().contains(&layer))
        .collect();
    assert_eq!(layer_requests.len(), 1, "{layer_requests:?}");
    let range = layer_requests[0]["range"]
        .as_str()
        .expect("a ranged request");
    assert_eq!(
        range,
        format!("bytes={offset}-{}", lab_layer_size(&image) - 1)
    );
    assert_eq!(image_records(&ns.name).len(), 1);
    assert!(active_ingests(&ns.name).is_empty(), "no ingest left behind");
    assert_eq!(incoming_len(&layer), None, "no file left beside the store");
    // The killed pull's half-unpacked snapshot is released (GC removes it): what is left
    // is the image's committed layer.
    let snapshots = wait_until(
        "the killed pull's snapshot to go",
        Duration::from_secs(30),
        || {
            let list = Lab::get().ctr(&ns.name, &["snapshots", "ls"]);
            (!list.contains("Active")).then_some(list)
        },
    );
    assert_eq!(snapshots.lines().count(), 2, "{snapshots}");
}

fn lab_layer_size(repo_tag: &str) -> u64 {
    let (manifest, _) = Lab::get().manifest(repo_tag);
    manifest["layers"][0]["size"].as_u64().unwrap()
}

#[test]
fn concurrent_pulls_of_shared_layers_fetch_each_blob_once() {
    let lab = Lab::get();
    let image = unique_image("shared", 2, 4 << 20);
    // Slow enough that the two pulls overlap.
    let proxy = Proxy::start(&json!([]), &["--connection-rate", "4MiB"]);
    // Two agents pulling into one namespace (as two kubelet-side pulls into k8s.io would):
    // they meet on containerd's ingest lock for each blob.
    let ns = TestNamespace::new("shared");
    let pulls: Vec<_> = [0, 1]
        .iter()
        .map(|_| {
            let mut command = Command::new(binary("rigger-agent"));
            command
                .args(["pull", "--plain-http", "--registry-config", "/nonexistent"])
                .arg("--address")
                .arg(&lab.containerd_address)
                .args(["--namespace", &ns.name, "--max-connections", "1"])
                .arg(format!("{}/{image}", proxy.address));
            std::thread::spawn(move || command.output().unwrap())
        })
        .collect();
    for pull in pulls {
        assert_ok(&pull.join().unwrap());
    }
    let (manifest, _) = lab.manifest(&image);
    for layer in manifest["layers"].as_array().unwrap() {
        let digest = layer["digest"].as_str().unwrap();
        let fetches = requests_for(&proxy, digest).len();
        assert_eq!(fetches, 1, "layer {digest} fetched {fetches} times");
    }
    assert_eq!(image_records(&ns.name).len(), 1);
}

/// Bytes the proxy delivered per layer blob: (digest, bytes).
fn delivered_per_layer(proxy: &Proxy, layers: &[(String, u64)]) -> Vec<u64> {
    let requests = proxy.requests();
    layers
        .iter()
        .map(|(digest, _)| {
            requests
                .iter()
                .filter(|r| r["path"].as_str().unwrap().ends_with(digest.as_str()))
                .map(|r| r["sent"].as_u64().unwrap())
                .sum()
        })
        .collect()
}

#[test]
fn a_killed_parallel_pull_refetches_less_than_a_range_per_layer() {
    use rigger_integration_tests::{Daemon, wait_until};
    use std::time::Duration;

    let lab = Lab::get();
    let image = unique_image("resume-ranges", 2, 12 << 20);
    let (manifest, _) = lab.manifest(&image);
    let layers: Vec<(String, u64)> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["digest"].as_str().unwrap().to_owned(),
                l["size"].as_u64().unwrap(),
            )
        })
        .collect();
    let ns = TestNamespace::new("resume-ranges");
    let state = tempfile::tempdir().unwrap();
    let pull = |proxy: &str| {
        let mut command = Command::new(binary("rigger-agent"));
        command
            .args(["pull", "--plain-http", "--registry-config", "/nonexistent"])
            .arg("--address")
            .arg(&lab.containerd_address)
            .args(["--namespace", &ns.name])
            .arg("--state-dir")
            .arg(state.path())
            .arg(format!("{proxy}/{image}"));
        command
    };

    // A slow registry: every layer goes to parallel ranges, which are cut off mid-way.
    let slow = Proxy::start(&json!([]), &["--connection-rate", "1MiB"]);
    let mut first = Daemon::spawn(
        pull(&slow.address)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    );
    wait_until("ranges under way", Duration::from_secs(60), || {
        let ranged = blob_requests(&slow)
            .iter()
            .filter(|r| r["range"].is_string() && r["sent"].as_u64().unwrap() > 256 << 10)
            .count();
        (ranged >= 6).then_some(())
    });
    nix::sys::signal::kill(first.pid(), nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = first.child.wait();
    let before = delivered_per_layer(&slow, &layers);
    assert!(
        before.iter().any(|&b| b > 0),
        "the first pull fetched something"
    );
    assert!(
        std::fs::read_dir(state.path().join("spool"))
            .unwrap()
            .next()
            .is_some(),
        "ranges were spooled"
    );

    let fast = Proxy::start(&json!([]), &[]);
    assert_ok(&pull(&fast.address).output().unwrap());
    let after = delivered_per_layer(&fast, &layers);
    let range = rigger_pull::DEFAULT_CHUNK_SIZE;
    for (((digest, size), before), after) in layers.iter().zip(&before).zip(&after) {
        let refetched = (before + after).saturating_sub(*size);
        assert!(
            refetched < range,
            "{digest}: {before} bytes before the kill, {after} after, {size} in all: \
             {refetched} fetched twice"
        );
    }
    assert_eq!(image_records(&ns.name).len(), 1);
    assert!(active_ingests(&ns.name).is_empty(), "no ingest left behind");
    assert_eq!(
        std::fs::read_dir(state.path().join("spool"))
            .unwrap()
            .count(),
        0,
        "no spool left behind"
    );
}

/// A stream found slow is not dropped (HTTP/1.1 would close its connection, and its
/// ranges would wait for new ones): it goes on as the blob's first request, and the rest
/// of the blob is shared out to the node's idle connections as ranges. No byte comes
/// twice beyond what was in flight when a request's ranges went to another.
#[test]
fn a_slow_stream_goes_on_as_its_blobs_first_request() {
    let image = unique_image("slow-stream", 1, 12 << 20);
    let layer = layer_digest(&image);
    let size = lab_layer_size(&image);
    let ns = TestNamespace::new("slow-stream");
    let proxy = Proxy::start(&json!([]), &["--connection-rate", "4MiB"]);
    assert_ok(&pull_through(&proxy.address, &ns.name, &image, &[]));
    let requests = requests_for(&proxy, &layer);
    let stream = requests
        .iter()
        .find(|r| r["range"].is_null())
        .expect("the layer started as a stream");
    let streamed = stream["sent"].as_u64().unwrap();
    // Judged slow after 50 ms of waiting (~0.2 MiB at 4 MiB/s), it went on with the
    // node's sixteenth share of the layer: its first range (2 MiB).
    assert!(streamed >= 1 << 20, "the stream sent only {streamed} bytes");
    // The rest was shared out as ranges, none asked twice, none of the stream's own.
    let mut ranges: Vec<(u64, u64)> = requests
        .iter()
        .filter_map(|r| r["range"].as_str())
        .map(|range| {
            let (start, end) = range.trim_start_matches("bytes=").split_once('-').unwrap();
            (start.parse().unwrap(), end.parse().unwrap())
        })
        .collect();
    ranges.sort_unstable();
    assert!(!ranges.is_empty(), "no ranges: {requests:?}");
    assert!(ranges[0].0 >= 1 << 20, "{ranges:?}");
    assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0), "{ranges:?}");
    assert_eq!(ranges.last().unwrap().1, size - 1);
    assert_eq!(image_records(&ns.name).len(), 1);
    assert!(active_ingests(&ns.name).is_empty(), "no ingest left behind");
}

/// A stream found slow may go on for many ranges (all of its blob when the node's other
/// connections are busy): a connection broken every 1.5 MiB does not use up its tries,
/// each try bringing it a range further, and the image is whole.
#[test]
fn a_long_request_broken_now_and_then_still_ends() {
    let image = unique_image("broken-often", 1, 16 << 20);
    let layer = layer_digest(&image);
    let ns = TestNamespace::new("broken-often");
    // Slow enough that the stream is judged (50 ms of waiting, ~0.2 MiB, plus the 50 ms
    // its connection's budget may have saved up) long before its first reset.
    let proxy = Proxy::start(
        &json!([{"path_contains": layer, "action": {"reset_after": 1_500_000}, "times": 100}]),
        &["--connection-rate", "4MiB"],
    );
    let out = pull_through(
        &proxy.address,
        &ns.name,
        &image,
        &["--max-connections", "2"],
    );
    assert_ok(&out);
    let requests = requests_for(&proxy, &layer).len();
    // More requests than a span's tries: tries are counted per range, not per request.
    assert!(requests > 5, "{requests} requests");
    assert_eq!(image_records(&ns.name).len(), 1);
    assert!(active_ingests(&ns.name).is_empty(), "no ingest left behind");
}

/// A slow registry that answers range requests with the whole blob (no range support):
/// the pull notices at the first answers, starts no more range requests than its window
/// (16), and finishes on one stream from where containerd's ingest is.
#[test]
fn a_registry_ignoring_ranges_costs_at_most_one_window_of_requests() {
    let image = unique_image("no-ranges", 1, 12 << 20);
    let layer = layer_digest(&image);
    let ns = TestNamespace::new("no-ranges");
    let proxy = Proxy::start(&json!([]), &["--connection-rate", "4MiB", "--ignore-range"]);
    assert_ok(&pull_through(&proxy.address, &ns.name, &image, &[]));
    let ranged = requests_for(&proxy, &layer)
        .iter()
        .filter(|r| r["range"].is_string())
        .count();
    assert!(ranged >= 1, "the slow stream was supplemented by ranges");
    assert!(ranged <= 16 + 1, "{ranged} range requests");
    assert_eq!(image_records(&ns.name).len(), 1);
    assert!(active_ingests(&ns.name).is_empty(), "no ingest left behind");
}

/// A registry answering a manifest request with a body that never ends (a manifest
/// bomb; anyone on the path of a plain-HTTP mirror can send one): the pull fails with one
/// clear line once the 8 MiB limit is passed, and the agent's memory stays bounded (it
/// used to read the whole body: 8.4 GB before failing on the digest). The registry side
/// comes before anything containerd does, so one containerd version covers it.
#[test]
fn a_manifest_that_never_ends_is_refused_within_the_size_limit() {
    let proxy = Proxy::start(
        &json!([{"path_contains": "/manifests/", "action": {"endless": true}, "times": 100}]),
        &[],
    );
    let ns = TestNamespace::new("fault-bomb");
    let out = pull_through(&proxy.address, &ns.name, "rigger-lab/busybox:1", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("rigger-agent: error:")
            && last.contains("rigger-lab/busybox:1")
            && last.contains("bigger than 8.0 MiB"),
        "{stderr}"
    );
    // The largest child this test waited for (the agent; ctr and scripts are smaller).
    let usage =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    let peak_mib = usage.max_rss() / 1024;
    assert!(peak_mib < 96, "the agent peaked at {peak_mib} MiB");
    // It stopped reading at the limit (plus what was in flight).
    let sent: u64 = proxy
        .requests()
        .iter()
        .filter(|r| r["path"].as_str().unwrap().contains("/manifests/"))
        .map(|r| r["sent"].as_u64().unwrap())
        .sum();
    assert!(sent < 64 << 20, "the proxy sent {sent} bytes of manifest");
    assert!(image_records(&ns.name).is_empty());

    // The limit is the operator's to set.
    let out = pull_through(
        &proxy.address,
        &ns.name,
        "rigger-lab/busybox:1",
        &["--max-document-size", "1MiB"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("bigger than 1.0 MiB"), "{stderr}");
    assert!(image_records(&ns.name).is_empty());
}
