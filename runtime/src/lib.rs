//! `rigger-runtime`: connecting to containerd's gRPC socket, which also serves CRI.
//!
//! Both the pull engine (`rigger-pull`) and the agent reach containerd through a
//! [`Runtime`]; [`socket`] finds the socket when it is not given.
//!
//! The failure a user most often meets is the first one: no socket, wrong socket, no
//! permission. Each gets its own one-line message naming the socket.

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use containerd_client::services::v1::PluginsRequest;
use containerd_client::services::v1::introspection_client::IntrospectionClient;
use containerd_client::services::v1::version_client::VersionClient;
use tonic::transport::Channel;
use tonic::{Request, Status};

mod connection;
pub mod listing;
pub mod socket;

pub use self::connection::Connection;

/// Where containerd listens on a standard install.
pub const DEFAULT_CONTAINERD_ADDRESS: &str = "/run/containerd/containerd.sock";

/// The containerd namespace CRI (and so kubelet) uses.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// How long the first call may take before the socket is declared unresponsive.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer read from containerd (its API and CRI): 16 MiB, as containerd's own
/// client and kubelet's CRI client allow. tonic's default, 4 MiB, fails the container
/// listing of a node with a few thousand containers.
pub const MAX_RECEIVE_MESSAGE_SIZE: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("no containerd socket at {path}: is containerd running? (set --address)")]
    NotFound { path: PathBuf },
    #[error("permission denied on {path}: run as root or as a member of the socket's group")]
    PermissionDenied { path: PathBuf },
    #[error("{path} is not a unix socket (set --address to containerd's socket)")]
    NotASocket { path: PathBuf },
    #[error("nothing is listening on {path} (connection refused; a stale socket?)")]
    Refused { path: PathBuf },
    #[error("cannot connect to {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} does not answer containerd's Version API ({reason}): is it containerd's socket?"
    )]
    NotContainerd { path: PathBuf, reason: String },
    #[error("{path} did not answer containerd's Version API within {}", humantime::format_duration(*.timeout))]
    Timeout { path: PathBuf, timeout: Duration },
}

/// A gRPC call to containerd or CRI failed.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {}", describe_status(.status))]
pub struct CallError {
    pub call: &'static str,
    pub status: Status,
}

impl CallError {
    pub fn new(call: &'static str, status: Status) -> Self {
        Self { call, status }
    }
}

/// `Status`'s own Display dumps metadata and details; users need the code and message.
pub fn describe_status(status: &Status) -> String {
    let message = status.message().trim();
    if message.is_empty() {
        format!("{:?}", status.code())
    } else {
        format!("{:?}: {message}", status.code())
    }
}

/// containerd's daemon version, as its Version API reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ContainerdVersion {
    pub version: String,
    pub revision: String,
}

/// A live connection to one containerd (and its CRI plugin, on the same socket).
#[derive(Debug, Clone)]
pub struct Runtime {
    address: PathBuf,
    channel: Channel,
    version: ContainerdVersion,
}

impl Runtime {
    /// Connect to the socket at `address` and check that containerd answers there.
    #[tracing::instrument(level = "debug", skip_all, fields(address = %address.display()))]
    pub async fn connect(address: &Path, timeout: Duration) -> Result<Self, ConnectError> {
        let path = address.to_owned();
        preflight(&path).await?;
        let handshake = async {
            let channel = containerd_client::connect(&path).await.map_err(|e| {
                ConnectError::NotContainerd {
                    path: path.clone(),
                    reason: rigger_daemon::error_chain(&e),
                }
            })?;
            let version = VersionClient::new(channel.clone())
                .max_decoding_message_size(crate::MAX_RECEIVE_MESSAGE_SIZE)
                .version(Request::new(()))
                .await
                .map_err(|status| ConnectError::NotContainerd {
                    path: path.clone(),
                    reason: describe_status(&status),
                })?
                .into_inner();
            Ok::<_, ConnectError>((channel, version))
        };
        let (channel, version) =
            tokio::time::timeout(timeout, handshake)
                .await
                .map_err(|_| ConnectError::Timeout {
                    path: path.clone(),
                    timeout,
                })??;
        tracing::debug!(version = %version.version, "connected to containerd");
        Ok(Self {
            address: path,
            channel,
            version: ContainerdVersion {
                version: version.version,
                revision: version.revision,
            },
        })
    }

