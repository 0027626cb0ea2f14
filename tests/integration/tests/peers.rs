//! Fleet distribution, the serving side: an agent with `peer_listen` serves the blobs of
//! an image it holds in containerd, over mTLS, to a node the controller granted — and
//! nothing to anyone else.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rigger_integration_tests::{
    Agent, Controller, Lab, LabNode, MountedSnapshot, Proxy, TestNamespace, agent, assert_ok,
    free_port, log_tail, plain_http_hosts_dir, top_chain_id, tree_listing, unique_image,
    wait_until,
};
use rigger_proto::peer_grant::{GrantFor, GrantSigner};
use rigger_pull::peers::{PeerIdentity, client_tls};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use sha2::{Digest as _, Sha256};

/// An HTTPS client as the node whose certificate files are given (none: no client
/// certificate), trusting `ca`, reaching `node-a` at `port` on loopback.
fn client(ca: &Path, identity: Option<(&Path, &Path)>, port: u16) -> reqwest::Client {
    let config = match identity {
        // As a node dials its peers.
        Some((cert, key)) => client_tls(&PeerIdentity {
            ca_pem: std::fs::read(ca).unwrap(),
            cert_pem: std::fs::read(cert).unwrap(),
            key_pem: std::fs::read(key).unwrap(),
        })
        .unwrap(),
        None => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(cert.unwrap()).unwrap();
            }
            rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth()
        }
    };
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .resolve("node-a", ([127, 0, 0, 1], port).into())
        .build()
        .unwrap()
}

/// The digest the image's name points at in `ns`, and the blobs its manifest names.
fn image_and_layers(lab: &Lab, ns: &str, reference: &str) -> (String, Vec<String>) {
    image_and_layers_on(lab.first_node(), ns, reference)
}

fn image_and_layers_on(node: &LabNode, ns: &str, reference: &str) -> (String, Vec<String>) {
    let lab = node;
    let listing = lab.ctr(ns, &["images", "ls"]);
    let top = listing
        .lines()
        .find(|l| l.starts_with(reference))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap()
        .to_owned();
    let manifest: serde_json::Value =
        serde_json::from_str(&lab.ctr(ns, &["content", "get", &top])).unwrap();
    let layers = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_owned())
        .collect();
    (top, layers)
}

/// A grant signer with the Ed25519 private key `pem`.
fn signer_of(pem: &[u8]) -> GrantSigner {
    let public = rcgen::KeyPair::from_pem(std::str::from_utf8(pem).unwrap())
        .unwrap()
        .public_key_pem();
    GrantSigner::from_pem(pem, public.as_bytes()).unwrap()
}

fn pull(lab: &Lab, ns: &str, reference: &str) {
    assert_ok(&agent(&[
        "pull",
        "--address",
        lab.containerd_address.to_str().unwrap(),
        "--registry-config",
        lab.hosts_dir.to_str().unwrap(),
        "--namespace",
        ns,
        reference,
    ]));
}

