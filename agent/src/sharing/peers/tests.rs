//! The peer endpoint over real TLS and HTTP, with blobs from a fake store: who gets
//! what, and who gets nothing.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{self, BoxStream, StreamExt as _};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rigger_proto::peer_grant::{GrantFor, GrantSigner, GrantVerifier};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::answer::Answerer;
use super::blobs::Blobs;
use rigger_pull::peers::{PeerIdentity, client_tls};

use super::serve::{bind, serve, server_config};

/// Blobs held in memory, by digest, images being pulled (the blobs each reaches), and
/// image names with the digest each points at.
struct FakeBlobs {
    held: Mutex<HashMap<String, Bytes>>,
    pulling: HashMap<String, Arc<BTreeSet<String>>>,
    names: HashMap<String, String>,
}

impl FakeBlobs {
    fn get(&self, digest: &str) -> Option<Bytes> {
        self.held.lock().unwrap().get(digest).cloned()
    }
}

impl Blobs for FakeBlobs {
    fn size<'a>(&'a self, digest: &'a str) -> BoxFuture<'a, Result<Option<u64>, String>> {
        Box::pin(async move { Ok(self.get(digest).map(|b| b.len() as u64)) })
    }

    fn pulling(&self, image: &str) -> Option<Arc<BTreeSet<String>>> {
        self.pulling.get(image).cloned()
    }

    fn image<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move { Ok(self.names.get(name).cloned()) })
    }

    fn read<'a>(
        &'a self,
        digest: &'a str,
        start: u64,
        end: u64,
    ) -> BoxFuture<'a, Result<BoxStream<'static, Result<Bytes, String>>, String>> {
        Box::pin(async move {
            let blob = self.get(digest).ok_or("not found")?;
            let part = blob.slice(start as usize..end as usize);
            // In small pieces, as containerd streams them.
            let pieces: Vec<_> = part
                .chunks(1000)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            Ok(stream::iter(pieces).boxed())
        })
    }
}

fn digest_of(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

struct Pki {
    ca_pem: String,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl Pki {
    fn new(name: &str) -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca = params.self_signed(&ca_key).unwrap();
        Self {
            ca_pem: ca.pem(),
            ca,
            ca_key,
        }
    }

    /// A node certificate as `rigger-controller certs` issues it: (cert PEM, key PEM).
    fn node(&self, name: &str, usages: &[ExtendedKeyUsagePurpose]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = usages.to_vec();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

const BOTH: &[ExtendedKeyUsagePurpose] = &[
    ExtendedKeyUsagePurpose::ClientAuth,
    ExtendedKeyUsagePurpose::ServerAuth,
];

struct Served {
    address: SocketAddr,
    ca_pem: String,
    signer: GrantSigner,
    /// The reference node-a holds the image under, and the image's digest.
    image: String,
    image_digest: String,
    layer: Bytes,
    layer_digest: String,
    other_digest: String,
    /// An image being pulled by node-a (its reference), and its one layer, which begins
    /// to arrive 300 ms after node-a starts.
    pulling_image: String,
    late_layer: Bytes,
    stop: CancellationToken,
}

/// Node "node-a" serving an image (a manifest and one layer) and a blob of another image.
async fn node_a(pki: &Pki, max_connections: usize) -> Served {
    let layer = Bytes::from((0..100_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    let layer_digest = digest_of(&layer);
    let other = Bytes::from_static(b"another image's layer");
    let other_digest = digest_of(&other);
    let config = Bytes::from_static(b"{}");
    let manifest = Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "config": {"digest": digest_of(&config), "size": 2},
            "layers": [{"digest": layer_digest, "size": layer.len()}],
        }))
        .unwrap(),
    );
    let image_digest = digest_of(&manifest);
    let image = "registry.example/team/app:1".to_owned();
    let late_layer = Bytes::from_static(b"a layer still arriving");
    let pulling_digest = digest_of(b"an image being pulled");
    let pulling_image = "registry.example/team/pulling:1".to_owned();
    let blobs = Arc::new(FakeBlobs {
        held: Mutex::new(HashMap::from([
            (image_digest.clone(), manifest),
            (digest_of(&config), config),
            (layer_digest.clone(), layer.clone()),
            (other_digest.clone(), other),
        ])),
        pulling: HashMap::from([(
            pulling_digest.clone(),
            Arc::new(BTreeSet::from([digest_of(&late_layer)])),
        )]),
        names: HashMap::from([
            (image.clone(), image_digest.clone()),
            (pulling_image.clone(), pulling_digest),
        ]),
    });
    let arrives = (blobs.clone(), late_layer.clone());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (blobs, layer) = arrives;
        blobs.held.lock().unwrap().insert(digest_of(&layer), layer);
    });
    let grant_key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let signer = GrantSigner::from_pem(
        grant_key.serialize_pem().as_bytes(),
        grant_key.public_key_pem().as_bytes(),
    )
    .unwrap();
    let verifier = GrantVerifier::from_pems([grant_key.public_key_pem().as_bytes()]).unwrap();
    let (_, grants) = watch::channel(Some(verifier));
    let answerer = Arc::new(Answerer::new(
        "node-a".to_owned(),
        blobs,
        grants,
        None,
        Arc::default(),
    ));
    let (cert_pem, key_pem) = pki.node("node-a", BOTH);
    let tls = server_config(&PeerIdentity {
        ca_pem: pki.ca_pem.clone().into_bytes(),
        cert_pem: cert_pem.into_bytes(),
        key_pem: key_pem.into_bytes(),
    })
    .unwrap();
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let address = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve(
        listener,
        tls,
        answerer,
        max_connections,
        stop.clone(),
    ));
    Served {
        address,
        ca_pem: pki.ca_pem.clone(),
        signer,
        image,
        image_digest,
        layer,
        layer_digest,
        other_digest,
        pulling_image,
        late_layer,
        stop,
    }
}

