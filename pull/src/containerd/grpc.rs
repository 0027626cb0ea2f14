//! containerd itself, over its gRPC API on the node's socket: the one place of the pull
//! engine that speaks containerd's protocol. Every call carries the namespace header,
//! and the lease header when the scope has one.

use bytes::Bytes;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use containerd_client::services::v1::{
    AbortRequest, ApplyRequest, CreateImageRequest, CreateRequest, DeleteRequest,
    DeleteResourceRequest, GetImageRequest, Image, InfoRequest, ListRequest, ListResourcesRequest,
    ReadContentRequest, Resource, UpdateImageRequest, UpdateRequest, WriteAction,
    WriteContentRequest, WriteContentResponse,
};
use std::sync::Arc;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use rigger_runtime::Connection;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};

use super::{
    Call, Containerd, Descriptor, ImageRecord, Ingest, IngestMessage, Labels, LeaseResource, Mount,
    Scope,
};

/// containerd on the node's connection to its socket.
#[derive(Debug, Clone)]
pub struct Grpc {
    connection: Arc<Connection>,
}

impl Grpc {
    pub fn new(connection: Arc<Connection>) -> Self {
        Self { connection }
    }

    /// The channel, dialled now if containerd was away.
    async fn channel(&self) -> Result<Channel, Status> {
        self.connection.channel().await
    }

    /// containerd's introspection, as a status when it cannot be reached.
    async fn runtime(&self) -> Result<rigger_runtime::Runtime, Status> {
        self.connection
            .runtime()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))
    }

    /// `call`, telling the connection when it failed (containerd gone: dial again).
    fn watched<'a, T: Send + 'a>(
        &'a self,
        call: impl std::future::Future<Output = Result<T, Status>> + Send + 'a,
    ) -> Call<'a, T> {
        Box::pin(async move {
            let result = call.await;
            if let Err(status) = &result {
                self.connection.failed(status).await;
            }
            result
        })
    }
}

/// `message` for `scope`: its namespace and lease headers.
fn scoped<T>(message: T, scope: Scope<'_>) -> Result<Request<T>, Status> {
    let mut request = rigger_runtime::namespaced(message, scope.namespace)?;
    if let Some(lease) = scope.lease {
        let value = lease
            .parse()
            .map_err(|_| Status::invalid_argument("invalid lease id"))?;
        request.metadata_mut().insert("containerd-lease", value);
    }
    Ok(request)
}

fn unleased(namespace: &str) -> Scope<'_> {
    Scope {
        namespace,
        lease: None,
    }
}

fn to_containerd(d: &Descriptor) -> containerd_client::types::Descriptor {
    containerd_client::types::Descriptor {
        media_type: d.media_type.clone(),
        digest: d.digest.clone(),
        size: i64::try_from(d.size).unwrap_or(i64::MAX),
        annotations: std::collections::HashMap::new(),
    }
}

fn from_containerd(d: containerd_client::types::Descriptor) -> Descriptor {
    Descriptor {
        media_type: d.media_type,
        digest: d.digest,
        size: u64::try_from(d.size).unwrap_or(0),
    }
}