#[test]
fn a_node_serves_the_blobs_of_an_image_it_holds_to_granted_nodes_only() {
    let lab = Lab::get();
    let node = lab.first_node();
    let ns = TestNamespace::new("peers");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("controller");
    let grant_key = data.join("pki/peer-grant-key.pem");
    let controller =
        Controller::start_with(&data, &["--peer-grant-key", grant_key.to_str().unwrap()]);
    let image = lab.image(&unique_image("peers", 2, 300_000));
    let other = lab.image(&unique_image("peers-other", 1, 100_000));
    pull(lab, &ns.name, &image);
    pull(lab, &ns.name, &other);
    let (top, layers) = image_and_layers(lab, &ns.name, &image);
    let (_, other_layers) = image_and_layers(lab, &ns.name, &other);

    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let mut node_a = Agent::start(
        &controller,
        "node-a",
        &node.address,
        &node.hosts_dir,
        &ns.name,
        &state,
    );
    let port = free_port();
    node_a.restart_with_flags(&["--peer-listen", &format!("127.0.0.1:{port}")]);

    let signer = signer_of(&std::fs::read(&grant_key).unwrap());
    let grant = |node: &str, image: &str| {
        let now = SystemTime::now();
        let what = GrantFor {
            node,
            server: "node-a",
            image,
        };
        signer
            .sign(what, now, now + Duration::from_secs(600))
            .unwrap()
    };
    let (ca, cert_b, key_b) = controller.agent_certs("node-b");
    let node_b = client(&ca, Some((&cert_b, &key_b)), port);
    let url = |digest: &str| format!("https://node-a:{port}/v2/rigger-lab/any/blobs/{digest}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let status = |request: reqwest::RequestBuilder| {
        runtime.block_on(async move {
            match request.send().await {
                Ok(response) => Some(response.status().as_u16()),
                Err(_) => None,
            }
        })
    };

    // Once the agent has registered and holds the controller's grant key, every layer
    // of the image comes whole, and as ranges, with the bytes containerd holds.
    // A grant names the job's reference: node-a serves the image it resolved it to.
    let token = grant("node-b", &image);
    wait_until(
        "node-a to serve its first granted blob",
        Duration::from_secs(30),
        || (status(node_b.get(url(&layers[0])).bearer_auth(&token)) == Some(200)).then_some(()),
    );
    for layer in &layers {
        let body = runtime.block_on(async {
            let response = node_b
                .get(url(layer))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            response.bytes().await.unwrap()
        });
        assert_eq!(
            &format!("sha256:{}", hex::encode(Sha256::digest(&body))),
            layer
        );
        let part = runtime.block_on(async {
            let response = node_b
                .get(url(layer))
                .bearer_auth(&token)
                .header("range", "bytes=100-4195")
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 206);
            response.bytes().await.unwrap()
        });
        assert_eq!(part, body.slice(100..4196));
    }

    // Nothing for: no grant, a grant for another node, a grant of another key, another
    // image's layer, a tag; nor for a client without a node certificate of the fleet.
    assert_eq!(status(node_b.get(url(&layers[0]))), Some(401));
    assert_eq!(
        status(
            node_b
                .get(url(&layers[0]))
                .bearer_auth(grant("node-c", &image))
        ),
        Some(403)
    );
    // A grant to fetch from another node is no use here.
    let now = SystemTime::now();
    let elsewhere = GrantFor {
        node: "node-b",
        server: "node-c",
        image: &image,
    };
    let for_c = signer
        .sign(elsewhere, now, now + Duration::from_secs(600))
        .unwrap();
    assert_eq!(
        status(node_b.get(url(&layers[0])).bearer_auth(for_c)),
        Some(403)
    );
    // The image pinned by digest reaches the same blobs.
    let pinned = format!("{}@{top}", image.rsplit_once(':').unwrap().0);
    assert_eq!(
        status(
            node_b
                .get(url(&layers[0]))
                .bearer_auth(grant("node-b", &pinned))
        ),
        Some(200)
    );
    let forger = signer_of(
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .unwrap()
            .serialize_pem()
            .as_bytes(),
    );
    let forged = forger
        .sign(
            GrantFor {
                node: "node-b",
                server: "node-a",
                image: &image,
            },
            now,
            now + Duration::from_secs(600),
        )
        .unwrap();
    assert_eq!(
        status(node_b.get(url(&layers[0])).bearer_auth(forged)),
        Some(403)
    );
    assert_eq!(
        status(node_b.get(url(&other_layers[0])).bearer_auth(&token)),
        Some(404)
    );
    let by_tag = format!("https://node-a:{port}/v2/rigger-lab/any/manifests/1");
    assert_eq!(status(node_b.get(by_tag).bearer_auth(&token)), Some(404));
    let anonymous = client(&ca, None, port);
    assert_eq!(
        status(anonymous.get(url(&layers[0])).bearer_auth(&token)),
        None
    );
    let outsider = dir.path().join("outsider");
    rigger_integration_tests::controller_certs(&outsider, &["node-b"]);
    let outsider = client(
        &ca,
        Some((
            &outsider.join("agent-node-b.pem"),
            &outsider.join("agent-node-b-key.pem"),
        )),
        port,
    );
    assert_eq!(
        status(outsider.get(url(&layers[0])).bearer_auth(&token)),
        None
    );

    let log = std::fs::read_to_string(&node_a.log).unwrap();
    assert!(log.contains("serving blobs to peers"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// Two agents on the lab's two 1.6 nodes, both serving peers (unless `sharing` is off:
/// then neither serves and the controller has no grant key), images through a proxy
/// that logs every request.
struct Fleet {
    controller: Controller,
    proxy: Proxy,
    agents: Vec<Agent>,
    nodes: [LabNode; 2],
    ns: TestNamespace,
    _ns2: TestNamespace,
    _dir: tempfile::TempDir,
}

impl Fleet {
    fn start(test: &str, sharing: bool) -> Self {
        Self::start_with(test, sharing, &[])
    }

    /// [`Fleet::start`] with more `rigger-agent run` flags for both agents.
    fn start_with(test: &str, sharing: bool, agent_flags: &[&str]) -> Self {
        Self::start_behind(test, sharing, agent_flags, &[])
    }

    /// [`Fleet::start_with`], the registry behind a proxy run with `proxy_flags`.
    fn start_behind(test: &str, sharing: bool, agent_flags: &[&str], proxy_flags: &[&str]) -> Self {
        let lab = Lab::get();
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("controller");
        let grant_key = data.join("pki/peer-grant-key.pem");
        let flags = ["--peer-grant-key", grant_key.to_str().unwrap()];
        let controller = Controller::start_with(&data, if sharing { &flags } else { &[] });
        let proxy = Proxy::start(&serde_json::json!([]), proxy_flags);
        let hosts = plain_http_hosts_dir(dir.path(), &[proxy.address.as_str()]);
        // The lab's second 1.6 node, as a LabNode (the same ctr, its own socket).
        let node2 = LabNode {
            address: lab.node2_containerd_address.clone(),
            hosts_dir: lab.node2_hosts_dir.clone(),
            root: lab.node2_containerd_root.clone(),
            ..lab.first_node().clone()
        };
        let nodes = [lab.first_node().clone(), node2];
        let ns = TestNamespace::on(&nodes[0], test);
        let ns2 = TestNamespace::on(&nodes[1], test);
        let mut agents = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let name = format!("{test}-{}", i + 1);
            let state = dir.path().join(&name);
            std::fs::create_dir_all(&state).unwrap();
            let mut agent =
                Agent::start(&controller, &name, &node.address, &hosts, &ns.name, &state);
            let listen = format!("127.0.0.1:{}", free_port());
            let mut flags = agent_flags.to_vec();
            if sharing {
                flags.extend(["--peer-listen", listen.as_str()]);
            }
            if !flags.is_empty() {
                agent.restart_with_flags(&flags);
            }
            agents.push(agent);
        }
        for agent in &agents {
            // Said with the agent's and the controller's logs (an agent that could not
            // start, say, on a port taken since it was chosen).
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let ready = controller
                    .get_json(&["node", &agent.node])
                    .is_some_and(|n| n["status"]["conditions"][0]["status"] == "True");
                if ready {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "node {} not ready within 30 s\n--- agent\n{}\n--- controller\n{}",
                    agent.node,
                    log_tail(&agent.log, 30),
                    log_tail(&controller.log, 30)
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Self {
            controller,
            proxy,
            agents,
            nodes,
            ns,
            _ns2: ns2,
            _dir: dir,
        }
    }

    /// Run an ImagePullJob of `image` (a lab repository:tag) on `nodes` (indexes) to
    /// completion; the job as `get` shows it then.
    fn job(&self, name: &str, image: &str, nodes: &[usize]) -> serde_json::Value {
        self.start_job(name, image, nodes);
        self.wait_job(name, nodes.len())
    }

    /// Apply an ImagePullJob of `image` on `nodes` (indexes), all at once.
    fn start_job(&self, name: &str, image: &str, nodes: &[usize]) {
        let names: Vec<&str> = nodes
            .iter()
            .map(|i| self.agents[*i].node.as_str())
            .collect();
        self.controller.apply_ok(&format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: {name}\nspec:\n  image: {}/{image}\n  parallelism: {}\n  selector:\n    names: {}\n  completionPolicy:\n    type: Always\n  pullPolicy:\n    timeoutSeconds: 120\n",
            self.proxy.address,
            nodes.len(),
            serde_json::to_string(&names).unwrap()
        ));
    }

    fn wait_job(&self, name: &str, nodes: usize) -> serde_json::Value {
        let job = wait_until("the job to complete", Duration::from_secs(120), || {
            let job = self.controller.get_json(&["imagepulljob", name])?;
            (job["status"]["conditions"][0]["type"] == "Complete").then_some(job)
        });
        assert_eq!(job["status"]["succeeded"], nodes, "{job:#}");
        job
    }

    /// The registry's answers to GETs of `blob`, in order.
    fn registry_answers(&self, blob: &str) -> Vec<serde_json::Value> {
        self.proxy
            .requests()
            .into_iter()
            .filter(|r| {
                r["method"] == "GET" && r["path"].as_str().is_some_and(|p| p.ends_with(blob))
            })
            .collect()
    }

    /// How many times the registry sent `blob`.
    fn registry_sent(&self, blob: &str) -> usize {
        self.registry_answers(blob).len()
    }

    /// The layers of `image` as the first node holds it.
    fn layers(&self, image: &str) -> Vec<String> {
        self.layers_on(0, image)
    }

    /// The layers of `image` as node `index` holds it.
    fn layers_on(&self, index: usize, image: &str) -> Vec<String> {
        let reference = format!("{}/{image}", self.proxy.address);
        image_and_layers_on(&self.nodes[index], &self.ns.name, &reference).1
    }

    /// The job's entry for node `index`.
    fn entry<'a>(&self, job: &'a serde_json::Value, index: usize) -> &'a serde_json::Value {
        job["status"]["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == self.agents[index].node.as_str())
            .unwrap()
    }

    fn assert_no_panics(&self) {
        for agent in &self.agents {
            let log = std::fs::read_to_string(&agent.log).unwrap();
            assert!(!log.contains("panicked"), "{log}");
        }
    }
}

/// Two nodes serving peers, a job for both: one pulls from the registry, the other from
/// it; the registry sends every layer once.
#[test]
fn a_two_node_job_fetches_each_layer_from_the_registry_once() {
    let fleet = Fleet::start("peers-job", true);
    let image = unique_image("peers-job", 3, 400_000);
    let job = fleet.job("shared", &image, &[0, 1]);
    for layer in fleet.layers(&image) {
        assert_eq!(fleet.registry_sent(&layer), 1, "{layer}: {job:#}");
    }
    // One node seeded from the registry, the other fetched everything from it.
    let messages: Vec<&str> = (0..2)
        .map(|i| fleet.entry(&job, i)["message"].as_str().unwrap_or_default())
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("from peers, 0 B from the registry")),
        "{job:#}"
    );
    // The agents' metrics say the same: one served what the other received.
    let series = |agent: &Agent, name: &str| -> u64 {
        let (_, text) = rigger_integration_tests::http_get(&agent.health, "/metrics").unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0)
    };
    let served: u64 = fleet
        .agents
        .iter()
        .map(|a| series(a, "rigger_agent_peer_served_bytes_total"))
        .sum();
    let received: u64 = fleet
        .agents
        .iter()
        .map(|a| series(a, "rigger_agent_peer_received_bytes_total"))
        .sum();
    assert!(
        received > 0 && served == received,
        "served {served}, received {received}"
    );
    fleet.assert_no_panics();
}

