//! NodeImage objects, built when read: each node (as `get nodes` shows it, inventory
//! included) with the ImagePullJobs that include it (`rigger_api::node_image`).

use std::collections::HashMap;
use std::time::SystemTime;

use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::node::Node;
use rigger_api::node_image::node_image;
use rigger_proto::v1::Object;
use tonic::Status;

use super::{ControlService, ObjectName, store_status};

impl ControlService {
    /// Every node's NodeImage (or only `only`'s), sorted by node name, with its name.
    pub(super) async fn node_images(
        &self,
        only: Option<&str>,
    ) -> Result<Vec<(ObjectName, Object)>, Status> {
        let nodes: Vec<Node> = self
            .nodes
            .objects(SystemTime::now(), self.node_timeout)
            .into_iter()
            .filter(|n| only.is_none_or(|name| n["metadata"]["name"] == name))
            .filter_map(|n| serde_json::from_value(n).ok())
            .collect();
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        // Each job as `get` shows it: its status holds every node's entry.
        let mut jobs = Vec::new();
        for job in self
            .store
            .list_objects::<ImagePullJob>()
            .await
            .map_err(store_status)?
        {
            jobs.push(self.job_with_status(job).await?);
        }
        let mut by_node: HashMap<&str, Vec<_>> = HashMap::new();
        for job in &jobs {
            for entry in job.status.iter().flat_map(|s| &s.nodes) {
                by_node
                    .entry(entry.name.as_str())
                    .or_default()
                    .push((job, entry));
            }
        }
        let none = Vec::new();
        nodes
            .iter()
            .map(|node| {
                let pulls = by_node.get(node.metadata.name.as_str()).unwrap_or(&none);
                let image = node_image(node, pulls);
                let object = Object {
                    json: serde_json::to_string(&image)
                        .map_err(|e| Status::internal(e.to_string()))?,
                    revision: 0,
                };
                Ok(((String::new(), node.metadata.name.clone()), object))
            })
            .collect()
    }
}
