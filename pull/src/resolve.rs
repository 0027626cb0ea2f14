//! Resolve: from a reference to the documents of one image, each checked against its
//! digest — the registry's endpoints and credentials, the top document (index or
//! manifest), the platform's manifest, and the image config.

use std::sync::Arc;

use oci_client::Reference;
use oci_spec::image::{Descriptor, ImageConfiguration, ImageManifest};

use crate::digest::verify_digest;
use crate::error::PullError;
use crate::fetch::Transfer;
use crate::media::{self, Platform};
use crate::options::PullOptions;
use crate::peers::Peers;
use crate::registry::credentials::{credentials, secret_credentials};
use crate::registry::endpoint_client::Clients;
use crate::registry::{RawManifest, Registry, hosts};

/// The registry client for `reference`: its endpoints from `hosts.toml`, each with its
/// own credentials (the registry's go to the registry, a mirror's to the mirror), looked
/// for first in `docker_configs` (a job's pull secrets), then where the options say.
pub(crate) fn registry(
    reference: &Reference,
    docker_configs: &[String],
    options: &PullOptions,
    clients: &Clients,
) -> Result<Registry, PullError> {
    let registry_host = reference.registry().to_owned();
    let endpoints = hosts::endpoints(&options.hosts_dir, &registry_host, options.plain_http)
        .map_err(|source| PullError::Hosts {
            image: reference.whole(),
            source,
        })?;
    let credentials = endpoints
        .iter()
        .map(|endpoint| {
            let host = if endpoint.upstream {
                registry_host.as_str()
            } else {
                endpoint.authority()
            };
            match secret_credentials(host, docker_configs)? {
                Some(credential) => Ok(credential),
                None => credentials(host, options.docker_config.as_deref()),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Registry::new(
        reference.clone(),
        endpoints,
        credentials,
        options.stall_timeout,
        options.max_document_size,
        clients,
    )?)
}

/// The documents that name an image.
pub(crate) struct Manifests {
    /// The index the reference named, when it named one.
    pub(crate) index: Option<RawManifest>,
    /// The platform's manifest, as served.
    pub(crate) raw: RawManifest,
    pub(crate) manifest: ImageManifest,
}

impl Manifests {
    /// The digest the image's name points at (index or manifest).
    pub(crate) fn top_digest(&self) -> &str {
        self.index.as_ref().map_or(&self.raw.digest, |i| &i.digest)
    }
}

/// The top-level document (index or manifest), then the platform's manifest.
pub(crate) async fn manifests(
    registry: &Arc<Registry>,
    reference: &Reference,
    platform: &Platform,
    image: &str,
    peers: Option<&Peers>,
) -> Result<Manifests, PullError> {
    let image_err = |detail: String| image_error(image, detail);
    // Only the registry says what a name points at. When no registry host answers, a
    // reference pinned by digest may still be taken from the job's peers (the document
    // checked against that digest, and the image's other documents from them too:
    // `from_peers`); a tag may not, since a peer's word for it would choose the image.
    let (top, from_peers) = match registry.manifest(None).await {
        Ok(top) => (top, None),
        Err(error) if error.is_outage() => match (reference.digest(), peers) {
            (Some(pinned), Some(peers)) => {
                match peers
                    .manifest(reference.repository(), pinned, registry.max_document_size())
                    .await
                {
                    Some(top) => {
                        tracing::warn!(%image, digest = %top.digest, %error, "the registry did not answer; the pinned image from the job's peers");
                        (top, Some(peers))
                    }
                    None => return Err(error.into()),
                }
            }
            (None, Some(_)) => {
                return Err(image_err(format!(
                    "{error}; only the registry may say what a tag points at, so the job's peers cannot stand in for it: pin the image by digest (NAME@sha256:...) to take it from them while the registry is down"
                )));
            }
            _ => return Err(error.into()),
        },
        Err(error) => return Err(error.into()),
    };
    if let Some(pinned) = reference.digest()
        && pinned != top.digest
    {
        return Err(image_err(format!(
            "registry served {} for {pinned}",
            top.digest
        )));
    }
    verify_digest(&top.bytes, &top.digest).map_err(image_err)?;
    let (index, raw) = if media::is_index(&top.media_type) {
        let chosen = media::select_manifest(&top.bytes, platform).map_err(image_err)?;
        let chosen_digest = chosen.digest().to_string();
        let manifest = match from_peers {
            Some(peers) => peers
                .manifest(
                    reference.repository(),
                    &chosen_digest,
                    registry.max_document_size(),
                )
                .await
                .ok_or_else(|| {
                    image_err(format!(
                        "neither the registry nor the job's peers served {chosen_digest}"
                    ))
                })?,
            None => registry.manifest(Some(&chosen_digest)).await?,
        };
        verify_digest(&manifest.bytes, &manifest.digest).map_err(image_err)?;
        if manifest.digest != chosen.digest().to_string() {
            return Err(image_err(format!(
                "index names {} but the registry served {}",
                chosen.digest(),
                manifest.digest
            )));
        }
        (Some(top), manifest)
    } else {
        (None, top)
    };
    if media::is_index(&raw.media_type) {
        return Err(image_err(
            "an index inside an index is not an image".to_owned(),
        ));
    }
    let manifest = media::parse_manifest(&raw.bytes).map_err(image_err)?;
    Ok(Manifests {
        index,
        raw,
        manifest,
    })
}

/// The image config, as fetched and as read.
pub(crate) struct Config {
    pub(crate) descriptor: Descriptor,
    pub(crate) bytes: Vec<u8>,
    /// The uncompressed digest of each layer, bottom first.
    pub(crate) diff_ids: Vec<String>,
}

/// The config is small and tells the uncompressed digests (diff IDs) of the layers.
pub(crate) async fn config(
    transfer: &Transfer,
    manifests: &Manifests,
    options: &PullOptions,
) -> Result<Config, PullError> {
    let image_err = |detail: String| image_error(&transfer.image, detail);
    let descriptor = manifests.manifest.config().clone();
    if descriptor.size() > options.max_document_size {
        return Err(image_err(format!(
            "config is {} bytes, too big",
            descriptor.size()
        )));
    }
    let bytes = transfer.fetch_small(descriptor.digest().as_ref()).await?;
    verify_digest(&bytes, descriptor.digest().as_ref()).map_err(image_err)?;
    let config: ImageConfiguration = serde_json::from_slice(&bytes)
        .map_err(|e| image_err(format!("image config is invalid: {e}")))?;
    // A plain manifest has no platform list: containerd checks the config instead.
    if manifests.index.is_none() && !options.platform.matches_config(&config) {
        return Err(image_err(format!(
            "the image is for {}/{}, not {}",
            config.os(),
            config.architecture(),
            options.platform
        )));
    }
    let diff_ids: Vec<String> = config.rootfs().diff_ids().clone();
    let layers = manifests.manifest.layers().len();
    if diff_ids.len() != layers {
        return Err(image_err(format!(
            "manifest has {layers} layers but the config lists {} diff IDs",
            diff_ids.len()
        )));
    }
    Ok(Config {
        descriptor,
        bytes,
        diff_ids,
    })
}

fn image_error(image: &str, detail: String) -> PullError {
    PullError::Image {
        image: image.to_owned(),
        detail,
    }
}