/// A node whose copy of a layer is corrupt (its disk, or a lie) serves it; the node
/// fetching from it finds the digest wrong, names it, fetches the layer from the
/// registry, and ends with the image containerd's own pull makes.
#[test]
fn a_peer_sending_corrupt_bytes_is_named_and_the_image_is_still_containerds() {
    let fleet = Fleet::start("peers-corrupt", true);
    let repo_tag = unique_image("peers-corrupt", 2, 400_000);
    fleet.job("seed", &repo_tag, &[0]);
    let layers = fleet.layers(&repo_tag);
    // The first node's copy of the first layer, changed in place (same size).
    let blob = fleet.nodes[0]
        .root
        .join("io.containerd.content.v1.content/blobs/sha256")
        .join(layers[0].trim_start_matches("sha256:"));
    let original = std::fs::read(&blob).unwrap();
    let mut corrupt = original.clone();
    let _restore = Restore(blob.clone(), original);
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0xff;
    std::fs::write(&blob, &corrupt).unwrap();

    let job = fleet.job("all", &repo_tag, &[0, 1]);
    let message = fleet.entry(&job, 1)["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("did not match") && message.contains(&fleet.agents[0].node),
        "{job:#}"
    );
    // The corrupt layer came from the registry a second time; the good one did not.
    assert_eq!(fleet.registry_sent(&layers[0]), 2, "{job:#}");
    assert_eq!(fleet.registry_sent(&layers[1]), 1, "{job:#}");

    // The second node's image is the one containerd's own pull makes, file for file.
    let node = &fleet.nodes[1];
    let theirs = TestNamespace::on(node, "peers-corrupt-ctr");
    let hosts = node.hosts_dir.display().to_string();
    node.ctr(
        &theirs.name,
        &[
            "images",
            "pull",
            "--hosts-dir",
            &hosts,
            &Lab::get().image(&repo_tag),
        ],
    );
    let ids = rigger_integration_tests::fidelity::diff_ids(node, &theirs.name, &repo_tag);
    let chain = top_chain_id(&ids);
    let ours = MountedSnapshot::view_with(node, "overlayfs", &fleet.ns.name, &chain);
    let ctr = MountedSnapshot::view_with(node, "overlayfs", &theirs.name, &chain);
    let (a, b) = (tree_listing(&ours.path), tree_listing(&ctr.path));
    assert!(!a.is_empty());
    assert_eq!(a, b);
    fleet.assert_no_panics();
}

