//! The etcd store meets the same contract as the embedded one, against a real etcd, in
//! plain text and over TLS with client certificates.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use rigger_controller::config::EtcdTls;
use rigger_store::{EtcdStore, Store, conformance};
use std::io::BufRead as _;
use std::process::Child;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use rigger_integration_tests::{Controller, Etcd, assert_ok, wait_until};

#[tokio::test]
async fn etcd_store_meets_the_store_contract() {
    let etcd = Etcd::start();
    let store = EtcdStore::connect(std::slice::from_ref(&etcd.endpoint), "/itest/", None)
        .await
        .unwrap();
    conformance(&Store::new(store)).await.unwrap();
}

#[tokio::test]
async fn a_store_of_a_newer_format_is_refused_and_left_as_it_was() {
    let etcd = Etcd::start();
    let endpoints = std::slice::from_ref(&etcd.endpoint);
    let store = EtcdStore::connect(endpoints, "/itest-format/", None)
        .await
        .unwrap();
    let mut client = store.client();
    let recorded = client.get("/itest-format/format", None).await.unwrap();
    assert_eq!(
        recorded.kvs()[0].value_str().unwrap(),
        rigger_store::STORE_FORMAT.to_string(),
        "the format is recorded at the first open"
    );
    // A newer release's store.
    let newer = (rigger_store::STORE_FORMAT + 1).to_string();
    client
        .put("/itest-format/format", newer.clone(), None)
        .await
        .unwrap();
    client
        .put("/itest-format/objects/Secret/default/s", "{}", None)
        .await
        .unwrap();
    let before = client
        .get(
            "/itest-format/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let err = EtcdStore::connect(endpoints, "/itest-format/", None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("store format {newer} by a newer release")),
        "{err}"
    );
    assert!(err.contains("nothing was changed"), "{err}");
    let after = client
        .get(
            "/itest-format/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(
        after.header().unwrap().revision(),
        before,
        "nothing written"
    );
    assert_eq!(after.kvs().len(), 2);
}

#[tokio::test]
async fn a_ten_thousand_node_job_status_round_trips_through_etcd() {
    use rigger_api::image_pull_job::{ImagePullJobStatus, NodePullPhase, NodePullStatus};
    use rigger_controller::engines::jobs::status as job_status;
    use rigger_store::{ObjectKey, Precondition};

    let etcd = Etcd::start();
    let store = EtcdStore::connect(std::slice::from_ref(&etcd.endpoint), "/itest-big/", None)
        .await
        .unwrap();
    let store = Store::new(store);
    let job = ObjectKey::new("ImagePullJob", "default", "fleet");
    let node = |i: usize| NodePullStatus {
        name: format!("node-{i:05}.pool-a.example.internal"),
        phase: if i.is_multiple_of(3) {
            NodePullPhase::Succeeded
        } else {
            NodePullPhase::Pulling
        },
        attempts: 1,
        task_id: format!(
            "5f0c1a7e-1b2c-4d3e-8f90-0123456789ab/node-{i:05}.pool-a.example.internal/1"
        ),
        bytes_done: 96 << 20,
        bytes_total: 128 << 20,
        message: "pulled 3 of 4 layers".to_owned(),
        image_digest: format!("sha256:{:064x}", i),
        start_time: Some("2026-11-23T10:00:00Z".to_owned()),
        completion_time: i
            .is_multiple_of(3)
            .then(|| "2026-11-23T10:00:09Z".to_owned()),
        node_lost: false,
    };
    let mut status = ImagePullJobStatus {
        start_time: Some("2026-11-23T10:00:00Z".to_owned()),
        desired: 10_000,
        active: 6_666,
        succeeded: 3_334,
        nodes: (0..10_000).map(node).collect(),
        ..ImagePullJobStatus::default()
    };

    // As one object, etcd refuses it: over its 1.5 MiB request limit.
    let whole = serde_json::to_vec(&status).unwrap();
    assert!(whole.len() > 3 << 19, "{} bytes", whole.len());
    let refused = store
        .put(job_status::summary_key(&job), whole, Precondition::Any)
        .await;
    assert!(refused.is_err(), "etcd took a {}-byte request", 3 << 19);

    let mut written = job_status::Written::default();
    job_status::write(&store, &job, status.clone(), &mut written)
        .await
        .unwrap();
    let (read_back, mut written) = job_status::read(&store, &job).await.unwrap().unwrap();
    assert_eq!(read_back, status);

    // A change to one node rewrites that node's shard, and reads back too.
    status.nodes[9_999].phase = NodePullPhase::Succeeded;
    status.nodes[9_999].bytes_done = 128 << 20;
    job_status::write(&store, &job, status.clone(), &mut written)
        .await
        .unwrap();
    assert_eq!(
        job_status::read(&store, &job).await.unwrap().unwrap().0,
        status
    );

    job_status::delete(&store, &job).await.unwrap();
    assert!(job_status::read(&store, &job).await.unwrap().is_none());
    assert!(store.list(job_status::NODES_KIND).await.unwrap().is_empty());
}

