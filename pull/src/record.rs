//! Record: what containerd's own pull leaves besides layers — the metadata blobs with
//! the garbage-collection labels that keep an image's content and snapshots alive, and
//! the image records (in CRI's namespace also the two names CRI adds), so kubelet and
//! CRI see an ordinary pulled image.

use std::collections::HashMap;

use oci_client::Reference;
use rigger_runtime::CRI_NAMESPACE;

use crate::containerd::Descriptor;
use crate::error::PullError;
use crate::fetch::Transfer;
use crate::media;
use crate::resolve::{Config, Manifests};
use crate::store::StoreError;

/// Store the config, manifest and index with their GC labels, then the image records.
/// Returns the descriptor the image's name points at.
pub(crate) async fn record(
    transfer: &Transfer,
    reference: &Reference,
    manifests: &Manifests,
    config: &Config,
    chains: &[String],
    snapshotter: &str,
    namespace: &str,
) -> Result<Descriptor, PullError> {
    let name = transfer.image.as_str();
    let store = &transfer.store;
    let image_err = |detail: String| PullError::Image {
        image: name.to_owned(),
        detail,
    };
    let store_err = |source: StoreError| PullError::Store {
        image: name.to_owned(),
        source,
    };
    // Metadata blobs with the GC references containerd's pull writes.
    let top_chain = chains.last().cloned().unwrap_or_default();
    let config_labels = HashMap::from([(
        format!("containerd.io/gc.ref.snapshot.{}", snapshotter),
        top_chain,
    )]);
    transfer
        .put_small(
            config.descriptor.digest().as_ref(),
            &config.bytes,
            config_labels,
        )
        .await
        .map_err(store_err)?;
    let mut manifest_labels = HashMap::from([(
        "containerd.io/gc.ref.content.config".to_owned(),
        config.descriptor.digest().to_string(),
    )]);
    for (i, layer) in manifests.manifest.layers().iter().enumerate() {
        manifest_labels.insert(
            format!("containerd.io/gc.ref.content.l.{i}"),
            layer.digest().to_string(),
        );
    }
    transfer
        .put_small(&manifests.raw.digest, &manifests.raw.bytes, manifest_labels)
        .await
        .map_err(store_err)?;
    let target = match &manifests.index {
        Some(index) => {
            // containerd labels every manifest of the index by its position (not only
            // the platform it fetched): GC keeps what is there.
            let labels = media::index_manifests(&index.bytes)
                .map_err(image_err)?
                .into_iter()
                .enumerate()
                .map(|(i, digest)| (format!("containerd.io/gc.ref.content.m.{i}"), digest))
                .collect();
            transfer
                .put_small(&index.digest, &index.bytes, labels)
                .await
                .map_err(store_err)?;
            descriptor(&index.media_type, &index.digest, index.bytes.len())
        }
        None => descriptor(
            &manifests.raw.media_type,
            &manifests.raw.digest,
            manifests.raw.bytes.len(),
        ),
    };

    // Image records: the name, and in CRI's namespace also the two CRI adds.
    let cri = namespace == CRI_NAMESPACE;
    let labels = if cri {
        HashMap::from([("io.cri-containerd.image".to_owned(), "managed".to_owned())])
    } else {
        HashMap::new()
    };
    store
        .put_image(name, &target, &labels)
        .await
        .map_err(store_err)?;
    if cri {
        let by_digest = format!(
            "{}/{}@{}",
            reference.registry(),
            reference.repository(),
            target.digest
        );
        store
            .put_image(&by_digest, &target, &labels)
            .await
            .map_err(store_err)?;
        store
            .put_image(config.descriptor.digest().as_ref(), &target, &labels)
            .await
            .map_err(store_err)?;
    }
    Ok(target)
}

fn descriptor(media_type: &str, digest: &str, size: usize) -> Descriptor {
    Descriptor {
        media_type: media_type.to_owned(),
        digest: digest.to_owned(),
        size: size as u64,
    }
}
