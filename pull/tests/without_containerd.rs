//! The whole pipeline without a lab: an image of three layers pulled from a registry in
//! this process (the distribution API: manifests, blobs, byte ranges) into the in-memory
//! containerd, and what containerd would then hold checked — the image record, the
//! garbage-collection labels of containerd's own pull, the layer snapshots with their
//! chain IDs and parents, the files of each layer in its snapshot, and nothing left
//! behind (no lease, no ingest, no active snapshot).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::Arc;

use rigger_pull::containerd::memory::Memory;
use rigger_pull::stack::unpack::chain_ids;
use rigger_pull::{NoProgress, PullOptions, Puller};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A layer: a gzip'd tar of `files` (path, contents), and its diff ID.
fn layer(files: &[(&str, Vec<u8>)]) -> (Vec<u8>, String) {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        tar.append_data(&mut header, path, data.as_slice()).unwrap();
    }
    let raw = tar.into_inner().unwrap();
    let diff_id = digest(&raw);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    (gz.finish().unwrap(), diff_id)
}

/// Bytes that do not compress, so a layer's size is what it holds.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(..)).collect()
}

/// A registry of one repository, serving its blobs and manifests by name and digest.
struct Registry {
    address: String,
    /// GETs of each blob, by digest.
    blob_requests: Arc<std::sync::Mutex<HashMap<String, usize>>>,
}

impl Registry {
    fn fetched(&self, digest: &str) -> usize {
        self.blob_requests
            .lock()
            .unwrap()
            .get(digest)
            .copied()
            .unwrap_or(0)
    }
}