#[tokio::test]
async fn an_unreachable_etcd_is_one_clear_line() {
    let port = rigger_integration_tests::free_port();
    let err = EtcdStore::connect(&[format!("127.0.0.1:{port}")], "/itest/", None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("store etcd://127.0.0.1:{port}: ")),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
}

/// The TLS settings of `etcd`, with or without the client certificate.
fn etcd_tls(etcd: &Etcd, with_identity: bool) -> EtcdTls {
    let tls = etcd.tls.as_ref().unwrap();
    EtcdTls {
        ca: tls.ca.clone(),
        identity: with_identity.then(|| (tls.cert.clone(), tls.key.clone())),
    }
}

#[tokio::test]
async fn an_etcd_requiring_tls_and_client_certificates_is_a_store() {
    let etcd = Etcd::start_tls();
    let endpoints = std::slice::from_ref(&etcd.endpoint);
    let store = EtcdStore::connect(endpoints, "/itest-tls/", Some(&etcd_tls(&etcd, true)))
        .await
        .unwrap();
    conformance(&Store::new(store)).await.unwrap();

    // Without the client certificate, or without TLS at all: refused, one line.
    for tls in [Some(etcd_tls(&etcd, false)), None] {
        let err = EtcdStore::connect(endpoints, "/itest-tls/", tls.as_ref())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(&etcd.endpoint), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}

#[test]
fn a_controller_runs_on_an_etcd_over_tls() {
    let etcd = Etcd::start_tls();
    let tls = etcd.tls.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("etcd://{}", etcd.endpoint);
    let (ca, cert, key) = (
        tls.ca.display().to_string(),
        tls.cert.display().to_string(),
        tls.key.display().to_string(),
    );
    let controller = Controller::start_with(
        dir.path(),
        &[
            "--store",
            &store,
            "--etcd-ca-file",
            &ca,
            "--etcd-cert-file",
            &cert,
            "--etcd-key-file",
            &key,
        ],
    );
    let out = controller.apply(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: over-tls\nspec:\n  image: registry.example/app:1\n  selector:\n    names: [nowhere]\n",
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        rigger_integration_tests::log_tail(&controller.log, 20)
    );
    let job = controller.get_json(&["imagepulljob", "over-tls"]).unwrap();
    assert!(job["metadata"]["uid"].is_string(), "{job:#}");
}

/// The standard gRPC health service answers which replica leads: SERVING on the leader,
/// NOT_SERVING on followers — on the API port (TLS) and on the health port (plaintext,
/// what Kubernetes' gRPC probes need); riggerctl finds the leader through it whatever
/// order the servers are listed in.
#[tokio::test(flavor = "multi_thread")]
async fn the_grpc_health_service_names_the_leader() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let replicas = Controller::replicas(dir.path(), &etcd, 3);
    let leader = rigger_integration_tests::wait_until(
        "one replica to lead",
        std::time::Duration::from_secs(30),
        || replicas.iter().position(Controller::is_leader),
    );
    for (i, replica) in replicas.iter().enumerate() {
        let wanted = if i == leader {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", replica.health))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        for service in ["", "rigger.v1.Control"] {
            // The leader reports SERVING a moment after it wins.
            let mut status = ServingStatus::Unknown as i32;
            for _ in 0..50 {
                status = health
                    .check(HealthCheckRequest {
                        service: service.to_owned(),
                    })
                    .await
                    .unwrap()
                    .into_inner()
                    .status;
                if status == wanted as i32 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert_eq!(status, wanted as i32, "replica {i}, service {service:?}");
        }
    }
    // Listed with the leader last: riggerctl skips the followers.
    let mut order: Vec<&str> = replicas.iter().map(|r| r.server.as_str()).collect();
    let leader_server = order.remove(leader);
    order.push(leader_server);
    let out = replicas[0]
        .ctl_command("admin", &order.join(","), &["get", "nodes"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two controller replicas on `etcd`, and which of them leads (and which follows).
fn two_replicas(dir: &std::path::Path, etcd: &Etcd) -> (Vec<Controller>, usize, usize) {
    let replicas = Controller::replicas(dir, etcd, 2);
    let leader = wait_until("one replica to lead", Duration::from_secs(30), || {
        replicas.iter().position(Controller::is_leader)
    });
    (replicas, leader, 1 - leader)
}

/// Until `replica` leads (after its peer was killed).
fn wait_to_lead(replica: &Controller) {
    wait_until("the other replica to lead", Duration::from_secs(30), || {
        replica.is_leader().then_some(())
    });
}

/// An ImagePullJob named `name` that runs nowhere (its node does not exist).
fn idle_job(name: &str) -> String {
    format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: {name}\nspec:\n  image: 127.0.0.1:1/nowhere:1\n  selector:\n    names: [no-such-node]\n"
    )
}

/// The lines `child` prints on its standard output, as they come.
fn lines_of(child: &mut Child) -> Receiver<String> {
    let (lines, seen) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    seen
}

/// `riggerctl wait` through a failover: the leader is killed (SIGKILL) under a running
/// wait; the wait follows the replica that leads next, within its `--timeout`, and sees
/// what happens there (here the object it waits on deleted through the new leader).
#[test]
fn a_wait_survives_the_leaders_sigkill() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut replicas, leader, follower) = two_replicas(dir.path(), &etcd);
    replicas[leader].apply_ok(&idle_job("through-failover"));
    let wait = replicas[leader]
        .ctl_command(
            "admin",
            &replicas[leader].endpoints,
            &[
                "wait",
                "imagepulljob/through-failover",
                "--for=delete",
                "--timeout=90s",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The wait is watching (its listing came back) before the leader goes.
    std::thread::sleep(Duration::from_secs(2));
    replicas[leader].kill();
    wait_to_lead(&replicas[follower]);
    assert_ok(&replicas[follower].ctl(&["delete", "imagepulljob", "through-failover"]));
    let out = wait.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the wait gave up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "imagepulljob/through-failover condition met"
    );
}

/// `riggerctl get -w` through a failover: the leader is killed under it, and it goes on
/// printing what changes on the replica that leads next.
#[test]
fn a_get_watch_goes_on_through_the_leaders_sigkill() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut replicas, leader, follower) = two_replicas(dir.path(), &etcd);
    replicas[leader].apply_ok(&idle_job("before-failover"));
    let mut watch = replicas[leader]
        .ctl_command(
            "admin",
            &replicas[leader].endpoints,
            &["get", "imagepulljobs", "-w", "-o", "name"],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let seen = lines_of(&mut watch);
    let until = |wanted: &str| loop {
        match seen.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line == wanted => return,
            Ok(_) => {}
            Err(e) => panic!("{wanted} not printed: {e}"),
        }
    };
    until("imagepulljob.apps.kruise.io/before-failover");
    replicas[leader].kill();
    // A read made at once, while no replica leads yet, waits the failover out.
    let read = replicas[follower].ctl(&["get", "imagepulljob", "before-failover", "-o", "name"]);
    assert!(
        read.status.success(),
        "a get during the failover: {}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&read.stdout).trim(),
        "imagepulljob.apps.kruise.io/before-failover"
    );
    wait_to_lead(&replicas[follower]);
    replicas[follower].apply_ok(&idle_job("after-failover"));
    until("imagepulljob.apps.kruise.io/after-failover");
    let _ = watch.kill();
    let _ = watch.wait();
}

