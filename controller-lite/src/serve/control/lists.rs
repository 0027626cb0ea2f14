//! ImageListPullJob: carried out, as in Kruise, by one ImagePullJob per image, which the
//! list creates, replaces (when its template changed) and deletes (with the image, or
//! with the list). Only jobs carrying the list's owner label are ever touched: a job of
//! that name made by someone else is reported, not taken over.

use rigger_api::Object as _;
use rigger_api::image_list_pull_job::{
    FailedImageStatus, ImageListPullJob, ImageListPullJobStatus, OWNER_LABEL, TEMPLATE_HASH_LABEL,
};
use rigger_api::image_pull_job::{self, ImagePullJob};
use rigger_proto::v1::ApplyResponse;
use tonic::Status;

use super::apply::applied;
use super::{ControlService, store_status};
use rigger_store::{ObjectKey, Precondition, Versioned};

impl ControlService {
    pub(super) async fn apply_image_list_pull_job(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let mut draft = self.draft::<ImageListPullJob>(value).await?;
        let committed = self.commit(&mut draft, dry_run).await?;
        if committed.written {
            tracing::info!(list = %draft.what, images = draft.object.spec.images.len(), outcome = ?committed.outcome, "image list pull job applied");
        }
        if !dry_run {
            self.sync_list_jobs(&draft.object).await?;
        }
        applied(&draft.object, committed)
    }

    /// The list's jobs as its images and template say: missing ones created, ones of
    /// another template replaced, ones of images no longer listed deleted.
    async fn sync_list_jobs(&self, list: &ImageListPullJob) -> Result<(), Status> {
        let namespace = list.metadata.namespace.clone().unwrap_or_default();
        let owned = self.list_jobs(&namespace, &list.metadata.name).await?;
        let hash = list.template_hash();
        for image in &list.spec.images {
            let job = list.job_for(image);
            let current = owned
                .iter()
                .find(|j| j.value.metadata.name == job.metadata.name);
            if let Some(current) = current {
                if current.value.metadata.labels.get(TEMPLATE_HASH_LABEL) == Some(&hash) {
                    continue;
                }
                // Another template: replaced, as Kruise recreates the job.
                self.delete_job(&current.key).await?;
            }
            self.create_job(job).await?;
        }
        for job in &owned {
            if !list.spec.images.contains(&job.value.spec.image) {
                self.delete_job(&job.key).await?;
            }
        }
        self.jobs.wake();
        Ok(())
    }

    /// The jobs in `namespace` labelled as the list's.
    async fn list_jobs(
        &self,
        namespace: &str,
        list: &str,
    ) -> Result<Vec<Versioned<ImagePullJob>>, Status> {
        Ok(self
            .store
            .list_objects::<ImagePullJob>()
            .await
            .map_err(store_status)?
            .into_iter()
            .filter(|job| {
                job.key.namespace == namespace
                    && job
                        .value
                        .metadata
                        .labels
                        .get(OWNER_LABEL)
                        .map(String::as_str)
                        == Some(list)
            })
            .collect())
    }

    /// A job of the list, through the apply path (validation, metadata), keeping the
    /// owner label an apply strips. A name taken by a job that is not the list's is
    /// left alone: the list's status reports it.
    async fn create_job(&self, job: ImagePullJob) -> Result<(), Status> {
        let labels = job.metadata.labels.clone();
        let value = serde_json::to_value(&job).map_err(|e| Status::internal(e.to_string()))?;
        let mut draft = self.draft::<ImagePullJob>(value).await?;
        if draft.old.is_some() {
            tracing::warn!(job = %draft.what, "an image list's job name is taken by a job that is not the list's; left alone");
            return Ok(());
        }
        draft.object.metadata_mut().labels.extend(labels);
        self.commit(&mut draft, false).await?;
        Ok(())
    }

    async fn delete_job(&self, key: &ObjectKey) -> Result<(), Status> {
        self.delete_at(key, Precondition::Any).await
    }

    /// Delete `key` if `precondition` holds; one already gone is no error.
    async fn delete_at(&self, key: &ObjectKey, precondition: Precondition) -> Result<(), Status> {
        match self.store.delete(key.clone(), precondition).await {
            Ok(()) | Err(rigger_store::StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_status(e)),
        }
    }

    /// Deleting a list deletes its jobs.
    pub(super) async fn delete_list_jobs(&self, namespace: &str, list: &str) -> Result<(), Status> {
        for job in self.list_jobs(namespace, list).await? {
            self.delete_job(&job.key).await?;
        }
        self.jobs.wake();
        Ok(())
    }

