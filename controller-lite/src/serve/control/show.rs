//! Objects as the API shows them: a job with its status, a secret redacted, a pod with
//! the agent's status and lifecycle label, a SidecarSet with Kruise's counts.

use std::time::SystemTime;

use rigger_api::Kind;
use rigger_api::pod::Pod;
use rigger_proto::v1::Object;
use tonic::Status;

use super::{ControlService, decoded, store_status, to_json};
use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::pod::LIFECYCLE_STATE_LABEL;
use rigger_api::secret::Secret;
use rigger_store::ObjectKey;

impl ControlService {
    /// One stored object as the API shows it (job with status, secret redacted).
    pub(super) async fn show(
        &self,
        kind: Kind,
        stored: rigger_store::Stored,
    ) -> Result<Object, Status> {
        let json = match kind {
            Kind::ImagePullJob => to_json(&self.job_with_status(decoded(stored.clone())?).await?)?,
            Kind::Secret => {
                let secret = decoded::<Secret>(stored.clone())?.value;
                to_json(&secret.redacted())?
            }
            Kind::Pod => {
                let mut pod = decoded::<serde_json::Value>(stored.clone())?.value;
                if let Some(status) = self
                    .record_of(crate::engines::pods::status_key(&stored.key))
                    .await?
                {
                    // The agent's lifecycle state shows as a label, as Kruise shows its own.
                    if let Some(state) = status.pointer("/lifecycle/state").and_then(|s| s.as_str())
                    {
                        pod["metadata"]["labels"][LIFECYCLE_STATE_LABEL] = state.into();
                    }
                    pod["status"] = status;
                }
                pod.to_string()
            }
            Kind::ContainerRecreateRequest => {
                let mut request = decoded::<serde_json::Value>(stored.clone())?.value;
                request["status"] = self
                    .record_of(crate::engines::recreate_requests::status_key(&stored.key))
                    .await?
                    .unwrap_or_else(|| serde_json::json!({"phase": "Pending"}));
                // Kruise's v1alpha1 status has no conditions (v1beta1's has).
                if request["apiVersion"] == rigger_api::KRUISE_API_VERSION
                    && let Some(status) = request["status"].as_object_mut()
                {
                    status.remove("conditions");
                }
                request.to_string()
            }
            Kind::ImageListPullJob => {
                let mut list =
                    decoded::<rigger_api::image_list_pull_job::ImageListPullJob>(stored.clone())?
                        .value;
                list.status = Some(Box::pin(self.image_list_status(&list)).await?);
                to_json(&list)?
            }
            Kind::SidecarSet => {
                let mut set = decoded::<rigger_api::sidecar_set::SidecarSet>(stored.clone())?.value;
                set.status = Some(self.sidecar_set_status(&set).await?);
                to_json(&set)?
            }
            // Every other kind as stored.
            _ => String::from_utf8_lossy(&stored.object).into_owned(),
        };
        Ok(Object {
            json: with_resource_version(json, stored.revision),
            revision: stored.revision,
        })
    }

    pub(super) async fn get_object(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Object, Status> {
        if kind == Kind::NodeImage {
            return self
                .node_images(Some(name))
                .await?
                .pop()
                .map(|(_, object)| object)
                .ok_or_else(|| Status::not_found(format!("NodeImage/{name}: not found")));
        }
        if kind == Kind::Node {
            return self
                .nodes
                .objects(SystemTime::now(), self.node_timeout)
                .into_iter()
                .find(|n| n["metadata"]["name"] == name)
                .map(|n| Object {
                    json: n.to_string(),
                    revision: 0,
                })
                .ok_or_else(|| Status::not_found(format!("Node/{name}: not found")));
        }
        let key = ObjectKey::new(kind.name(), namespace, name);
        let stored = self
            .store
            .get(key.clone())
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::not_found(format!("{key}: not found")))?;
        self.show(kind, stored).await
    }

    /// A job with its status: the engine's (ahead of the store) when it holds the job
    /// at this revision, else the stored one.
    pub(super) async fn job_with_status(
        &self,
        job: rigger_store::Versioned<ImagePullJob>,
    ) -> Result<ImagePullJob, Status> {
        let held = if self.writes_through_kubernetes {
            let uid = job.value.metadata.uid.as_deref().unwrap_or_default();
            self.jobs.status_by_uid(&job.key, uid)
        } else {
            self.jobs.status_of(&job.key, job.revision)
        };
        let status = match held {
            Some(status) => status,
            None => crate::engines::jobs::status::read(&self.store, &job.key)
                .await
                .map_err(store_status)?
                .map(|(status, _)| status)
                .unwrap_or_default(),
        };
        let mut job = job.value;
        job.status = Some(status);
        Ok(job)
    }

    /// A record the controller keeps beside an object (a pod's or a recreate's status
    /// as reported), as JSON; `None` when there is none or it does not decode.
    pub(super) async fn record_of(
        &self,
        key: ObjectKey,
    ) -> Result<Option<serde_json::Value>, Status> {
        match self.store.get_as::<serde_json::Value>(key).await {
            Ok(record) => Ok(record.map(|r| r.value)),
            Err(rigger_store::StoreError::Undecodable { .. }) => Ok(None),
            Err(error) => Err(store_status(error)),
        }
    }

    /// Kruise's SidecarSet counts, from the pods it was injected into.
    async fn sidecar_set_status(
        &self,
        set: &rigger_api::sidecar_set::SidecarSet,
    ) -> Result<rigger_api::sidecar_set::SidecarSetStatus, Status> {
        let hash = set.hash();
        let history = self.revision_history(&set.metadata.name).await?;
        let mut status = rigger_api::sidecar_set::SidecarSetStatus {
            observed_generation: set.metadata.generation.unwrap_or(1),
            latest_revision: history.current_name(set),
            collision_count: Some(history.collision_count),
            ..Default::default()
        };
        for pod in self
            .store
            .list_objects::<Pod>()
            .await
            .map_err(store_status)?
        {
            let Some(version) =
                rigger_api::sidecar_set::injected(&pod.value).remove(&set.metadata.name)
            else {
                continue;
            };
            let ready = self
                .record_of(crate::engines::pods::status_key(&pod.key))
                .await?
                .is_some_and(|status| crate::engines::pods::is_ready(&status));
            let updated = version.hash == hash;
            status.matched_pods += 1;
            status.updated_pods += u32::from(updated);
            status.ready_pods += u32::from(ready);
            status.updated_ready_pods += u32::from(updated && ready);
        }
        Ok(status)
    }
}

/// `json` with `metadata.resourceVersion`, as kubectl shows it: what an apply of the
/// object read back names to be refused if someone changed it meanwhile.
fn with_resource_version(json: String, revision: u64) -> String {
    match serde_json::from_str::<serde_json::Value>(&json) {
        Ok(mut value) if value["metadata"].is_object() => {
            value["metadata"]["resourceVersion"] = serde_json::Value::String(revision.to_string());
            value.to_string()
        }
        _ => json,
    }
}
