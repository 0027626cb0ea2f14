//! Stack: layers into containerd's snapshotter — applied while they download (staged
//! until the layer below is in, see [`unpack`]) or from the content store afterwards,
//! committed in order, bottom first.

pub mod decompress;
pub mod unpack;
pub mod unverified;

use oci_spec::image::Descriptor;

use self::unpack::UnpackError;
use crate::media;
use crate::store::Store;

/// How far the layers of one image are stacked in the snapshotter.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stack {
    /// Layers `0..unpacked` are committed snapshots.
    pub(crate) unpacked: usize,
    /// A layer failed: nothing above it will be stacked.
    pub(crate) failed: bool,
}

/// What a layer needs to be unpacked while it downloads.
#[derive(Debug, Clone)]
pub(crate) struct StreamPlan {
    /// Position of the layer, bottom first.
    pub(crate) index: usize,
    pub(crate) snapshotter: String,
    pub(crate) parent: Option<String>,
    pub(crate) chain_id: String,
    pub(crate) compression: media::Compression,
    pub(crate) diff_id: String,
}

/// Make sure a layer is in the snapshotter: unpacked while it downloaded (or by an
/// earlier pull), else now, from the content store.
pub(crate) async fn stack_layer(
    store: &Store,
    snapshotter: &str,
    layer: &Descriptor,
    compression: media::Compression,
    diff_id: &str,
    parent: Option<&str>,
    chain_id: &str,
) -> Result<(), UnpackError> {
    if unpack::is_unpacked(store, snapshotter, chain_id).await? {
        return Ok(());
    }
    unpack::apply_from_store(
        store,
        snapshotter,
        &containerd_descriptor(layer),
        compression,
        diff_id,
        parent,
        chain_id,
    )
    .await
}

fn containerd_descriptor(d: &Descriptor) -> crate::containerd::Descriptor {
    crate::containerd::Descriptor {
        media_type: d.media_type().to_string(),
        digest: d.digest().to_string(),
        size: d.size(),
    }
}