/// Puts a file's bytes back when dropped (the lab's containerd outlives the test).
struct Restore(std::path::PathBuf, Vec<u8>);

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, &self.1);
    }
}

/// Without a grant key and without peer_listen, a job behaves as before: every node
/// fetches every layer from the registry, and no task names peers.
#[test]
fn with_sharing_off_every_node_pulls_from_the_registry() {
    let fleet = Fleet::start("peers-off", false);
    let image = unique_image("peers-off", 2, 200_000);
    let job = fleet.job("plain", &image, &[0, 1]);
    for layer in fleet.layers(&image) {
        assert_eq!(fleet.registry_sent(&layer), 2, "{layer}: {job:#}");
    }
    for i in 0..2 {
        let message = fleet.entry(&job, i)["message"].as_str().unwrap_or_default();
        assert!(!message.contains("peers"), "{job:#}");
    }
    fleet.assert_no_panics();
}

/// The node a pull fetches from dies mid-transfer: the pull goes on from the registry
/// from where the peer's bytes ended, so the registry sends only what was missing.
#[test]
fn a_source_dying_mid_transfer_is_replaced_by_the_registry_for_what_is_missing() {
    // Peers serve 1 MiB/s: the transfer of the ~7 MiB layer is still under way when
    // its source is killed.
    let mut fleet = Fleet::start_with("peers-dead", true, &["--peer-upload-rate", "1MiB"]);
    let repo_tag = unique_image("peers-dead", 1, 8_000_000);
    fleet.job("seed", &repo_tag, &[0]);
    let layer = fleet.layers(&repo_tag).remove(0);
    fleet.start_job("all", &repo_tag, &[0, 1]);
    let second = fleet.agents[1].node.clone();
    wait_until(
        "the second node to fetch from its peer",
        Duration::from_secs(60),
        || {
            let job = fleet.controller.get_json(&["imagepulljob", "all"])?;
            let entry = job["status"]["nodes"]
                .as_array()?
                .iter()
                .find(|n| n["name"] == second.as_str())?
                .clone();
            (entry["phase"] == "Pulling" && entry["bytesDone"].as_u64()? > 1 << 20).then_some(())
        },
    );
    fleet.agents[0].kill();
    let job = fleet.wait_job("all", 2);

    let answers = fleet.registry_answers(&layer);
    assert_eq!(answers.len(), 2, "{answers:#?}");
    let size = answers[0]["sent"].as_u64().unwrap();
    let resumed_at: u64 = answers[1]["range"]
        .as_str()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            panic!("the registry was asked for the whole layer again: {answers:#?}")
        });
    assert!(resumed_at > 1 << 20, "{answers:#?}");
    assert_eq!(
        answers[1]["sent"].as_u64().unwrap(),
        size - resumed_at,
        "{answers:#?}"
    );
    let message = fleet.entry(&job, 1)["message"].as_str().unwrap_or_default();
    assert!(message.contains("from peers"), "{job:#}");
}