/// `riggerctl logs -f` through a failover: the leader is killed while it follows a
/// container printing a numbered line five times a second; it goes on through the next
/// leader from where it was, every line once and in order.
#[test]
fn a_logs_follow_goes_on_through_the_leaders_sigkill_every_line_once() {
    use rigger_integration_tests::{Agent, Lab};
    let lab = Lab::get();
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut replicas, leader, follower) = two_replicas(dir.path(), &etcd);
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let node = lab.first_node();
    let _agent = Agent::start(
        &replicas[leader],
        "logs-failover-node",
        &node.address,
        &node.hosts_dir,
        "itest-logs-failover",
        &state,
    );
    // A pod is placed on a ready node when applied.
    wait_until("the node to be ready", Duration::from_secs(30), || {
        let node = replicas[leader].get_json(&["node", "logs-failover-node"])?;
        (node["status"]["conditions"][0]["status"] == "True").then_some(())
    });
    let name = format!("counter-{}", std::process::id());
    replicas[leader].apply_ok(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {}\n    command: [\"sh\", \"-c\", \"i=0; while true; do echo line-$i; i=$((i+1)); sleep 0.2; done\"]\n",
        lab.image("rigger-lab/busybox:1")
    ));
    wait_until("the pod to run", Duration::from_secs(90), || {
        let pod = replicas[leader].get_json(&["pod", &name])?;
        (pod["status"]["phase"] == "Running").then_some(())
    });
    let mut follow = replicas[leader]
        .ctl_command(
            "viewer",
            &replicas[leader].endpoints,
            &["logs", "-f", &name],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let seen = lines_of(&mut follow);
    // Each line is the one after the last: none twice, none skipped.
    let mut next = 0u64;
    let mut read_until = |last: u64| {
        while next <= last {
            let line = seen
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("line-{next} not printed: {e}"));
            assert_eq!(line, format!("line-{next}"), "printed out of turn");
            next += 1;
        }
        next
    };
    let printed = read_until(10);
    replicas[leader].kill();
    wait_to_lead(&replicas[follower]);
    // Well past the failover: the lines written while no replica led come through too.
    read_until(printed + 50);
    let _ = follow.kill();
    let _ = follow.wait();
    assert_ok(&replicas[follower].ctl(&["delete", "pod", &name]));
}