impl Registry {
    async fn start(repository: &str, blobs: HashMap<String, Vec<u8>>, manifest: Vec<u8>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let manifest_digest = digest(&manifest);
        let blobs = Arc::new(blobs);
        let manifest = Arc::new(manifest);
        let repository = repository.to_owned();
        let blob_requests: Arc<std::sync::Mutex<HashMap<String, usize>>> = Arc::default();
        let counted = blob_requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (blobs, manifest, repository, manifest_digest, counted) = (
                    blobs.clone(),
                    manifest.clone(),
                    repository.clone(),
                    manifest_digest.clone(),
                    counted.clone(),
                );
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).to_lowercase();
                    let mut words = head.split_whitespace();
                    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                    let range: Option<(usize, Option<usize>)> = head
                        .lines()
                        .find_map(|l| l.strip_prefix("range: bytes="))
                        .and_then(|r| {
                            let (a, b) = r.trim().split_once('-')?;
                            Some((a.parse().ok()?, b.parse().ok()))
                        });
                    let (status, content_type, body, extra) = if path == "/v2/" {
                        ("200 OK", "text/plain", Vec::new(), String::new())
                    } else if path.starts_with(&format!("/v2/{repository}/manifests/")) {
                        (
                            "200 OK",
                            "application/vnd.oci.image.manifest.v1+json",
                            manifest.to_vec(),
                            format!("docker-content-digest: {manifest_digest}\r\n"),
                        )
                    } else if let Some(wanted) =
                        path.strip_prefix(&format!("/v2/{repository}/blobs/"))
                    {
                        *counted
                            .lock()
                            .unwrap()
                            .entry(wanted.to_owned())
                            .or_default() += 1;
                        match (blobs.get(wanted), range) {
                            (Some(blob), Some((start, end))) => {
                                let end = end.map_or(blob.len(), |e| (e + 1).min(blob.len()));
                                (
                                    "206 Partial Content",
                                    "application/octet-stream",
                                    blob[start.min(end)..end].to_vec(),
                                    format!(
                                        "content-range: bytes {start}-{}/{}\r\n",
                                        end.saturating_sub(1),
                                        blob.len()
                                    ),
                                )
                            }
                            (Some(blob), None) => (
                                "200 OK",
                                "application/octet-stream",
                                blob.clone(),
                                String::new(),
                            ),
                            (None, _) => ("404 Not Found", "text/plain", Vec::new(), String::new()),
                        }
                    } else {
                        ("404 Not Found", "text/plain", Vec::new(), String::new())
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                    if method != "head" {
                        let _ = stream.write_all(&body).await;
                    }
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self {
            address,
            blob_requests,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_is_pulled_without_a_lab_as_containerd_would_hold_it() {
    // Three layers: small; bigger than a range (so ranges may be used); and one that
    // removes a file of the first (a whiteout) and replaces another.
    let layers = [
        layer(&[
            ("etc/motd", b"hello\n".to_vec()),
            ("bin/tool", noise(1, 4096)),
        ]),
        layer(&[("data/big", noise(2, 5 << 20))]),
        layer(&[("etc/.wh.motd", Vec::new()), ("bin/tool", b"v2\n".to_vec())]),
    ];
    let diff_ids: Vec<String> = layers.iter().map(|(_, d)| d.clone()).collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": rigger_pull::media::Platform::host().architecture,
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "config": {},
    }))
    .unwrap();
    let mut blobs: HashMap<String, Vec<u8>> = HashMap::new();
    blobs.insert(digest(&config), config.clone());
    let mut layer_descriptors = Vec::new();
    for (data, _) in &layers {
        layer_descriptors.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest(data),
            "size": data.len(),
        }));
        blobs.insert(digest(data), data.clone());
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": layer_descriptors,
    }))
    .unwrap();
    let registry = Registry::start("test/app", blobs, manifest.clone()).await;

    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("certs.d");
    std::fs::create_dir_all(&hosts).unwrap();
    let docker_config = dir.path().join("config.json");
    std::fs::write(&docker_config, "{}").unwrap();
    let containerd = Arc::new(Memory::new(&dir.path().join("containerd")));
    let options = PullOptions {
        namespace: "test".to_owned(),
        hosts_dir: hosts,
        spool_dir: dir.path().join("spool"),
        plain_http: true,
        docker_config: Some(docker_config),
        max_connections: 4,
        ..PullOptions::default()
    };
    let puller = Puller::on(containerd.clone(), options);
    let image = format!("{}/test/app:1", registry.address);
    let pulled = puller.pull(&image, Arc::new(NoProgress)).await.unwrap();
    assert_eq!(pulled.digest, digest(&manifest));
    for (data, _) in &layers {
        assert!(registry.fetched(&digest(data)) >= 1);
    }

    let held = containerd.held();
    // The image record, as containerd's pull names it.
    let record = &held.images[&("test".to_owned(), image.clone())];
    assert_eq!(record.target.digest, digest(&manifest));
    // The GC labels: the manifest keeps the config and the layers, the config the top
    // snapshot.
    let manifest_labels = &held.content[&("test".to_owned(), digest(&manifest))].labels;
    assert_eq!(
        manifest_labels["containerd.io/gc.ref.content.config"],
        digest(&config)
    );
    for (i, (data, _)) in layers.iter().enumerate() {
        assert_eq!(
            manifest_labels[&format!("containerd.io/gc.ref.content.l.{i}")],
            digest(data)
        );
        let layer_labels = &held.content[&("test".to_owned(), digest(data))].labels;
        assert_eq!(
            layer_labels["containerd.io/distribution.source.127.0.0.1"],
            "test/app"
        );
    }
    let chains = chain_ids(&diff_ids);
    let config_labels = &held.content[&("test".to_owned(), digest(&config))].labels;
    assert_eq!(
        config_labels["containerd.io/gc.ref.snapshot.overlayfs"],
        chains[2]
    );
    // One committed snapshot per layer, named by its chain ID, on its parent.
    let snapshot = |name: &str| {
        held.snapshots
            .get(&("test".to_owned(), "overlayfs".to_owned(), name.to_owned()))
            .unwrap_or_else(|| panic!("no snapshot {name}: {:#?}", held.snapshots.keys()))
    };
    for (i, chain) in chains.iter().enumerate() {
        let s = snapshot(chain);
        assert!(s.committed);
        assert_eq!(
            s.parent.as_deref(),
            i.checked_sub(1).map(|p| chains[p].as_str())
        );
        assert_eq!(s.labels["containerd.io/snapshot.ref"], *chain);
    }
    assert_eq!(held.snapshots.len(), 3, "{:#?}", held.snapshots.keys());
    // Each layer's own files in its snapshot, as overlayfs keeps them.
    let files = |i: usize, path: &str| std::fs::read(snapshot(&chains[i]).dir.join(path));
    assert_eq!(files(0, "etc/motd").unwrap(), b"hello\n");
    assert_eq!(files(1, "data/big").unwrap(), noise(2, 5 << 20));
    assert_eq!(files(2, "bin/tool").unwrap(), b"v2\n");
    // The whiteout: a character device 0/0 where the file was.
    let whiteout = std::fs::symlink_metadata(snapshot(&chains[2]).dir.join("etc/motd")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &whiteout.file_type()
    ));
    // Nothing left: the lease released, every ingest committed.
    assert!(held.leases.is_empty(), "{:?}", held.leases);
    assert!(held.ingests.is_empty(), "{:?}", held.ingests);

    // Pulled again: the layers are there, none is fetched anew (the config is read
    // again: it is how the pull learns the layers' diff IDs).
    let before: Vec<usize> = layers
        .iter()
        .map(|(d, _)| registry.fetched(&digest(d)))
        .collect();
    puller.pull(&image, Arc::new(NoProgress)).await.unwrap();
    let after: Vec<usize> = layers
        .iter()
        .map(|(d, _)| registry.fetched(&digest(d)))
        .collect();
    assert_eq!(before, after);
}
