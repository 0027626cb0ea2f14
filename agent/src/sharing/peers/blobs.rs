//! Where the blobs served to peers come from: containerd's content store, read through
//! its API, and blobs still arriving, read from their ingest as far as containerd
//! confirmed writing them ([`super::ingest`]); behind a narrow trait so the serving side
//! is tested against a fake.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt as _};
use rigger_pull::arriving::{ArrivalState, Arriving, BytesAt};
use rigger_pull::containerd::{Containerd, Scope};
use rigger_runtime::describe_status;

/// Blobs this node holds or is fetching, by digest.
pub trait Blobs: Send + Sync + 'static {
    /// The blob's size; `None` when it is neither held nor arriving here.
    fn size<'a>(&'a self, digest: &'a str) -> BoxFuture<'a, Result<Option<u64>, String>>;

    /// Bytes `start..end` of the blob, in pieces (of a blob still arriving, each as it
    /// comes).
    fn read<'a>(
        &'a self,
        digest: &'a str,
        start: u64,
        end: u64,
    ) -> BoxFuture<'a, Result<BoxStream<'static, Result<Bytes, String>>, String>>;

    /// The blobs `image` reaches while a pull of it runs here (before containerd holds
    /// its manifests); `None` without such a pull.
    fn pulling(&self, image: &str) -> Option<Arc<BTreeSet<String>>>;

    /// Whether `digest` is arriving here with bytes another node sent (not verified
    /// yet): an answer that serves it says it relays them.
    fn relayed(&self, _digest: &str) -> bool {
        false
    }

    /// The digest this node resolved the image named `name` (containerd's record name)
    /// to: a pull of it running here, else containerd's image record; `None` when
    /// neither exists.
    fn image<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<String>, String>>;
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

/// containerd's content store, in one namespace, and the blobs this node's pulls
/// announce in `arriving`.
#[derive(Debug)]
pub struct ContainerdBlobs {
    containerd: Arc<dyn Containerd>,
    namespace: String,
    arriving: Arriving,
    /// Where containerd keeps content (its ingests among it), once asked.
    content_root: tokio::sync::OnceCell<Option<PathBuf>>,
}

impl ContainerdBlobs {
    pub fn new(containerd: Arc<dyn Containerd>, namespace: &str, arriving: Arriving) -> Self {
        Self {
            containerd,
            namespace: namespace.to_owned(),
            arriving,
            content_root: tokio::sync::OnceCell::new(),
        }
    }

    fn scope(&self) -> Scope<'_> {
        Scope {
            namespace: &self.namespace,
            lease: None,
        }
    }

    /// Bytes `start..end` of `digest` from its ingest, when a pull here writes it now
    /// and containerd's content root is visible to this process; `None` otherwise (it
    /// may have been committed meanwhile).
    async fn read_arriving(
        &self,
        digest: &str,
        start: u64,
        end: u64,
    ) -> Result<Option<BoxStream<'static, Result<Bytes, String>>>, String> {
        let Some(following) = self.arriving.follow(digest) else {
            return Ok(None);
        };
        if following.arrival.borrow().state != ArrivalState::Writing {
            return Ok(None);
        }
        let reference = match &following.bytes_at {
            BytesAt::File(file) => {
                return Ok(Some(super::ingest::read(
                    file.clone(),
                    following,
                    start,
                    end,
                )));
            }
            BytesAt::Nowhere => return Ok(None),
            BytesAt::Ingest(reference) => reference.clone(),
        };
        let root = self
            .content_root
            .get_or_try_init(|| async {
                let root = self
                    .containerd
                    .content_root()
                    .await
                    .map_err(|s| describe_status(&s))?;
                if root.is_none() {
                    tracing::info!("containerd does not say where its content store is: blobs still arriving are not served to peers");
                }
                Ok::<_, String>(root)
            })
            .await?;
        let Some(root) = root else {
            return Ok(None);
        };
        let (root, namespace) = (root.clone(), self.namespace.clone());
        let file =
            tokio::task::spawn_blocking(move || super::ingest::open(&root, &namespace, &reference))
                .await
                .map_err(|e| e.to_string())?;
        match file {
            Ok(file) => Ok(Some(super::ingest::read(
                Arc::new(file),
                following,
                start,
                end,
            ))),
            Err(error) => {
                tracing::debug!(%digest, %error, "cannot read the blob's ingest");
                Ok(None)
            }
        }
    }
}

impl Blobs for ContainerdBlobs {
    fn size<'a>(&'a self, digest: &'a str) -> BoxFuture<'a, Result<Option<u64>, String>> {
        Box::pin(async move {
            match self.containerd.content_info(self.scope(), digest).await {
                Ok(Some((size, _))) => Ok(Some(size)),
                Ok(None) => Ok(self
                    .arriving
                    .follow(digest)
                    .map(|following| following.arrival.borrow().size)),
                Err(status) => Err(describe_status(&status)),
            }
        })
    }

    fn pulling(&self, image: &str) -> Option<Arc<BTreeSet<String>>> {
        self.arriving.reached_by(image)
    }

    fn relayed(&self, digest: &str) -> bool {
        self.arriving.follow(digest).is_some_and(|following| {
            let arrival = following.arrival.borrow();
            arrival.relayed && arrival.state == ArrivalState::Writing
        })
    }

    fn image<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move {
            if let Some(digest) = self.arriving.resolved(name) {
                return Ok(Some(digest));
            }
            self.containerd
                .image_get(&self.namespace, name)
                .await
                .map(|record| record.map(|r| r.target.digest))
                .map_err(|s| describe_status(&s))
        })
    }

    fn read<'a>(
        &'a self,
        digest: &'a str,
        start: u64,
        end: u64,
    ) -> BoxFuture<'a, Result<BoxStream<'static, Result<Bytes, String>>, String>> {
        Box::pin(async move {
            if let Some(arriving) = self.read_arriving(digest, start, end).await? {
                return Ok(arriving);
            }
            let stream = self
                .containerd
                .content_read(self.scope(), digest, start, end.saturating_sub(start))
                .await
                .map_err(|s| describe_status(&s))?;
            Ok(stream
                .map(|piece| piece.map_err(|s| describe_status(&s)))
                .boxed())
        })
    }
}