/// The registry is slow (2 MiB/s): the second node starts while the first still
/// downloads and fetches the layer from it as it arrives; the registry sends it once.
#[test]
fn a_node_fetches_from_a_node_still_downloading_the_image() {
    // A registry this slow (2 MiB/s for everyone) passes a layer still arriving on to a
    // follower in bursts: the range at the seed's write position gets a sixteenth of the
    // link. An operator with such a link lowers the peers' floor, as here.
    let fleet = Fleet::start_behind(
        "peers-arriving",
        true,
        &["--peer-min-rate", "64KiB"],
        &["--total-rate", "2MiB"],
    );
    let image = unique_image("peers-arriving", 1, 8_000_000);
    let job = fleet.job("together", &image, &[0, 1]);
    let layer = fleet.layers(&image).remove(0);
    // Once, whole or in ranges (the seed found the registry slow).
    let sent: u64 = fleet
        .registry_answers(&layer)
        .iter()
        .map(|a| a["sent"].as_u64().unwrap())
        .sum();
    let size = fleet.entry(&job, 0)["bytesTotal"].as_u64().unwrap();
    assert_eq!(sent, size, "{job:#}");
    let entries: Vec<&serde_json::Value> = (0..2).map(|i| fleet.entry(&job, i)).collect();
    let (seed, follower) = if entries[0]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("from peers")
    {
        (entries[1], entries[0])
    } else {
        (entries[0], entries[1])
    };
    assert!(
        follower["message"]
            .as_str()
            .unwrap_or_default()
            .contains("from peers, 0 B from the registry"),
        "{job:#}"
    );
    // The follower started before the seed had the image: it fetched bytes still
    // arriving (the layer takes the seed ~4 s).
    // (RFC 3339 times in UTC, written alike: they order as strings.)
    let time = |entry: &serde_json::Value, field: &str| entry[field].as_str().unwrap().to_owned();
    assert!(
        time(follower, "startTime") < time(seed, "completionTime"),
        "{job:#}"
    );
    fleet.assert_no_panics();
}

