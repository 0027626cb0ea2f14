//! The node's pull limits are the node's: a job's pull, a pod's image pull and an
//! in-place update's pre-download running at once share one engine, so the registry
//! (a proxy in front of the lab's, recording when each request was in flight) never
//! sees more blob requests at a time than `--max-connections`, nor more bytes than
//! `--limit-rate` allows in the time they took.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rigger_integration_tests::{
    Agent, Controller, Lab, Proxy, container_status, log_tail, plain_http_hosts_dir, pod_ready,
    unique_image_with, wait_until,
};
use serde_json::Value;

const MAX_CONNECTIONS: usize = 2;
/// Layers are several times what loopback sockets buffer (a few MiB), so the proxy's
/// view of a request (arrival, last byte handed to the socket) is close to the agent's.
const LAYER: usize = 8 << 20;
const RATE: u64 = 3 << 20;

fn now_us() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

/// `rigger-lab/x` of `host:port/rigger-lab/x:1`.
fn repo_of(image: &str) -> &str {
    let path = image.split_once('/').unwrap().1;
    path.rsplit_once(':').unwrap().0
}

fn pod_yaml(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{app: {name}}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 0.2; done\"]\n"
    )
}

/// The most requests in flight at once among `spans` (arrival, last byte handed over):
/// one that ended when another arrived did not overlap it.
fn peak(spans: &[(u64, u64)]) -> usize {
    let mut events: Vec<(u64, i32)> = spans
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    // At one instant, ends before arrivals.
    events.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, change) in events {
        now += change;
        most = most.max(now);
    }
    usize::try_from(most).unwrap()
}