    /// Kruise's counts over the list's jobs, as `get` shows them.
    pub(super) async fn image_list_status(
        &self,
        list: &ImageListPullJob,
    ) -> Result<ImageListPullJobStatus, Status> {
        let namespace = list.metadata.namespace.clone().unwrap_or_default();
        let owned = self.list_jobs(&namespace, &list.metadata.name).await?;
        let mut status = ImageListPullJobStatus {
            desired: u32::try_from(list.spec.images.len()).unwrap_or(u32::MAX),
            start_time: list.metadata.creation_timestamp.clone(),
            ..ImageListPullJobStatus::default()
        };
        let never = list.spec.template.completion_policy.kind
            == image_pull_job::CompletionPolicyType::Never;
        let mut last_completion: Option<String> = None;
        for image in &list.spec.images {
            let name = list.job_name(image);
            let Some(owned_job) = owned.iter().find(|j| j.value.metadata.name == name) else {
                status.failed_image_statuses.push(FailedImageStatus {
                    image_pull_job: name.clone(),
                    name: image.clone(),
                    message: format!(
                        "no ImagePullJob {name} of this list (its name is taken by another job, or it was deleted); apply the list again"
                    ),
                });
                continue;
            };
            let job = self.job_with_status(owned_job.clone()).await?;
            let job_status = job.status.unwrap_or_default();
            if job_status.active > 0 {
                status.active += 1;
            }
            if job_status.failed > 0 {
                status.failed_image_statuses.push(FailedImageStatus {
                    image_pull_job: name.clone(),
                    name: image.clone(),
                    message: format!(
                        "see which nodes failed with `riggerctl get imagepulljob {name} -o yaml`"
                    ),
                });
            }
            // A job whose nodes are not chosen yet (desired 0) has done nothing. A job that
            // completes is finished once its completion is written (as Kruise counts it:
            // its last node's success can be stored a pass before), a `Never` job once
            // every node is done.
            let started = job_status.desired > 0;
            let finished = match never {
                false => job_status.completion_time.is_some(),
                true => started && job_status.desired == job_status.failed + job_status.succeeded,
            };
            if finished {
                status.completed += 1;
            }
            if finished && started && job_status.desired == job_status.succeeded {
                status.succeeded += 1;
            }
            if let Some(done) = job_status.completion_time {
                last_completion = last_completion.max(Some(done));
            }
        }
        if !never && status.completed == status.desired {
            status.completion_time = last_completion;
        }
        Ok(status)
    }
}

/// In a cluster, lists are created with kubectl, never through apply: this pass does what
/// apply does for each stored list (its jobs made, replaced, removed), deletes the jobs
/// of lists that are gone (the cluster's garbage collector knows nothing of Rigger's
/// owner label), and writes each list's status where `kubectl get` shows it, when it
/// changed (`written`: what was last written, by list).
pub async fn reconcile_in_cluster(
    control: &ControlService,
    written: &mut Written,
) -> Result<(), Status> {
    let lists = control
        .store
        .list_objects::<ImageListPullJob>()
        .await
        .map_err(store_status)?;
    // Every list there is, read or not: a list that no longer decodes (written around
    // Rigger's checks) keeps its jobs; it only makes no more.
    let mut present: std::collections::HashSet<(String, String)> = control
        .store
        .list(rigger_api::image_list_pull_job::KIND)
        .await
        .map_err(store_status)?
        .into_iter()
        .map(|stored| (stored.key.namespace, stored.key.name))
        .collect();
    for stored in &lists {
        let list = &stored.value;
        // An invalid list keeps the jobs it has; it makes no more.
        present.insert((stored.key.namespace.clone(), stored.key.name.clone()));
        if let Err(error) = list.validate() {
            tracing::warn!(list = %stored.key, %error, "stored image list is not valid; skipped");
            continue;
        }
        // One list's trouble (deleted meanwhile, say) is logged, not every list's.
        if let Err(error) = reconcile_list(control, stored, written).await {
            tracing::warn!(list = %stored.key, %error, "image list: not reconciled this pass");
        }
    }
    written.retain(|key, _| present.contains(&(key.namespace.clone(), key.name.clone())));
    let orphans: Vec<ObjectKey> = control
        .store
        .list_objects::<ImagePullJob>()
        .await
        .map_err(store_status)?
        .into_iter()
        .filter(|job| {
            job.value
                .metadata
                .labels
                .get(OWNER_LABEL)
                .is_some_and(|list| !present.contains(&(job.key.namespace.clone(), list.clone())))
        })
        .map(|job| job.key)
        .collect();
    for key in orphans {
        tracing::info!(job = %key, "the job's image list is gone; deleted");
        control.delete_job(&key).await?;
    }
    Ok(())
}

/// What was last written of each list's status, with the list's uid (a list deleted and
/// made again under its name is another list).
pub type Written = std::collections::HashMap<ObjectKey, (Option<String>, ImageListPullJobStatus)>;

