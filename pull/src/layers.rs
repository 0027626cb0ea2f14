//! The layers of one image: downloads start bottom first, a few at a time ([`fetch`]
//! unpacks each on the way), and each is stacked ([`stack`]) in order as soon as the
//! one below it is in.
//!
//! [`fetch`]: crate::fetch
//! [`stack`]: crate::stack

use std::collections::HashMap;
use std::sync::Arc;

use oci_spec::image::Descriptor;
use tokio::sync::Semaphore;

use crate::error::PullError;
use crate::fetch::Transfer;
use crate::media;
use crate::progress::ProgressEvent;
use crate::stack::{StreamPlan, stack_layer, unpack};

/// Layers downloading at once in one pull (bottom first). Each decompresses as it
/// arrives, so this also bounds the appliers running (and their memory, about 2 MiB each).
const LAYERS_AT_ONCE: usize = 8;

/// Fetch every layer and stack it. Layers start bottom first, a few downloading at a
/// time (the lower ones finish early); each is decompressed and applied while it
/// downloads (in a staging snapshot while the layers below are not in yet) and then
/// stacked in order. Returns the bytes fetched from registries.
pub(crate) async fn fetch_and_stack(
    transfer: &Transfer,
    snapshotter: &str,
    layers: &[Descriptor],
    diff_ids: &[String],
    chains: &[String],
) -> Result<u64, PullError> {
    let image_err = |detail: String| PullError::Image {
        image: transfer.image.clone(),
        detail,
    };
    // What each layer needs: its labels, and how to unpack it while it downloads.
    let mut jobs = Vec::with_capacity(layers.len());
    let mut compressions = Vec::with_capacity(layers.len());
    for (i, (layer, diff_id)) in layers.iter().zip(diff_ids).enumerate() {
        let labels = HashMap::from([("containerd.io/uncompressed".to_owned(), diff_id.clone())]);
        let plan = StreamPlan {
            index: i,
            snapshotter: snapshotter.to_owned(),
            parent: i.checked_sub(1).map(|p| chains[p].clone()),
            chain_id: chains[i].clone(),
            compression: media::layer_compression(layer.media_type().as_ref())
                .map_err(image_err)?,
            diff_id: diff_id.clone(),
        };
        compressions.push(plan.compression);
        jobs.push((layer.clone(), labels, plan));
    }
    // Layers start bottom first, a few downloading at a time: the lower ones finish
    // early. Each is decompressed and applied while it downloads (in a staging
    // snapshot while the layers below are not in yet) and then stacked in order.
    let (handles_tx, mut handles_rx) = tokio::sync::mpsc::unbounded_channel();
    let slots = Arc::new(Semaphore::new(LAYERS_AT_ONCE));
    let dispatcher_transfer = transfer.clone();
    let dispatcher = tokio::spawn(async move {
        for (layer, labels, plan) in jobs {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let t = dispatcher_transfer.clone();
            let handle = tokio::spawn(async move {
                // Unpacked and stored already: nothing to do for this layer.
                if unpack::is_unpacked(&t.store, &plan.snapshotter, &plan.chain_id)
                    .await
                    .unwrap_or(false)
                    && t.store
                        .blob_labels(layer.digest().as_ref())
                        .await
                        .ok()
                        .flatten()
                        .is_some()
                {
                    t.progress.event(ProgressEvent::BlobDone {
                        digest: layer.digest().to_string(),
                        skipped: true,
                    });
                    return Ok(0);
                }
                t.fetch_blob(
                    layer.digest().as_ref(),
                    layer.size(),
                    labels,
                    Some((plan, slot)),
                )
                .await
            });
            if handles_tx.send(handle).is_err() {
                return;
            }
        }
    });
    let mut bytes_downloaded = 0u64;
    let mut failure = None;
    for (i, layer) in layers.iter().enumerate() {
        // In order: layer i is stacked while later layers still download.
        let Some(download) = handles_rx.recv().await else {
            failure.get_or_insert(image_err("layer dispatch stopped".to_owned()));
            break;
        };
        let outcome = match download.await {
            Ok(outcome) => outcome,
            Err(join) => Err(image_err(format!("layer task failed: {join}"))),
        };
        let stacked = match outcome {
            Ok(n) if failure.is_none() => {
                bytes_downloaded += n;
                let parent = i.checked_sub(1).map(|p| chains[p].as_str());
                stack_layer(
                    &transfer.store,
                    snapshotter,
                    layer,
                    compressions[i],
                    &diff_ids[i],
                    parent,
                    &chains[i],
                )
                .await
                .inspect(|()| {
                    transfer.progress.event(ProgressEvent::LayerUnpacked {
                        digest: layer.digest().to_string(),
                    });
                })
                .map_err(|source| PullError::Unpack {
                    image: transfer.image.clone(),
                    source,
                })
            }
            Ok(_) => continue,
            Err(e) => Err(e),
        };
        match stacked {
            Ok(()) => transfer.mark_unpacked(i),
            Err(e) => {
                // Layers staged above this one stop waiting for it.
                transfer.mark_failed();
                failure.get_or_insert(e);
            }
        }
    }
    let _ = dispatcher.await;
    if let Some(e) = failure {
        return Err(e);
    }

    Ok(bytes_downloaded)
}
