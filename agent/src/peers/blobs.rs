//! Where the blobs served to peers come from: containerd's content store, read through
//! its API (never its files), behind a narrow trait so the serving side is tested
//! against a fake.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::{InfoRequest, ReadContentRequest};
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt as _};
use rigger_runtime::{DEFAULT_CONNECT_TIMEOUT, Runtime};
use tonic::Code;
use tonic::transport::Channel;

/// Blobs this node holds, by digest.
pub trait Blobs: Send + Sync + 'static {
    /// The blob's size; `None` when it is not held here.
    fn size<'a>(&'a self, digest: &'a str) -> BoxFuture<'a, Result<Option<u64>, String>>;

    /// Bytes `start..end` of the blob, in pieces.
    fn read<'a>(
        &'a self,
        digest: &'a str,
        start: u64,
        end: u64,
    ) -> BoxFuture<'a, Result<BoxStream<'static, Result<Bytes, String>>, String>>;
}

/// A whole (small) blob: an image's index or manifest. `None` when it is not held here
/// or is bigger than `limit`.
pub async fn document(
    blobs: &dyn Blobs,
    digest: &str,
    limit: u64,
) -> Result<Option<Vec<u8>>, String> {
    let Some(size) = blobs.size(digest).await? else {
        return Ok(None);
    };
    if size > limit {
        return Ok(None);
    }
    let mut pieces = blobs.read(digest, 0, size).await?;
    let mut document = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    while let Some(piece) = pieces.next().await {
        document.extend_from_slice(&piece?);
        if document.len() as u64 > size {
            return Err(format!("{digest}: more bytes than its size"));
        }
    }
    Ok(Some(document))
}

/// containerd's content store, in one namespace, connected to when first needed (and
/// again after containerd went away).
#[derive(Debug)]
pub struct ContainerdBlobs {
    address: PathBuf,
    namespace: String,
    channel: tokio::sync::Mutex<Option<Channel>>,
}

impl ContainerdBlobs {
    pub fn new(address: &Path, namespace: &str) -> Self {
        Self {
            address: address.to_owned(),
            namespace: namespace.to_owned(),
            channel: tokio::sync::Mutex::default(),
        }
    }

    async fn channel(&self) -> Result<Channel, String> {
        let mut channel = self.channel.lock().await;
        if let Some(channel) = channel.as_ref() {
            return Ok(channel.clone());
        }
        let runtime = Runtime::connect(&self.address, DEFAULT_CONNECT_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        Ok(channel.insert(runtime.channel()).clone())
    }

    /// containerd failed a call in a way that says the connection is gone.
    async fn forget_channel(&self, status: &tonic::Status) {
        if status.code() == Code::Unavailable {
            *self.channel.lock().await = None;
        }
    }
}

impl Blobs for ContainerdBlobs {
    fn size<'a>(&'a self, digest: &'a str) -> BoxFuture<'a, Result<Option<u64>, String>> {
        Box::pin(async move {
            let request = rigger_runtime::namespaced(
                InfoRequest {
                    digest: digest.to_owned(),
                },
                &self.namespace,
            )
            .map_err(|s| s.message().to_owned())?;
            match ContentClient::new(self.channel().await?)
                .info(request)
                .await
            {
                Ok(info) => Ok(info
                    .into_inner()
                    .info
                    .and_then(|i| u64::try_from(i.size).ok())),
                Err(status) if status.code() == Code::NotFound => Ok(None),
                Err(status) => {
                    self.forget_channel(&status).await;
                    Err(rigger_runtime::describe_status(&status))
                }
            }
        })
    }

    fn read<'a>(
        &'a self,
        digest: &'a str,
        start: u64,
        end: u64,
    ) -> BoxFuture<'a, Result<BoxStream<'static, Result<Bytes, String>>, String>> {
        Box::pin(async move {
            let offset = i64::try_from(start).map_err(|e| e.to_string())?;
            let size = i64::try_from(end.saturating_sub(start)).map_err(|e| e.to_string())?;
            let request = rigger_runtime::namespaced(
                ReadContentRequest {
                    digest: digest.to_owned(),
                    offset,
                    size,
                },
                &self.namespace,
            )
            .map_err(|s| s.message().to_owned())?;
            let stream = match ContentClient::new(self.channel().await?)
                .read(request)
                .await
            {
                Ok(stream) => stream.into_inner(),
                Err(status) => {
                    self.forget_channel(&status).await;
                    return Err(rigger_runtime::describe_status(&status));
                }
            };
            Ok(stream
                .map(|piece| {
                    piece
                        .map(|p| Bytes::from(p.data))
                        .map_err(|s| rigger_runtime::describe_status(&s))
                })
                .boxed())
        })
    }
}
