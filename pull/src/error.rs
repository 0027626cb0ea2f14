//! What a pull reports when it fails: every error names the image.

use crate::reference::InvalidReference;
use crate::registry::credentials::CredentialsError;
use crate::registry::{RegistryError, hosts};
use crate::stack::unpack::UnpackError;
use crate::store::StoreError;

/// A blob's spool (the fetch stage's reorder buffer on disk) failed.
#[derive(Debug, thiserror::Error)]
#[error("spool {}: {action}: {source}", path.display())]
pub struct SpoolError {
    pub path: std::path::PathBuf,
    pub action: &'static str,
    #[source]
    pub source: std::io::Error,
}

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error(transparent)]
    InvalidReference(#[from] InvalidReference),
    #[error("registry hosts for {image}: {source}")]
    Hosts {
        image: String,
        source: hosts::HostsError,
    },
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{image}: {detail}")]
    Image { image: String, detail: String },
    #[error("{image}: {source}")]
    Store { image: String, source: StoreError },
    #[error("{image}: {source}")]
    Unpack { image: String, source: UnpackError },
    #[error("{image}: {source}")]
    Spool { image: String, source: SpoolError },
    #[error("{image}: {blob}: gave up after {attempts} attempts; last error: {last}")]
    Exhausted {
        image: String,
        blob: String,
        attempts: u32,
        last: String,
    },
    /// Refused before downloading: the image would take a filesystem past the threshold.
    #[error("{image}: {source}")]
    DiskGuard {
        image: String,
        source: crate::disk_guard::Refusal,
    },
}

impl PullError {
    /// The disk guard refused the pull (nothing was downloaded).
    pub fn is_disk_guard(&self) -> bool {
        matches!(self, Self::DiskGuard { .. })
    }

    /// Every error names the image; a transfer error alone names only the blob.
    pub(crate) fn naming(self, image: &str) -> Self {
        match self {
            Self::Registry(e @ RegistryError::Transfer { .. }) => Self::Image {
                image: image.to_owned(),
                detail: e.to_string(),
            },
            other => other,
        }
    }
}

/// ENOSPC, whether containerd (a gRPC message) or the agent (an io error) ran into it.
pub(crate) fn is_disk_full(error: &PullError) -> bool {
    error
        .to_string()
        .to_ascii_lowercase()
        .contains("no space left on device")
}