impl Containerd for Grpc {
    fn lease_create<'a>(&'a self, namespace: &'a str, id: &'a str, labels: Labels) -> Call<'a, ()> {
        self.watched(async move {
            let request = scoped(
                CreateRequest {
                    id: id.to_owned(),
                    labels,
                },
                unleased(namespace),
            )?;
            LeasesClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .create(request)
                .await?;
            Ok(())
        })
    }

    fn lease_delete<'a>(&'a self, namespace: &'a str, id: &'a str) -> Call<'a, ()> {
        self.watched(async move {
            let request = scoped(
                DeleteRequest {
                    id: id.to_owned(),
                    sync: false,
                },
                unleased(namespace),
            )?;
            LeasesClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .delete(request)
                .await?;
            Ok(())
        })
    }

    fn leases<'a>(&'a self, namespace: &'a str) -> Call<'a, Vec<String>> {
        self.watched(async move {
            let request = scoped(ListRequest { filters: vec![] }, unleased(namespace))?;
            Ok(LeasesClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .list(request)
                .await?
                .into_inner()
                .leases
                .into_iter()
                .map(|l| l.id)
                .collect())
        })
    }

    fn lease_resources<'a>(
        &'a self,
        namespace: &'a str,
        id: &'a str,
    ) -> Call<'a, Vec<LeaseResource>> {
        self.watched(async move {
            let request = scoped(
                ListResourcesRequest { id: id.to_owned() },
                unleased(namespace),
            )?;
            Ok(LeasesClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .list_resources(request)
                .await?
                .into_inner()
                .resources
                .into_iter()
                .map(|r| LeaseResource {
                    id: r.id,
                    kind: r.r#type,
                })
                .collect())
        })
    }

    fn lease_delete_resource<'a>(
        &'a self,
        namespace: &'a str,
        id: &'a str,
        resource: LeaseResource,
    ) -> Call<'a, ()> {
        self.watched(async move {
            let request = scoped(
                DeleteResourceRequest {
                    id: id.to_owned(),
                    resource: Some(Resource {
                        id: resource.id,
                        r#type: resource.kind,
                    }),
                },
                unleased(namespace),
            )?;
            LeasesClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .delete_resource(request)
                .await?;
            Ok(())
        })
    }

    fn content_info<'a>(
        &'a self,
        scope: Scope<'a>,
        digest: &'a str,
    ) -> Call<'a, Option<(u64, Labels)>> {
        self.watched(async move {
            let request = scoped(
                InfoRequest {
                    digest: digest.to_owned(),
                },
                scope,
            )?;
            match ContentClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .info(request)
                .await
            {
                Ok(response) => Ok(response
                    .into_inner()
                    .info
                    .map(|i| (u64::try_from(i.size).unwrap_or(0), i.labels))
                    .or(Some((0, Labels::new())))),
                Err(status) if status.code() == Code::NotFound => Ok(None),
                Err(status) => Err(status),
            }
        })
    }

    fn content_add_labels<'a>(
        &'a self,
        scope: Scope<'a>,
        digest: &'a str,
        labels: Labels,
    ) -> Call<'a, ()> {
        self.watched(async move {
            let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
            let request = scoped(
                UpdateRequest {
                    info: Some(containerd_client::services::v1::Info {
                        digest: digest.to_owned(),
                        labels,
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask { paths }),
                },
                scope,
            )?;
            ContentClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .update(request)
                .await?;
            Ok(())
        })
    }

    fn content_read<'a>(
        &'a self,
        scope: Scope<'a>,
        digest: &'a str,
        offset: u64,
        size: u64,
    ) -> Call<'a, futures::stream::BoxStream<'static, Result<Bytes, Status>>> {
        self.watched(async move {
            let request = scoped(
                ReadContentRequest {
                    digest: digest.to_owned(),
                    offset: i64::try_from(offset).unwrap_or(i64::MAX),
                    size: i64::try_from(size).unwrap_or(i64::MAX),
                },
                scope,
            )?;
            let stream = ContentClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .read(request)
                .await?
                .into_inner();
            Ok(stream
                .map(|piece| piece.map(|p| Bytes::from(p.data)))
                .boxed())
        })
    }

    fn ingest_open<'a>(
        &'a self,
        scope: Scope<'a>,
        reference: &'a str,
        total: u64,
        expected: &'a str,
    ) -> Call<'a, Box<dyn Ingest>> {
        self.watched(async move {
            let (tx, rx) = mpsc::channel::<WriteContentRequest>(16);
            let stat = WriteContentRequest {
                action: WriteAction::Stat as i32,
                r#ref: reference.to_owned(),
                total: i64::try_from(total).unwrap_or(i64::MAX),
                expected: expected.to_owned(),
                ..Default::default()
            };
            tx.send(stat)
                .await
                .map_err(|_| Status::unavailable("the write stream closed"))?;
            let request = scoped(ReceiverStream::new(rx), scope)?;
            let responses = ContentClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .write(request)
                .await?
                .into_inner();
            Ok(Box::new(GrpcIngest {
                reference: reference.to_owned(),
                tx,
                responses,
            }) as Box<dyn Ingest>)
        })
    }

    fn ingest_abort<'a>(&'a self, scope: Scope<'a>, reference: &'a str) -> Call<'a, ()> {
        self.watched(async move {
            let request = scoped(
                AbortRequest {
                    r#ref: reference.to_owned(),
                },
                scope,
            )?;
            ContentClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .abort(request)
                .await?;
            Ok(())
        })
    }

    fn content_root(&self) -> Call<'_, Option<std::path::PathBuf>> {
        self.watched(async move {
            let runtime = self.runtime().await?;
            runtime.content_root().await.map_err(|e| e.status)
        })
    }

    fn snapshotter_root<'a>(
        &'a self,
        snapshotter: &'a str,
    ) -> Call<'a, Option<std::path::PathBuf>> {
        self.watched(async move {
            let runtime = self.runtime().await?;
            runtime
                .snapshotter_root(snapshotter)
                .await
                .map_err(|e| e.status)
        })
    }

    fn image_get<'a>(&'a self, namespace: &'a str, name: &'a str) -> Call<'a, Option<ImageRecord>> {
        self.watched(async move {
            let request = scoped(
                GetImageRequest {
                    name: name.to_owned(),
                },
                unleased(namespace),
            )?;
            match ImagesClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .get(request)
                .await
            {
                Ok(response) => Ok(response.into_inner().image.and_then(|image| {
                    Some(ImageRecord {
                        name: image.name,
                        target: from_containerd(image.target?),
                        labels: image.labels,
                    })
                })),
                Err(status) if status.code() == Code::NotFound => Ok(None),
                Err(status) => Err(status),
            }
        })
    }

    fn image_put<'a>(&'a self, scope: Scope<'a>, image: ImageRecord) -> Call<'a, ()> {
        self.watched(async move {
            let image = Image {
                name: image.name,
                labels: image.labels,
                target: Some(to_containerd(&image.target)),
                created_at: None,
                updated_at: None,
            };
            let create = scoped(
                CreateImageRequest {
                    image: Some(image.clone()),
                    source_date_epoch: None,
                },
                scope,
            )?;
            match ImagesClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .create(create)
                .await
            {
                Ok(_) => Ok(()),
                Err(status) if status.code() == Code::AlreadyExists => {
                    let update = scoped(
                        UpdateImageRequest {
                            image: Some(image),
                            update_mask: None,
                            source_date_epoch: None,
                        },
                        scope,
                    )?;
                    ImagesClient::new(self.channel().await?)
                        .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                        .update(update)
                        .await?;
                    Ok(())
                }
                Err(status) => Err(status),
            }
        })
    }

    fn snapshot_prepare<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        key: &'a str,
        parent: Option<&'a str>,
        labels: Labels,
    ) -> Call<'a, Vec<Mount>> {
        self.watched(async move {
            let request = scoped(
                PrepareSnapshotRequest {
                    snapshotter: snapshotter.to_owned(),
                    key: key.to_owned(),
                    parent: parent.unwrap_or_default().to_owned(),
                    labels,
                },
                scope,
            )?;
            Ok(SnapshotsClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .prepare(request)
                .await?
                .into_inner()
                .mounts
                .into_iter()
                .map(|m| Mount {
                    kind: m.r#type,
                    source: m.source,
                    options: m.options,
                })
                .collect())
        })
    }

    fn snapshot_commit<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        name: &'a str,
        key: &'a str,
        labels: Labels,
    ) -> Call<'a, ()> {
        self.watched(async move {
            let request = scoped(
                CommitSnapshotRequest {
                    snapshotter: snapshotter.to_owned(),
                    name: name.to_owned(),
                    key: key.to_owned(),
                    labels,
                },
                scope,
            )?;
            SnapshotsClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .commit(request)
                .await?;
            Ok(())
        })
    }

    fn snapshot_exists<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        key: &'a str,
    ) -> Call<'a, bool> {
        self.watched(async move {
            let request = scoped(
                StatSnapshotRequest {
                    snapshotter: snapshotter.to_owned(),
                    key: key.to_owned(),
                },
                scope,
            )?;
            match SnapshotsClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .stat(request)
                .await
            {
                Ok(_) => Ok(true),
                Err(status) if status.code() == Code::NotFound => Ok(false),
                Err(status) => Err(status),
            }
        })
    }

    fn snapshot_remove<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        key: &'a str,
    ) -> Call<'a, ()> {
        self.watched(async move {
            let request = scoped(
                RemoveSnapshotRequest {
                    snapshotter: snapshotter.to_owned(),
                    key: key.to_owned(),
                },
                scope,
            )?;
            SnapshotsClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .remove(request)
                .await?;
            Ok(())
        })
    }

    fn diff_apply<'a>(
        &'a self,
        scope: Scope<'a>,
        layer: &'a Descriptor,
        mounts: Vec<Mount>,
    ) -> Call<'a, String> {
        self.watched(async move {
            let request = scoped(
                ApplyRequest {
                    diff: Some(to_containerd(layer)),
                    mounts: mounts
                        .into_iter()
                        .map(|m| containerd_client::types::Mount {
                            r#type: m.kind,
                            source: m.source,
                            options: m.options,
                            ..Default::default()
                        })
                        .collect(),
                    payloads: std::collections::HashMap::new(),
                    sync_fs: false,
                },
                scope,
            )?;
            Ok(DiffClient::new(self.channel().await?)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
                .apply(request)
                .await?
                .into_inner()
                .applied
                .map(|d| d.digest)
                .unwrap_or_default())
        })
    }
}