/// The first node dies while still downloading the image the second fetches from it:
/// the second goes on from the registry where the peer's bytes ended.
#[test]
fn a_source_dying_while_still_downloading_is_replaced_by_the_registry() {
    let mut fleet = Fleet::start_behind(
        "peers-arriving-dead",
        true,
        // As above: a slow registry link, a lower floor for peers.
        &["--peer-min-rate", "64KiB"],
        &["--total-rate", "1MiB"],
    );
    let image = unique_image("peers-arriving-dead", 1, 6_000_000);
    fleet.start_job("together", &image, &[0, 1]);
    // Whichever node seeds, the other fetches from it: kill the seed once the other has
    // some of the layer.
    let (seed, follower) = wait_until(
        "one node to fetch from the other",
        Duration::from_secs(60),
        || {
            let job = fleet.controller.get_json(&["imagepulljob", "together"])?;
            let nodes = job["status"]["nodes"].as_array()?.clone();
            let done = |n: &serde_json::Value| n["bytesDone"].as_u64().unwrap_or(0);
            let both_going = nodes.len() == 2 && nodes.iter().all(|n| done(n) > 500_000);
            both_going.then(|| {
                // The seed is ahead.
                let (a, b) = (&nodes[0], &nodes[1]);
                let (seed, follower) = if done(a) >= done(b) { (a, b) } else { (b, a) };
                (
                    seed["name"].as_str().unwrap().to_owned(),
                    follower["name"].as_str().unwrap().to_owned(),
                )
            })
        },
    );
    let index =
        |fleet: &Fleet, name: &str| fleet.agents.iter().position(|a| a.node == name).unwrap();
    let seed = index(&fleet, &seed);
    let follower_index = index(&fleet, &follower);
    fleet.agents[seed].kill();
    let entry = wait_until("the follower to finish", Duration::from_secs(90), || {
        let job = fleet.controller.get_json(&["imagepulljob", "together"])?;
        let entry = job["status"]["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == follower.as_str())?
            .clone();
        (entry["phase"] == "Succeeded").then_some(entry)
    });
    let message = entry["message"].as_str().unwrap_or_default();
    let log = std::fs::read_to_string(&fleet.agents[follower_index].log).unwrap();
    assert!(message.contains("from peers"), "{entry:#}\n{log}");
    // The registry sent the seed what it got, and the follower only what it lacked: the
    // layer less what the follower had from its peer, at most, beyond one copy.
    let layer = fleet.layers_on(follower_index, &image).remove(0);
    let sent: u64 = fleet
        .registry_answers(&layer)
        .iter()
        .map(|a| a["sent"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        sent < 2 * 6_000_000 - 500_000,
        "registry sent {sent}: {entry:#}"
    );
    let log = std::fs::read_to_string(&fleet.agents[follower_index].log).unwrap();
    assert!(!log.contains("panicked"), "{log}");
}

/// The registry goes down once one node holds the image: a job for both nodes completes,
/// the second node taking the image (its documents too) from the first.
/// With the registry down, a job whose image is pinned by digest goes on from the
/// node that holds it (every document checked against the pin); one by tag does not:
/// only the registry may say what a tag is, and the node says so.
#[test]
fn with_the_registry_down_a_pinned_image_comes_from_a_node_that_holds_it_and_a_tag_does_not() {
    let fleet = Fleet::start("peers-registry-down", true);
    let image = unique_image("peers-registry-down", 2, 300_000);
    fleet.job("first", &image, &[0]);
    let reference = format!("{}/{image}", fleet.proxy.address);
    let (top, _) = image_and_layers_on(&fleet.nodes[0], &fleet.ns.name, &reference);
    let repository = image.rsplit_once(':').unwrap().0;
    let pinned = format!("{repository}@{top}");
    fleet.job("first-pinned", &pinned, &[0]);
    fleet.proxy.set_faults(&serde_json::json!([
        {"path_contains": "/v2/", "action": {"status": 503}, "times": 1_000_000}
    ]));
    // By tag: the node without the image fails (the other holds it), saying why and
    // what to do.
    fleet.controller.apply_ok(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: by-tag\nspec:\n  image: {reference}\n  parallelism: 2\n  selector:\n    names: [{}, {}]\n  completionPolicy:\n    type: Always\n  pullPolicy:\n    backoffLimit: 0\n",
        fleet.agents[0].node, fleet.agents[1].node
    ));
    let job = wait_until("the tag's job to end", Duration::from_secs(60), || {
        let job = fleet.controller.get_json(&["imagepulljob", "by-tag"])?;
        (job["status"]["failed"] == 1).then_some(job)
    });
    let message = fleet.entry(&job, 1)["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("only the registry may say what a tag points at")
            && message.contains("pin the image by digest"),
        "{job:#}"
    );
    // Pinned: the image comes from the node that holds it, documents and all.
    let job = fleet.job("both", &pinned, &[0, 1]);
    fleet.proxy.set_faults(&serde_json::json!([]));
    let message = fleet.entry(&job, 1)["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("from peers, 0 B from the registry"),
        "{job:#}"
    );
    let pinned_reference = format!("{}/{pinned}", fleet.proxy.address);
    let second = image_and_layers_on(&fleet.nodes[1], &fleet.ns.name, &pinned_reference);
    assert_eq!(second.0, top);
    fleet.assert_no_panics();
}

/// kubelet's own pull (here `ctr`, through the same hosts.toml a node's CRI reads) of an
/// image a job put on the node, after the node lost it: containerd asks the agent's
/// mirror, which fetches the image from the node that holds it; the registry only
/// resolves the name. An image no job put on the node gets nothing from the mirror.
#[test]
fn containerd_pulls_through_the_mirror_from_the_node_that_holds_the_image() {
    let mut fleet = Fleet::start("peers-mirror", true);
    let mirror = format!("127.0.0.1:{}", free_port());
    fleet.agents[1].restart_with_flags(&["--mirror-listen", &mirror]);
    let ca = fleet.agents[1].state_dir.join("mirror/ca.pem");
    wait_until("the mirror's certificates", Duration::from_secs(30), || {
        ca.exists().then_some(())
    });
    let node = fleet.agents[1].node.clone();
    wait_until("the node to be ready", Duration::from_secs(30), || {
        let n = fleet.controller.get_json(&["node", &node])?;
        (n["status"]["conditions"][0]["status"] == "True").then_some(())
    });
    let image = unique_image("peers-mirror", 2, 300_000);
    fleet.job("both", &image, &[0, 1]);
    let layers = fleet.layers(&image);
    let reference = format!("{}/{image}", fleet.proxy.address);
    // The node loses the image (kubelet's image garbage collection).
    let second = &fleet.nodes[1];
    second.ctr(&fleet.ns.name, &["images", "rm", "--sync", &reference]);
    // containerd's hosts for the registry: the mirror first, for pulls only, over TLS
    // with the mirror's client certificate (the operator guide's hosts.toml).
    let dir = tempfile::tempdir().unwrap();
    rigger_integration_tests::mirror_client_hosts_dir(
        dir.path(),
        &fleet.proxy.address,
        &mirror,
        &fleet.agents[1].state_dir,
    );
    second.ctr(
        &fleet.ns.name,
        &[
            "images",
            "pull",
            "--hosts-dir",
            dir.path().to_str().unwrap(),
            &reference,
        ],
    );
    // Each layer left the registry once: for the job's first node.
    for layer in &layers {
        assert_eq!(fleet.registry_sent(layer), 1, "{layer}");
    }
    let (_, metrics) =
        rigger_integration_tests::http_get(&fleet.agents[1].health, "/metrics").unwrap();
    let served: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("rigger_agent_mirror_bytes_total ")?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    // The manifest, the config and both layers.
    assert!(served > 0, "{metrics}");
    assert!(
        metrics.contains("rigger_agent_mirror_requests_total{result=\"served\"} 4"),
        "{metrics}"
    );
    // An image no job put on this node: not on the mirror (containerd goes to the
    // registry), and never a tag.
    let other = format!("sha256:{}", "e".repeat(64));
    let as_containerd = rigger_integration_tests::mirror_client(&fleet.agents[1].state_dir);
    let get = |path: &str| {
        let url = format!("https://{mirror}{path}");
        let client = as_containerd.clone();
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(async move { client.get(url).send().await.map(|r| r.status().as_u16()) })
    };
    let ns = fleet.proxy.address.clone();
    assert_eq!(
        get(&format!("/v2/rigger-lab/x/manifests/{other}?ns={ns}")).unwrap(),
        404
    );
    assert_eq!(
        get(&format!("/v2/rigger-lab/x/manifests/latest?ns={ns}")).unwrap(),
        404
    );
    // Another repository than the job's, even for the job's own digest: nothing.
    let (top, _) = image_and_layers_on(&fleet.nodes[0], &fleet.ns.name, &reference);
    assert_eq!(
        get(&format!("/v2/rigger-lab/private/manifests/{top}?ns={ns}")).unwrap(),
        404
    );
    // Without the client certificate (any other process on the node): no answer at all.
    let anyone = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let refused = tokio::runtime::Runtime::new().unwrap().block_on(
        anyone
            .get(format!(
                "https://{mirror}/v2/rigger-lab/x/manifests/{top}?ns={ns}"
            ))
            .send(),
    );
    assert!(refused.is_err(), "{refused:?}");
    fleet.assert_no_panics();
}
