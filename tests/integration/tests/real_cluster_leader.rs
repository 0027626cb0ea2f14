//! One controller leader at a time on the lab's real cluster, counted from the API
//! server's own audit log: the replicas share one ServiceAccount, so each write is told
//! apart by the pod address it came from.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;
use std::time::Duration;

use rigger_integration_tests::real_cluster::{Progress, RealCluster, epoch_seconds};
use rigger_integration_tests::wait_until;
use serde_json::Value;

const CONTROLLER: &str = "system:serviceaccount:rigger-system:rigger-controller";
/// deploy/kubernetes/controller.yaml's `leader_lease`.
const LEASE: Duration = Duration::from_secs(15);

/// The Lease's holder: its pod's name (the identity is `<hostname>/<address>`).
fn holder(cluster: &RealCluster) -> Option<String> {
    let lease = cluster.get_json(&["-n", "rigger-system", "lease", "rigger-controller"])?;
    let identity = lease["spec"]["holderIdentity"].as_str()?;
    identity
        .split('/')
        .next()
        .filter(|pod| !pod.is_empty())
        .map(str::to_owned)
}

fn pod_ip(cluster: &RealCluster, pod: &str) -> String {
    cluster.kubectl_ok(&[
        "-n",
        "rigger-system",
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.status.podIP}",
    ])
}

/// The controller's successful writes since `since` (RFC 3339 seconds): when each was
/// received (seconds, fractional), from which address, and what it was.
fn writes(cluster: &RealCluster, since: f64) -> Vec<(f64, String, String)> {
    let audit = std::fs::read_to_string(&cluster.audit_log).unwrap();
    audit
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["user"]["username"] == CONTROLLER)
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_u64()
                .is_some_and(|c| c < 300)
        })
        .filter_map(|e| {
            let at = fractional_seconds(e["requestReceivedTimestamp"].as_str()?)?;
            let from = e["sourceIPs"][0].as_str()?.to_owned();
            let what = format!("{} {}", e["verb"], e["requestURI"]);
            (at >= since).then_some((at, from, what))
        })
        .collect()
}

/// `2026-11-30T09:41:02.123456Z` as seconds since the epoch, with its fraction.
fn fractional_seconds(rfc3339: &str) -> Option<f64> {
    let (whole, fraction) = match rfc3339.trim_end_matches('Z').split_once('.') {
        Some((whole, fraction)) => (format!("{whole}Z"), format!("0.{fraction}")),
        None => (rfc3339.to_owned(), "0".to_owned()),
    };
    let seconds = epoch_seconds(&Value::String(whole));
    Some(seconds as f64 + fraction.parse::<f64>().ok()?)
}

fn now_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Drops the leader's traffic to the API server (both ways, on the machine, where every
/// pod's packets pass), as a network partition does: its requests hang, unanswered.
struct Blackhole {
    ip: String,
}

impl Blackhole {
    fn rules(&self) -> [Vec<String>; 2] {
        let ip = self.ip.clone();
        [
            [
                "INPUT", "-s", &ip, "-p", "tcp", "--dport", "6443", "-j", "DROP",
            ]
            .map(str::to_owned)
            .to_vec(),
            [
                "OUTPUT", "-d", &ip, "-p", "tcp", "--sport", "6443", "-j", "DROP",
            ]
            .map(str::to_owned)
            .to_vec(),
        ]
    }

    fn start(ip: &str) -> Self {
        let blackhole = Self { ip: ip.to_owned() };
        for rule in blackhole.rules() {
            let status = Command::new("iptables")
                .arg("-I")
                .args(&rule)
                .status()
                .unwrap();
            assert!(status.success(), "iptables -I {rule:?}");
        }
        blackhole
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        for rule in self.rules() {
            let _ = Command::new("iptables").arg("-D").args(&rule).status();
        }
    }
}

/// Writes of `old` received after the first write of anyone else: none may be.
fn overlapping(writes: &[(f64, String, String)], old: &str) -> Vec<String> {
    let Some(first_new) = writes
        .iter()
        .filter(|(_, from, _)| from != old)
        .map(|(at, _, _)| *at)
        .reduce(f64::min)
    else {
        return Vec::new();
    };
    writes
        .iter()
        .filter(|(at, from, _)| from == old && *at >= first_new)
        .map(|(at, _, what)| format!("{at:.3} {what}"))
        .collect()
}

