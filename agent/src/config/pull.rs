//! How the agent pulls (`namespace`, `registry_config`, the node's connection, rate and
//! image limits, the disk guard, where blobs are written): checked before anything runs.

use std::path::{Path, PathBuf};

use rigger_daemon::config::{ConfigError, Setting};

use super::bytes;

/// How the agent pulls images for the controller's tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSettings {
    pub namespace: String,
    pub registry_config: PathBuf,
    pub max_connections: usize,
    pub limit_rate: Option<u64>,
    pub max_document_size: u64,
    pub max_parallel_image_pulls: Option<usize>,
    pub image_fs_threshold_percent: u8,
    /// Big blobs written beside containerd's store (else every byte through its API).
    pub write_content_directly: bool,
}

impl PullSettings {
    /// How the agent's pulls (tasks and pods) run, their spool under `state_dir`.
    pub fn pull_options(&self, state_dir: &Path) -> rigger_pull::PullOptions {
        rigger_pull::PullOptions {
            namespace: self.namespace.clone(),
            hosts_dir: self.registry_config.clone(),
            spool_dir: state_dir.join("spool"),
            max_connections: self.max_connections,
            limit_rate: self.limit_rate,
            max_document_size: self.max_document_size,
            max_parallel_images: self.max_parallel_image_pulls,
            image_fs_threshold_percent: Some(self.image_fs_threshold_percent),
            write_content_directly: self.write_content_directly,
            ..rigger_pull::PullOptions::default()
        }
    }
}

/// The pull settings as given (flag, environment or file), before validation.
pub(super) struct PullArgs {
    pub namespace: Option<String>,
    pub registry_config: Option<PathBuf>,
    pub max_connections: Option<usize>,
    pub limit_rate: Option<String>,
    pub max_document_size: Option<String>,
    pub max_parallel_image_pulls: Option<usize>,
    pub image_fs_threshold_percent: Option<u8>,
    pub through_content_api: bool,
}

/// Validate the pull settings, naming the first bad one.
pub(super) fn resolve(args: PullArgs) -> Result<PullSettings, ConfigError> {
    let namespace = args
        .namespace
        .unwrap_or_else(|| rigger_runtime::CRI_NAMESPACE.to_owned());
    if namespace.is_empty()
        || !namespace
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(NAMESPACE.invalid(format!(
            "{namespace:?} is not a containerd namespace (letters, digits, '-', '_', '.')"
        )));
    }
    let registry_config = args
        .registry_config
        .unwrap_or_else(|| PathBuf::from(rigger_pull::registry::hosts::DEFAULT_HOSTS_DIR));
    let max_connections = args
        .max_connections
        .unwrap_or(rigger_pull::DEFAULT_MAX_CONNECTIONS);
    if max_connections == 0 {
        return Err(MAX_CONNECTIONS.invalid("must be at least 1"));
    }
    let limit_rate = bytes(LIMIT_RATE, args.limit_rate)?;
    if limit_rate == Some(0) {
        return Err(LIMIT_RATE.invalid("must be more than 0"));
    }
    let max_document_size = bytes(MAX_DOCUMENT_SIZE, args.max_document_size)?
        .unwrap_or(rigger_pull::registry::DEFAULT_MAX_DOCUMENT_SIZE);
    if !rigger_pull::registry::MAX_DOCUMENT_SIZE_RANGE.contains(&max_document_size) {
        return Err(MAX_DOCUMENT_SIZE.invalid("must be between 64KiB and 1GiB"));
    }
    let max_parallel_image_pulls = args.max_parallel_image_pulls;
    if max_parallel_image_pulls.is_some_and(|n| !(1..=1024).contains(&n)) {
        return Err(MAX_PARALLEL_IMAGE_PULLS
            .invalid("must be between 1 and 1024 (leave it out for no limit)"));
    }
    let image_fs_threshold_percent = args
        .image_fs_threshold_percent
        .unwrap_or(rigger_pull::disk_guard::DEFAULT_THRESHOLD_PERCENT);
    if !(1..=100).contains(&image_fs_threshold_percent) {
        return Err(IMAGE_FS_THRESHOLD_PERCENT.invalid("must be between 1 and 100"));
    }
    Ok(PullSettings {
        namespace,
        registry_config,
        max_connections,
        limit_rate,
        max_document_size,
        max_parallel_image_pulls,
        image_fs_threshold_percent,
        write_content_directly: !args.through_content_api,
    })
}

const NAMESPACE: Setting = Setting {
    key: "namespace",
    flag: "--namespace",
    env: "RIGGER_AGENT_NAMESPACE",
};
const MAX_CONNECTIONS: Setting = Setting {
    key: "max_connections",
    flag: "--max-connections",
    env: "RIGGER_AGENT_MAX_CONNECTIONS",
};
const LIMIT_RATE: Setting = Setting {
    key: "limit_rate",
    flag: "--limit-rate",
    env: "RIGGER_AGENT_LIMIT_RATE",
};
const MAX_DOCUMENT_SIZE: Setting = Setting {
    key: "max_document_size",
    flag: "--max-document-size",
    env: "RIGGER_AGENT_MAX_DOCUMENT_SIZE",
};
const MAX_PARALLEL_IMAGE_PULLS: Setting = Setting {
    key: "max_parallel_image_pulls",
    flag: "--max-parallel-image-pulls",
    env: "RIGGER_AGENT_MAX_PARALLEL_IMAGE_PULLS",
};
const IMAGE_FS_THRESHOLD_PERCENT: Setting = Setting {
    key: "image_fs_threshold_percent",
    flag: "--image-fs-threshold-percent",
    env: "RIGGER_AGENT_IMAGE_FS_THRESHOLD_PERCENT",
};