#[test]
#[allow(clippy::too_many_lines)] // one story: three pulls at once, then what the registry saw
fn a_job_a_pod_and_an_in_place_update_share_the_nodes_limits() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(&serde_json::json!([]), &[]);
    let hosts = plain_http_hosts_dir(dir.path(), &[&proxy.address]);
    let controller = Controller::start(&dir.path().join("controller"));
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let mut agent = Agent::start(
        &controller,
        "limits-node",
        &lab.containerd_address,
        &hosts,
        "itest-limits",
        &state,
    );
    agent.restart_with_flag("--max-connections", &MAX_CONNECTIONS.to_string());
    agent.restart_with_flag("--limit-rate", &RATE.to_string());
    wait_until("the node to be ready", Duration::from_secs(30), || {
        let n = controller.get_json(&["node", "limits-node"])?;
        (n["status"]["conditions"][0]["status"] == "True").then_some(())
    });
    let logs = || {
        format!(
            "{}\n{}",
            log_tail(&controller.log, 20),
            log_tail(&agent.log, 200)
        )
    };
    let through_proxy = |repo_and_tag: &str| format!("{}/{repo_and_tag}", proxy.address);

    // Three images of their own (no blob shared but busybox's, already on the node):
    // one for the job, one for a new pod, one the running pod is updated to.
    let job_image = through_proxy(&unique_image_with("limits-job", 3, LAYER, &[]));
    let pod_image = through_proxy(&unique_image_with(
        "limits-pod",
        3,
        LAYER,
        &["--base", "busybox"],
    ));
    let update_image = through_proxy(&unique_image_with(
        "limits-update",
        3,
        LAYER,
        &["--base", "busybox"],
    ));
    let busybox = through_proxy("rigger-lab/busybox:1");
    let id = std::process::id();
    let (updated, started) = (format!("updated-{id}"), format!("started-{id}"));

    controller.apply_ok(&pod_yaml(&updated, &busybox));
    let before = wait_until("the first pod to be ready", Duration::from_secs(90), || {
        let pod = controller.get_json(&["pod", &updated])?;
        pod_ready(&pod).then_some(pod)
    });

    // All three at once: the update first (its pre-download is the pod runner's own
    // task), then, once its first blob is on the way, the job and the new pod.
    let since = now_us();
    controller.apply_ok(&pod_yaml(&updated, &update_image));
    let update_repo = repo_of(&update_image);
    wait_until(
        "the update's first blob request",
        Duration::from_secs(60),
        || {
            proxy
                .requests()
                .iter()
                .any(|r| {
                    r["path"]
                        .as_str()
                        .unwrap()
                        .contains(&format!("/{update_repo}/blobs/"))
                })
                .then_some(())
        },
    );
    let job = format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: limits-{id}\nspec:\n  image: {job_image}\n  parallelism: 1\n  selector:\n    names: [limits-node]\n  completionPolicy:\n    type: Always\n  pullPolicy:\n    timeoutSeconds: 300\n"
    );
    controller.apply_ok(&format!("{job}---\n{}", pod_yaml(&started, &pod_image)));
    wait_until(
        "the job, the new pod and the update",
        Duration::from_secs(180),
        || {
            let job = controller.get_json(&["imagepulljob", &format!("limits-{id}")])?;
            let pod = controller.get_json(&["pod", &started])?;
            let update = controller.get_json(&["pod", &updated])?;
            let app = container_status(&update, "app");
            (job["status"]["succeeded"] == 1
                && pod_ready(&pod)
                && app["containerID"] != container_status(&before, "app")["containerID"]
                && pod_ready(&update))
            .then_some(())
        },
    );
    let done = now_us();

    let requests: Vec<Value> = proxy
        .requests()
        .into_iter()
        .filter(|r| r["method"] == "GET" && r["arrived_us"].as_u64().unwrap() >= since)
        .collect();
    let blobs: Vec<&Value> = requests
        .iter()
        .filter(|r| r["path"].as_str().unwrap().contains("/blobs/"))
        .collect();
    let span = |r: &Value| {
        (
            r["arrived_us"].as_u64().unwrap(),
            r["last_sent_us"].as_u64().unwrap(),
        )
    };

    // The three pulls ran at once in the agent: the job's and the pod's began (their
    // manifests, which take no connection, were asked for) before the update's could
    // have ended at the rate alone. (The proxy cannot show it with blob requests: a
    // socket's buffers let a blob's last byte leave the proxy long before the agent
    // reads it, and waiting pulls' requests arrive only when a connection frees.)
    let of_repo = |image: &str| {
        let repo = format!("/{}/", repo_of(image));
        requests
            .iter()
            .filter(move |r| r["path"].as_str().unwrap().contains(&repo))
    };
    let began = |image: &str| {
        of_repo(image)
            .map(|r| r["arrived_us"].as_u64().unwrap())
            .min()
            .unwrap_or_else(|| panic!("{image} was never asked for\n{}", logs()))
    };
    let update_blobs =
        of_repo(&update_image).filter(|r| r["path"].as_str().unwrap().contains("/blobs/"));
    let update_bytes: u64 = update_blobs
        .clone()
        .map(|r| r["sent"].as_u64().unwrap())
        .sum();
    let update_first_blob = update_blobs
        .map(|r| r["arrived_us"].as_u64().unwrap())
        .min()
        .unwrap();
    let update_alone_us = update_bytes.saturating_sub(RATE) * 1_000_000 / RATE;
    let update_earliest_end = update_first_blob + update_alone_us;
    for image in [&job_image, &pod_image] {
        assert!(
            began(image) < update_earliest_end,
            "{image} began {} ms after the update's first blob, which alone takes {} ms: the pulls did not run at once",
            (began(image) - update_first_blob) / 1000,
            update_alone_us / 1000
        );
    }

    // Never more blob requests at a time than the node's connections.
    let all: Vec<_> = blobs.iter().map(|r| span(r)).collect();
    let most = peak(&all);
    assert!(
        most <= MAX_CONNECTIONS,
        "{most} blob requests at once, --max-connections {MAX_CONNECTIONS}\n{}",
        logs()
    );

    // Never more bytes than the rate allows in the time taken (its bucket starts full:
    // one second's worth on top). Counted as the registry sent them: bytes a node
    // discards (a stream left for ranges with its body in the socket's buffers) crossed
    // the link the cap protects all the same.
    let bytes: u64 = blobs.iter().map(|r| r["sent"].as_u64().unwrap()).sum();
    let first = all.iter().map(|s| s.0).min().unwrap();
    let seconds = (done - first) as f64 / 1e6;
    let allowed = RATE as f64 * (seconds + 1.0);
    eprintln!(
        "{} blob requests, at most {most} at once; {bytes} bytes in {seconds:.2}s (allowed {allowed:.0})",
        blobs.len()
    );
    let listing: Vec<String> = blobs
        .iter()
        .map(|r| {
            format!(
                "{} {} range {} sent {} at +{} ms",
                r["status"],
                r["path"].as_str().unwrap().rsplit('/').next().unwrap(),
                r["range"],
                r["sent"],
                (r["arrived_us"].as_u64().unwrap() - first) / 1000
            )
        })
        .collect();
    assert!(
        bytes as f64 <= allowed,
        "{bytes} bytes in {seconds:.2}s at --limit-rate {RATE}/s:\n{}\n{}",
        listing.join("\n"),
        logs()
    );
}

