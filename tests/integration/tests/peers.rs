//! Fleet distribution, the serving side: an agent with `peer_listen` serves the blobs of
//! an image it holds in containerd, over mTLS, to a node the controller granted — and
//! nothing to anyone else.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rigger_integration_tests::{
    Agent, Controller, Lab, TestNamespace, agent, assert_ok, free_port, unique_image, wait_until,
};
use rigger_proto::peer_grant::GrantSigner;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest as _, Sha256};

/// An HTTPS client as the node whose certificate files are given (none: no client
/// certificate), trusting `ca`, reaching `node-a` at `port` on loopback.
fn client(ca: &Path, identity: Option<(&Path, &Path)>, port: u16) -> reqwest::Client {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .resolve("node-a", ([127, 0, 0, 1], port).into())
        .build()
        .unwrap()
}

/// The digest the image's name points at in `ns`, and the blobs its manifest names.
fn image_and_layers(lab: &Lab, ns: &str, reference: &str) -> (String, Vec<String>) {
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

    let signer = GrantSigner::from_pem(&std::fs::read(&grant_key).unwrap()).unwrap();
    let grant = |node: &str, image: &str| {
        signer
            .sign(node, image, SystemTime::now(), Duration::from_secs(600))
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
    let token = grant("node-b", &top);
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
                .bearer_auth(grant("node-c", &top))
        ),
        Some(403)
    );
    let forger = GrantSigner::from_pem(
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)
            .unwrap()
            .serialize_pem()
            .as_bytes(),
    )
    .unwrap();
    let forged = forger
        .sign("node-b", &top, SystemTime::now(), Duration::from_secs(600))
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