/// A client with `identity` (a certificate and key, as PEM; `None`: no client
/// certificate), trusting `served`'s CA, reaching node-a by its node name.
fn client(served: &Served, identity: Option<(String, String)>) -> reqwest::Client {
    let config = match identity {
        // As a node dials its peers.
        Some((cert, key)) => client_tls(&PeerIdentity {
            ca_pem: served.ca_pem.clone().into_bytes(),
            cert_pem: cert.into_bytes(),
            key_pem: key.into_bytes(),
        })
        .unwrap(),
        None => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(served.ca_pem.as_bytes()) {
                roots.add(ca.unwrap()).unwrap();
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
        .resolve("node-a", served.address)
        .build()
        .unwrap()
}

fn blob_url(served: &Served, digest: &str) -> String {
    format!(
        "https://node-a:{}/v2/any/repo/blobs/{digest}",
        served.address.port()
    )
}

fn grant(served: &Served, node: &str, image: &str) -> String {
    grant_from(served, node, "node-a", image)
}

fn grant_from(served: &Served, node: &str, server: &str, image: &str) -> String {
    let now = SystemTime::now();
    let what = GrantFor {
        node,
        server,
        image,
    };
    served
        .signer
        .sign(what, now, now + Duration::from_secs(600))
        .unwrap()
}

#[tokio::test]
async fn a_granted_node_gets_the_blobs_of_its_image_whole_or_in_ranges() {
    let pki = Pki::new("fleet CA");
    let served = node_a(&pki, 8).await;
    let node_b = client(&served, Some(pki.node("node-b", BOTH)));
    let token = grant(&served, "node-b", &served.image);
    let whole = node_b
        .get(blob_url(&served, &served.layer_digest))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(
        whole.headers()["docker-content-digest"],
        served.layer_digest.as_str()
    );
    assert_eq!(whole.bytes().await.unwrap(), served.layer);
    let part = node_b
        .get(blob_url(&served, &served.layer_digest))
        .bearer_auth(&token)
        .header("range", "bytes=1000-2999")
        .send()
        .await
        .unwrap();
    assert_eq!(part.status(), 206);
    assert_eq!(part.headers()["content-range"], "bytes 1000-2999/100000");
    assert_eq!(part.bytes().await.unwrap(), served.layer.slice(1000..3000));
    let past = node_b
        .get(blob_url(&served, &served.layer_digest))
        .bearer_auth(&token)
        .header("range", "bytes=100000-")
        .send()
        .await
        .unwrap();
    assert_eq!(past.status(), 416);
    let head = node_b
        .head(blob_url(&served, &served.layer_digest))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    // reqwest's content_length() is the body's (none for HEAD): the header is the answer.
    assert_eq!(head.status(), 200);
    assert_eq!(head.headers()["content-length"], "100000");
    served.stop.cancel();
}

/// node-a is still pulling an image (containerd holds none of its manifests yet): a
/// grant for it reaches the blobs the pull resolved, each served once its download
/// begins, and nothing else.
#[tokio::test]
async fn a_node_serves_an_image_it_is_still_pulling() {
    let pki = Pki::new("fleet CA");
    let served = node_a(&pki, 8).await;
    let node_b = client(&served, Some(pki.node("node-b", BOTH)));
    let token = grant(&served, "node-b", &served.pulling_image);
    let late = node_b
        .get(blob_url(&served, &digest_of(&served.late_layer)))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 200);
    assert_eq!(late.bytes().await.unwrap(), served.late_layer);
    let other = node_b
        .get(blob_url(&served, &served.layer_digest))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    served.stop.cancel();
}

#[tokio::test]
async fn nodes_without_a_grant_for_the_image_get_nothing() {
    let pki = Pki::new("fleet CA");
    let served = node_a(&pki, 8).await;
    let node_b = client(&served, Some(pki.node("node-b", BOTH)));
    let status = |request: reqwest::RequestBuilder| async move {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    };
    let url = blob_url(&served, &served.layer_digest);
    // No grant; a grant for another node; a grant signed by someone else.
    assert_eq!(status(node_b.get(&url)).await.0, 401);
    let for_c = grant(&served, "node-c", &served.image);
    let (code, reason) = status(node_b.get(&url).bearer_auth(for_c)).await;
    assert_eq!(code, 403, "{reason}");
    assert!(reason.contains("\"node-c\""), "{reason}");
    let forger_key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let forger = GrantSigner::from_pem(
        forger_key.serialize_pem().as_bytes(),
        forger_key.public_key_pem().as_bytes(),
    )
    .unwrap();
    let now = SystemTime::now();
    let forged = forger
        .sign(
            GrantFor {
                node: "node-b",
                server: "node-a",
                image: &served.image,
            },
            now,
            now + Duration::from_secs(600),
        )
        .unwrap();
    assert_eq!(status(node_b.get(&url).bearer_auth(forged)).await.0, 403);
    // A grant to fetch from another node is no use here.
    let elsewhere = grant_from(&served, "node-b", "node-c", &served.image);
    let (code, reason) = status(node_b.get(&url).bearer_auth(elsewhere)).await;
    assert_eq!(code, 403, "{reason}");
    assert!(reason.contains("\"node-c\""), "{reason}");
    // The image pinned by its digest reaches the same blobs.
    let pinned = format!("registry.example/team/app@{}", served.image_digest);
    let (code, reason) = status(
        node_b
            .get(&url)
            .bearer_auth(grant(&served, "node-b", &pinned)),
    )
    .await;
    assert_eq!(code, 200, "{reason}");
    // A grant for this image does not reach another image's blob, nor a manifest by tag.
    let token = grant(&served, "node-b", &served.image);
    let other = blob_url(&served, &served.other_digest);
    assert_eq!(status(node_b.get(&other).bearer_auth(&token)).await.0, 404);
    let by_tag = format!(
        "https://node-a:{}/v2/any/manifests/latest",
        served.address.port()
    );
    assert_eq!(status(node_b.get(&by_tag).bearer_auth(&token)).await.0, 404);
    // A grant for an image this node does not hold, or for no image reference at all.
    let unknown = grant(&served, "node-b", "registry.example/team/other:1");
    assert_eq!(status(node_b.get(&url).bearer_auth(unknown)).await.0, 404);
    let nonsense = grant(&served, "node-b", "Not A Reference");
    assert_eq!(status(node_b.get(&url).bearer_auth(nonsense)).await.0, 403);
    assert_eq!(status(node_b.post(&url).bearer_auth(&token)).await.0, 405);
    served.stop.cancel();
}

#[tokio::test]
async fn peers_without_a_node_certificate_of_the_fleet_are_refused_at_the_handshake() {
    let pki = Pki::new("fleet CA");
    let served = node_a(&pki, 8).await;
    let token = grant(&served, "node-b", &served.image);
    let url = blob_url(&served, &served.layer_digest);
    let outsider = Pki::new("another CA");
    for identity in [
        None,
        Some(outsider.node("node-b", BOTH)),
        // The fleet's CA, but a certificate not for client use.
        Some(pki.node("node-b", &[ExtendedKeyUsagePurpose::ServerAuth])),
    ] {
        let refused = client(&served, identity)
            .get(&url)
            .bearer_auth(&token)
            .send()
            .await;
        assert!(refused.is_err(), "{refused:?}");
    }
    served.stop.cancel();
}

/// A bare TCP connection from `source` to `served` (no TLS: it proves nothing).
async fn bare_connection(source: [u8; 4], served: &Served) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind((source, 0).into()).unwrap();
    socket.connect(served.address).await.unwrap()
}

