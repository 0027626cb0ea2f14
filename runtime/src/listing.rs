//! What containerd holds, listed: namespaces, image records, containers with their
//! task's state, and small blobs read whole. The agent's inventory reads the node
//! through these, so containerd's protocol stays in this crate.

use containerd_client::services::v1::{
    ListContainersRequest, ListImagesRequest, ListNamespacesRequest, ListTasksRequest,
    ReadContentRequest, containers_client::ContainersClient, content_client::ContentClient,
    images_client::ImagesClient, namespaces_client::NamespacesClient, tasks_client::TasksClient,
};
use containerd_client::types::v1::Status as TaskStatus;
use futures::StreamExt as _;

use crate::{CallError, Runtime, describe_status, namespaced};

/// An image record: its name and the descriptor it points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRecord {
    pub name: String,
    pub digest: String,
    pub media_type: String,
    pub size: i64,
}

/// A containerd container and the state of its task (`"no task"` without one).
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerRecord {
    pub id: String,
    pub image: String,
    pub created_at: Option<prost_types::Timestamp>,
    pub task_state: String,
}

impl Runtime {
    /// containerd's namespaces, sorted.
    pub async fn namespaces(&self) -> Result<Vec<String>, CallError> {
        let mut names: Vec<String> = NamespacesClient::new(self.channel())
            .max_decoding_message_size(crate::MAX_RECEIVE_MESSAGE_SIZE)
            .list(ListNamespacesRequest::default())
            .await
            .map_err(|s| CallError::new("list containerd namespaces", s))?
            .into_inner()
            .namespaces
            .into_iter()
            .map(|n| n.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// The image records of `namespace`; the second list names records without a
    /// target (skipped).
    pub async fn image_records(
        &self,
        namespace: &str,
    ) -> Result<(Vec<ImageRecord>, Vec<String>), CallError> {
        let request = namespaced(ListImagesRequest::default(), namespace)
            .map_err(|s| CallError::new("list images", s))?;
        let mut records = Vec::new();
        let mut targetless = Vec::new();
        for image in ImagesClient::new(self.channel())
            .max_decoding_message_size(crate::MAX_RECEIVE_MESSAGE_SIZE)
            .list(request)
            .await
            .map_err(|s| CallError::new("list images", s))?
            .into_inner()
            .images
        {
            match image.target {
                Some(target) => records.push(ImageRecord {
                    name: image.name,
                    digest: target.digest,
                    media_type: target.media_type,
                    size: target.size,
                }),
                None => targetless.push(image.name),
            }
        }
        Ok((records, targetless))
    }

    /// The whole blob `digest` of `namespace`, refused past `limit` bytes (whatever
    /// size it claims).
    pub async fn read_small(
        &self,
        namespace: &str,
        digest: &str,
        limit: u64,
    ) -> Result<Vec<u8>, String> {
        let request = namespaced(
            ReadContentRequest {
                digest: digest.to_owned(),
                offset: 0,
                size: 0,
            },
            namespace,
        )
        .map_err(|s| describe_status(&s))?;
        let mut stream = ContentClient::new(self.channel())
            .max_decoding_message_size(crate::MAX_RECEIVE_MESSAGE_SIZE)
            .read(request)
            .await
            .map_err(|s| format!("read {digest}: {}", describe_status(&s)))?
            .into_inner();
        let mut data = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|s| format!("read {digest}: {}", describe_status(&s)))?;
            data.extend_from_slice(&chunk.data);
            if data.len() as u64 > limit {
                return Err(format!("{digest} is bigger than {limit} bytes"));
            }
        }
        Ok(data)
    }

    /// The containers of `namespace` with their task's state (lowercase, as `ctr`
    /// prints it).
    pub async fn container_records(
        &self,
        namespace: &str,
    ) -> Result<Vec<ContainerRecord>, CallError> {
        let request = namespaced(ListContainersRequest::default(), namespace)
            .map_err(|s| CallError::new("list containers", s))?;
        let containers = ContainersClient::new(self.channel())
            .max_decoding_message_size(crate::MAX_RECEIVE_MESSAGE_SIZE)
            .list(request)
            .await
            .map_err(|s| CallError::new("list containers", s))?
            .into_inner()
            .containers;
        if containers.is_empty() {
            return Ok(Vec::new());
        }
        let request = namespaced(ListTasksRequest::default(), namespace)
            .map_err(|s| CallError::new("list tasks", s))?;
        let tasks = TasksClient::new(self.channel())
            .max_decoding_message_size(crate::MAX_RECEIVE_MESSAGE_SIZE)
            .list(request)
            .await
            .map_err(|s| CallError::new("list tasks", s))?
            .into_inner()
            .tasks;
        Ok(containers
            .into_iter()
            .map(|container| {
                let task_state = match tasks.iter().find(|t| t.id == container.id) {
                    None => "no task".to_owned(),
                    Some(t) => TaskStatus::try_from(t.status)
                        .map(|s| s.as_str_name().to_ascii_lowercase())
                        .unwrap_or_else(|_| "unknown".to_owned()),
                };
                ContainerRecord {
                    id: container.id,
                    image: container.image,
                    created_at: container.created_at,
                    task_state,
                }
            })
            .collect())
    }
}