/// One list's jobs made, and its status written when it changed.
async fn reconcile_list(
    control: &ControlService,
    stored: &Versioned<ImageListPullJob>,
    written: &mut Written,
) -> Result<(), Status> {
    let (key, list) = (&stored.key, &stored.value);
    let uid = &list.metadata.uid;
    if written.get(key).is_some_and(|(seen, _)| seen != uid) {
        written.remove(key);
    }
    let status_key = ObjectKey::new(
        &format!("{}.status", rigger_api::image_list_pull_job::KIND),
        &key.namespace,
        &key.name,
    );
    if !written.contains_key(key) {
        // After a restart, or a list another controller (Kruise's) ran until now.
        // A status that does not decode (written around Rigger) is none: the list is
        // carried out and its status written again, not stuck.
        match control
            .store
            .get_as::<ImageListPullJobStatus>(status_key.clone())
            .await
        {
            Ok(Some(stored)) => {
                written.insert(key.clone(), (uid.clone(), stored.value));
            }
            Ok(None) | Err(rigger_store::StoreError::Undecodable { .. }) => {}
            Err(error) => return Err(store_status(error)),
        }
    }
    // A finished list is done, as Kruise's is: the jobs its template's
    // `ttlSecondsAfterFinished` deleted are not made again (each would pull on every
    // node, then go at its ttl, then be made again), nor is its status rewritten; at its
    // own ttl it is deleted (its jobs then go as orphans, the next pass).
    if let Some((_, status)) = written
        .get(key)
        .filter(|(_, s)| s.completion_time.is_some())
    {
        let policy = &list.spec.template.completion_policy;
        if policy.ttl_passed(
            status.completion_time.as_deref(),
            std::time::SystemTime::now(),
        ) {
            tracing::info!(list = %key, "ttlSecondsAfterFinished passed; deleting the image list");
            // This list, as read: not one made again under its name meanwhile.
            control
                .delete_at(key, Precondition::Revision(stored.revision))
                .await?;
        }
        return Ok(());
    }
    control.sync_list_jobs(list).await?;
    let status = control.image_list_status(list).await?;
    if written.get(key).is_some_and(|(_, last)| *last == status) {
        return Ok(());
    }
    let bytes = serde_json::to_vec(&status).map_err(|e| Status::internal(e.to_string()))?;
    control
        .store
        .put(status_key, bytes, Precondition::Any)
        .await
        .map_err(store_status)?;
    written.insert(key.clone(), (uid.clone(), status));
    Ok(())
}

/// Run [`reconcile_in_cluster`] at once when a list is applied or edited, or its jobs'
/// statuses were written, and every second, until `token` is cancelled.
pub async fn keep_in_cluster(control: ControlService, token: tokio_util::sync::CancellationToken) {
    let mut written = std::collections::HashMap::new();
    let mut lists_changed = control.store.changes(ImageListPullJob::INFO.name);
    let mut statuses = control.jobs.statuses_written();
    loop {
        if let Err(error) = reconcile_in_cluster(&control, &mut written).await {
            tracing::warn!(%error, "image lists: pass skipped");
        }
        let list_changed = async {
            let told = match lists_changed.as_mut() {
                Some(changes) => changes.changed().await.is_ok(),
                None => false,
            };
            if !told {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = token.cancelled() => return,
            () = list_changed => {}
            Ok(()) = statuses.changed() => {}
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::{Duration, SystemTime};

    fn list(ttl: Option<u64>) -> ImageListPullJob {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1beta1",
            "kind": "ImageListPullJob",
            "metadata": {"name": "l", "namespace": "default"},
            "spec": {"images": ["r.example/a:1"],
                     "completionPolicy": {"type": "Always", "ttlSecondsAfterFinished": ttl}},
        }))
        .unwrap()
    }

    #[test]
    fn a_finished_list_goes_at_its_ttl_and_not_before_nor_without_one() {
        let done = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let status = ImageListPullJobStatus {
            completion_time: Some(rigger_proto::time::rfc3339(done)),
            ..ImageListPullJobStatus::default()
        };
        let later = |s| done + Duration::from_secs(s);
        let ttl_passed = |list: ImageListPullJob, status: &ImageListPullJobStatus, now| {
            let policy = &list.spec.template.completion_policy;
            policy.ttl_passed(status.completion_time.as_deref(), now)
        };
        assert!(!ttl_passed(list(Some(30)), &status, later(29)));
        assert!(ttl_passed(list(Some(30)), &status, later(30)));
        assert!(!ttl_passed(list(None), &status, later(3_000)));
        let unfinished = ImageListPullJobStatus::default();
        assert!(!ttl_passed(list(Some(0)), &unfinished, later(3_000)));
    }
}