#[tokio::test]
async fn bare_tcp_connections_take_no_serving_slot() {
    let pki = Pki::new("fleet CA");
    let served = node_a(&pki, 8).await;
    let identity = pki.node("node-b", BOTH);
    let token = grant(&served, "node-b", &served.image);
    let url = blob_url(&served, &served.layer_digest);
    // Anyone who reaches the port opens connections and never handshakes.
    let mut held = Vec::new();
    for _ in 0..12 {
        held.push(bare_connection([127, 0, 0, 2], &served).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // An honest peer is served at once, again and again.
    for _ in 0..3 {
        let response = client(&served, Some(identity.clone()))
            .get(&url)
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.bytes().await.unwrap(), served.layer);
    }
    drop(held);
    served.stop.cancel();
}

#[tokio::test]
async fn connections_past_the_limit_are_closed_after_their_handshake_and_the_rest_served() {
    let pki = Pki::new("fleet CA");
    let served = node_a(&pki, 1).await;
    let identity = pki.node("node-b", BOTH);
    let token = grant(&served, "node-b", &served.image);
    let url = blob_url(&served, &served.layer_digest);
    // One peer's connection, kept alive, takes the only slot.
    let first = client(&served, Some(identity.clone()));
    let response = first.get(&url).bearer_auth(&token).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
    let refused = client(&served, Some(identity.clone()))
        .get(&url)
        .bearer_auth(&token)
        .send()
        .await;
    assert!(refused.is_err(), "{refused:?}");
    drop(first);
    // The slot is free again once the first connection is gone.
    let mut served_again = false;
    for _ in 0..50 {
        let client = client(&served, Some(identity.clone()));
        if let Ok(response) = client.get(&url).bearer_auth(&token).send().await {
            assert_eq!(response.status(), 200);
            served_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served_again);
    served.stop.cancel();
}