/// `--max-parallel-image-pulls`: jobs asking for more images at once than the node's
/// limit take turns. Seen at the registry (a proxy): an image's requests, from its first
/// arrival to its last body byte handed over, overlap those of at most `limit` images —
/// and of exactly `limit` at some moment: the proxy holds each image's requests until
/// `limit` images were asked for, so pulls the limit lets run together do (the
/// controller hands the four jobs over a few hundred milliseconds apart, and small
/// images would otherwise finish before the next arrives). Were the agent stricter than
/// its limit, the hold would end after its 20 s and the count would say so.
#[test]
fn images_pulled_at_once_stay_within_the_nodes_limit() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(&serde_json::json!([]), &[]);
    let hosts = plain_http_hosts_dir(dir.path(), &[&proxy.address]);
    let controller = Controller::start(&dir.path().join("controller"));
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let mut agent = Agent::start(
        &controller,
        "turns-node",
        &lab.containerd_address,
        &hosts,
        "itest-turns",
        &state,
    );
    let id = std::process::id();
    for limit in [1usize, 2] {
        agent.restart_with_flag("--max-parallel-image-pulls", &limit.to_string());
        wait_until("the node to be ready", Duration::from_secs(30), || {
            let n = controller.get_json(&["node", "turns-node"])?;
            (n["status"]["conditions"][0]["status"] == "True").then_some(())
        });
        let images: Vec<String> = (0..4)
            .map(|i| {
                let repo = unique_image_with(&format!("turns-{limit}-{i}"), 2, 1 << 20, &[]);
                format!("{}/{repo}", proxy.address)
            })
            .collect();
        let among = format!("/turns-{limit}-");
        proxy.set_faults(&serde_json::json!([{
            "path_contains": among,
            "action": {"hold_until_repositories": limit, "among": among, "at_most_ms": 20_000},
            "times": 10_000,
        }]));
        let since = now_us();
        let jobs: Vec<String> = images
            .iter()
            .enumerate()
            .map(|(i, image)| {
                format!(
                    "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: turns-{limit}-{i}-{id}\nspec:\n  image: {image}\n  selector:\n    names: [turns-node]\n  pullPolicy:\n    timeoutSeconds: 120\n"
                )
            })
            .collect();
        controller.apply_ok(&jobs.join("---\n"));
        wait_until("every job to succeed", Duration::from_secs(120), || {
            (0..images.len())
                .all(|i| {
                    controller
                        .get_json(&["imagepulljob", &format!("turns-{limit}-{i}-{id}")])
                        .is_some_and(|job| job["status"]["succeeded"] == 1)
                })
                .then_some(())
        });

        let requests: Vec<Value> = proxy
            .requests()
            .into_iter()
            .filter(|r| r["arrived_us"].as_u64().unwrap() >= since)
            .collect();
        // Per image: its first request's arrival to its last body byte handed over (which
        // is before the agent has read it, so no later than the image's turn ended).
        let spans: Vec<(u64, u64)> = images
            .iter()
            .map(|image| {
                let repo = format!("/{}/", repo_of(image));
                let of_image: Vec<&Value> = requests
                    .iter()
                    .filter(|r| r["path"].as_str().unwrap().contains(&repo))
                    .collect();
                let first = of_image
                    .iter()
                    .map(|r| r["arrived_us"].as_u64().unwrap())
                    .min()
                    .unwrap_or_else(|| panic!("{image} never asked for"));
                let last = of_image
                    .iter()
                    .map(|r| r["last_sent_us"].as_u64().unwrap())
                    .max()
                    .unwrap();
                (first, last)
            })
            .collect();
        let most = peak(&spans);
        assert_eq!(
            most,
            limit,
            "--max-parallel-image-pulls {limit}: {most} images at once (spans {spans:?})\n{}",
            log_tail(&agent.log, 60)
        );
    }
}