/// The leader's API server traffic is blackholed: its renewals hang. It stops acting
/// within its renew deadline, by its own log before the follower's first write, and the
/// follower takes the Lease; no write of the old leader is received after the new one's
/// first. Then the Lease is deleted: its holder stops at once, and nobody creates it
/// again before a whole term has passed.
#[test]
fn one_leader_at_a_time_when_the_leader_is_cut_off_and_when_its_lease_is_deleted() {
    let cluster = RealCluster::get();
    let progress = Progress::start();
    let old = wait_until("a leader", Duration::from_secs(120), || holder(cluster));
    let old_ip = pod_ip(cluster, &old);
    let started = now_seconds() - 1.0;
    progress.say(&format!("leader {old} at {old_ip}; blackholing it"));
    let new = {
        let _blackhole = Blackhole::start(&old_ip);
        let new = wait_until(
            "the follower to take the Lease",
            Duration::from_secs(90),
            || holder(cluster).filter(|h| *h != old),
        );
        // Long enough for what the old leader sent to arrive if it could.
        std::thread::sleep(Duration::from_secs(3));
        new
    };
    progress.say(&format!("{new} leads; the blackhole lifted"));
    // The old leader, cut off, stopped and restarts; whatever it had in flight is
    // delivered or dropped by now.
    std::thread::sleep(Duration::from_secs(5));
    let taken = writes(cluster, started);
    let new_ip = pod_ip(cluster, &new);
    assert!(
        taken.iter().any(|(_, from, _)| *from == new_ip),
        "no write of the new leader {new} ({new_ip}) in the audit log: {}",
        cluster.rigger_state()
    );
    let overlap = overlapping(&taken, &old_ip);
    assert!(
        overlap.is_empty(),
        "writes of the old leader {old} received after the new leader's first: {overlap:#?}"
    );
    // By its own account, the old leader stopped before the new one's first write.
    let first_new = taken
        .iter()
        .filter(|(_, from, _)| *from == new_ip)
        .map(|(at, _, _)| *at)
        .reduce(f64::min)
        .unwrap();
    let previous = cluster.kubectl(&["-n", "rigger-system", "logs", &old, "--previous"]);
    let stopped = String::from_utf8_lossy(&previous.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["message"] == "leadership lost")
        .and_then(|line| fractional_seconds(line["timestamp"].as_str()?));
    let stopped = stopped.unwrap_or_else(|| {
        panic!(
            "the old leader {old} never said it lost the Lease: {}",
            String::from_utf8_lossy(&previous.stdout)
        )
    });
    assert!(
        stopped < first_new,
        "the old leader stopped at {stopped:.3}, after the new one's first write at {first_new:.3}"
    );
    progress.say(&format!(
        "the old leader stopped {:.1} s before the new one's first write",
        first_new - stopped
    ));

    // The Lease deleted: its holder stops at once; it is created again a term later.
    let deleted_at = now_seconds();
    cluster.kubectl_ok(&[
        "-n",
        "rigger-system",
        "delete",
        "lease",
        "rigger-controller",
    ]);
    let again = wait_until(
        "the Lease to be created again",
        Duration::from_secs(90),
        || holder(cluster),
    );
    let lease = cluster
        .get_json(&["-n", "rigger-system", "lease", "rigger-controller"])
        .unwrap();
    let created = epoch_seconds(&lease["metadata"]["creationTimestamp"]) as f64;
    assert!(
        created + 1.0 >= deleted_at + LEASE.as_secs_f64(),
        "the Lease was created again {:.1} s after it was deleted, within a term ({LEASE:?})",
        created - deleted_at
    );
    // The holder when it was deleted wrote nothing once anyone else wrote.
    let overlap = overlapping(&writes(cluster, deleted_at), &new_ip);
    assert!(
        overlap.is_empty(),
        "writes of {new}, the deleted Lease's holder, after another replica's first: {overlap:#?}"
    );
    progress.say(&format!(
        "the Lease came back {:.1} s after its deletion, held by {again}",
        created - deleted_at
    ));
    wait_until(
        "both controller replicas ready again",
        Duration::from_secs(120),
        || {
            let pods = cluster.get_json(&[
                "-n",
                "rigger-system",
                "pods",
                "-l",
                "app.kubernetes.io/name=rigger-controller",
            ])?;
            let items = pods["items"].as_array()?;
            (items.len() == 2
                && items
                    .iter()
                    .all(|p| p["status"]["containerStatuses"][0]["ready"] == true))
            .then_some(())
        },
    );
}