/// An ingest's `Content.Write` stream.
#[derive(Debug)]
struct GrpcIngest {
    reference: String,
    tx: mpsc::Sender<WriteContentRequest>,
    responses: Streaming<WriteContentResponse>,
}

impl Ingest for GrpcIngest {
    fn send(&mut self, message: IngestMessage) -> BoxFuture<'_, Result<(), ()>> {
        let request = match message {
            IngestMessage::Write { offset, data } => WriteContentRequest {
                action: WriteAction::Write as i32,
                r#ref: self.reference.clone(),
                offset: i64::try_from(offset).unwrap_or(i64::MAX),
                data,
                ..Default::default()
            },
            IngestMessage::Commit {
                total,
                offset,
                expected,
                labels,
            } => WriteContentRequest {
                action: WriteAction::Commit as i32,
                r#ref: self.reference.clone(),
                total: i64::try_from(total).unwrap_or(i64::MAX),
                expected,
                offset: i64::try_from(offset).unwrap_or(i64::MAX),
                labels,
                ..Default::default()
            },
        };
        Box::pin(async move { self.tx.send(request).await.map_err(drop) })
    }

    fn next(&mut self) -> Call<'_, Option<u64>> {
        Box::pin(async move {
            Ok(self
                .responses
                .message()
                .await?
                .map(|r| u64::try_from(r.offset).unwrap_or(0)))
        })
    }

    fn close(&mut self) {
        let (closed, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.tx, closed));
    }
}