    pub fn address(&self) -> &Path {
        &self.address
    }

    /// The gRPC channel; serves containerd's services and CRI alike. Cheap to clone.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub fn version(&self) -> &ContainerdVersion {
        &self.version
    }

    /// The directory of containerd's local content store (its plugin's `root` export),
    /// as containerd sees it; `None` when its content plugin does not say.
    pub async fn content_root(&self) -> Result<Option<PathBuf>, CallError> {
        self.plugin_root("type==io.containerd.content.v1").await
    }

    /// The directory of `snapshotter`'s snapshots (its plugin's `root` export), as
    /// containerd sees it; `None` when the plugin does not say.
    pub async fn snapshotter_root(&self, snapshotter: &str) -> Result<Option<PathBuf>, CallError> {
        self.plugin_root(&format!(
            "type==io.containerd.snapshotter.v1,id=={snapshotter}"
        ))
        .await
    }

    /// The `root` export of the first plugin `filter` selects.
    async fn plugin_root(&self, filter: &str) -> Result<Option<PathBuf>, CallError> {
        let plugins = IntrospectionClient::new(self.channel())
            .max_decoding_message_size(crate::MAX_RECEIVE_MESSAGE_SIZE)
            .plugins(Request::new(PluginsRequest {
                filters: vec![filter.to_owned()],
            }))
            .await
            .map_err(|s| CallError::new("list containerd plugins", s))?
            .into_inner()
            .plugins;
        Ok(plugins
            .iter()
            .find_map(|p| p.exports.get("root"))
            .map(PathBuf::from))
    }
}

/// A request to a namespaced containerd service.
pub fn namespaced<T>(message: T, namespace: &str) -> Result<Request<T>, Status> {
    let mut request = Request::new(message);
    let value = namespace
        .parse()
        .map_err(|_| Status::invalid_argument(format!("invalid namespace {namespace:?}")))?;
    request.metadata_mut().insert("containerd-namespace", value);
    Ok(request)
}

/// Classify the socket problems users hit before gRPC gets a chance to obscure them.
async fn preflight(path: &Path) -> Result<(), ConnectError> {
    let classify = |source: std::io::Error| match source.kind() {
        ErrorKind::NotFound => ConnectError::NotFound {
            path: path.to_owned(),
        },
        ErrorKind::PermissionDenied => ConnectError::PermissionDenied {
            path: path.to_owned(),
        },
        ErrorKind::ConnectionRefused => ConnectError::Refused {
            path: path.to_owned(),
        },
        _ => ConnectError::Io {
            path: path.to_owned(),
            source,
        },
    };
    let metadata = tokio::fs::metadata(path).await.map_err(classify)?;
    if !metadata.file_type().is_socket() {
        return Err(ConnectError::NotASocket {
            path: path.to_owned(),
        });
    }
    tokio::net::UnixStream::connect(path)
        .await
        .map(drop)
        .map_err(classify)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn missing_socket_is_named() {
        let err = Runtime::connect(Path::new("/nonexistent/c.sock"), DEFAULT_CONNECT_TIMEOUT)
            .await
            .unwrap_err();
        assert!(matches!(err, ConnectError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/c.sock"));
    }

    #[tokio::test]
    async fn regular_file_is_not_a_socket() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = Runtime::connect(file.path(), DEFAULT_CONNECT_TIMEOUT)
            .await
            .unwrap_err();
        assert!(matches!(err, ConnectError::NotASocket { .. }), "{err}");
    }

    #[tokio::test]
    async fn stale_socket_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let err = Runtime::connect(&path, DEFAULT_CONNECT_TIMEOUT)
            .await
            .unwrap_err();
        assert!(matches!(err, ConnectError::Refused { .. }), "{err}");
    }

    #[tokio::test]
    async fn silent_socket_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("silent.sock");
        // Accepts connections (the kernel does) but never speaks HTTP/2.
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = Runtime::connect(&path, Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ConnectError::Timeout { .. } | ConnectError::NotContainerd { .. }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn http1_socket_is_not_containerd() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("http.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            // Skip the preflight probe's connection and answer every other one like an HTTP/1 server.
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = stream.read(&mut buf).await;
                    let _ = stream
                        .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        let err = Runtime::connect(&path, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, ConnectError::NotContainerd { .. }), "{err}");
        assert!(!err.to_string().contains('\n'));
    }
}
