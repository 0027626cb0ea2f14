//! Apply: one path for every kind ([`rigger_api::Object`]). A document is decoded
//! (naming the field at fault), stripped of what the user may not set, validated whole,
//! checked against the stored version's immutable fields ([`ControlService::draft`]);
//! a kind then completes it with what only the controller knows (a pod's node and
//! sidecars, a recreate request's pod); and [`ControlService::commit`] carries the
//! controller-owned metadata over and writes it conditional on the revision read.
//! Side effects (waking an engine, telling a node) follow only a real write.

use rigger_api::container_recreate_request::{ContainerRecreateRequest, StatusContext};
use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::kinds::KindVisitor;
use rigger_api::lifecycle_cooperator::LifecycleCooperator;
use rigger_api::pod::Pod;
use rigger_api::secret::Secret;
use rigger_api::sidecar_set::{History, SidecarSet, Versioned, injected_revision};
use rigger_api::{DEFAULT_NAMESPACE, FieldError, Kind, KindInfo, Object, ObjectMeta};
use rigger_proto::v1::{self as proto, ApplyResponse};
use serde::Serialize;
use tonic::Status;

use super::{ControlService, store_status, to_json};
use rigger_store::{ObjectKey, Precondition, StoreError};

/// An object on its way to the store: validated, with the version it replaces.
pub(super) struct Draft<T> {
    pub(super) object: T,
    /// The stored version, decoded.
    pub(super) old: Option<T>,
    /// The stored version's revision: the write is conditional on it.
    old_revision: Option<u64>,
    key: ObjectKey,
    pub(super) namespace: String,
    /// `Kind namespace/name` (or `Kind name`), for refusals and logs.
    pub(super) what: String,
}

impl<T> Draft<T> {
    pub(super) fn refuse(&self, e: &FieldError) -> Status {
        refuse(&self.what, e)
    }
}

/// How an apply ended, in kubectl's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    Unchanged,
    Created,
    Configured,
    /// Marked for deletion, and the apply left it no finalizer: gone.
    Deleted,
}

impl Outcome {
    fn word(self, dry_run: bool) -> String {
        let word = match self {
            Outcome::Unchanged => "unchanged",
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Deleted => "deleted",
        };
        match dry_run && self != Outcome::Unchanged {
            true => format!("{word} (dry run)"),
            false => word.to_owned(),
        }
    }
}

/// The apply of a kind with nothing of its own to add: draft, commit, answer.
struct PlainApply<'a> {
    service: &'a ControlService,
    value: serde_json::Value,
    dry_run: bool,
}

type Applying<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<ApplyResponse, Status>> + Send + 'a>>;

impl<'a> KindVisitor for PlainApply<'a> {
    type Output = Applying<'a>;

    fn applied<T: Object>(self) -> Self::Output {
        Box::pin(async move {
            let mut draft = self.service.draft::<T>(self.value).await?;
            let committed = self.service.commit(&mut draft, self.dry_run).await?;
            if committed.written {
                tracing::info!(object = %draft.what, outcome = ?committed.outcome, "applied");
            }
            applied(&draft.object, committed)
        })
    }

    fn read_only(self, info: &'static KindInfo) -> Self::Output {
        Box::pin(std::future::ready(Err(read_only(info))))
    }
}

/// The refusal of a write to a kind users never apply or delete.
pub(super) fn read_only(info: &KindInfo) -> Status {
    Status::invalid_argument(
        info.read_only
            .unwrap_or("objects of this kind are read-only"),
    )
}

/// How an apply ended and the object's revision.
#[derive(Clone, Copy)]
pub(super) struct Committed {
    pub(super) outcome: Outcome,
    dry_run: bool,
    revision: u64,
    /// The store was written (side effects such as telling a node follow only then).
    pub(super) written: bool,
}

impl Committed {
    fn word(&self) -> String {
        self.outcome.word(self.dry_run)
    }
}

impl ControlService {
    /// Apply one document of `kind`.
    pub(super) async fn apply_document(
        &self,
        kind: Kind,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        match kind {
            Kind::ImagePullJob => self.apply_image_pull_job(value, dry_run).await,
            Kind::Secret => self.apply_secret(value, dry_run).await,
            Kind::Pod => self.apply_pod(value, dry_run).await,
            Kind::ContainerRecreateRequest => self.apply_recreate_request(value, dry_run).await,
            Kind::LifecycleCooperator => self.apply_cooperator(value, dry_run).await,
            Kind::SidecarSet => self.apply_sidecar_set(value, dry_run).await,
            Kind::ImageListPullJob => self.apply_image_list_pull_job(value, dry_run).await,
            // Every other kind is stored as applied, with no engine to tell; one that
            // users never apply is refused with the registry's reason.
            _ => {
                kind.visit(PlainApply {
                    service: self,
                    value,
                    dry_run,
                })
                .await
            }
        }
    }

    /// Decode, strip, validate, read the stored version and check the update.
    pub(super) async fn draft<T: Object>(
        &self,
        value: serde_json::Value,
    ) -> Result<Draft<T>, Status> {
        // A name made from generateName is a new object's: one already taken is made
        // again (a few times), never written over.
        let mut tries = 0;
        let (mut object, what, key, stored) = loop {
            let (value, generated) = with_generated_name(value.clone());
            let (object, what) =
                rigger_api::object::admit::<T>(value).map_err(|(what, e)| refuse(&what, &e))?;
            let namespace = object.metadata().namespace.clone().unwrap_or_default();
            let key = ObjectKey::new(T::INFO.name, &namespace, &object.metadata().name);
            // An unreadable stored version is never written over: what it held would be lost.
            let stored = self
                .store
                .get_as::<T>(key.clone())
                .await
                .map_err(|e| match e {
                    StoreError::Undecodable { detail, .. } => Status::internal(format!(
                        "{key}: stored object unreadable ({detail}); delete it to replace it"
                    )),
                    e => store_status(e),
                })?;
            tries += 1;
            match (generated, &stored) {
                (true, Some(_)) if tries < 5 => continue,
                (true, Some(_)) => {
                    return Err(Status::already_exists(format!(
                        "{what}: every name generated was taken; apply again"
                    )));
                }
                _ => break (object, what, key, stored),
            }
        };
        let applied_version = object.metadata_mut().resource_version.take();
        let namespace = object.metadata().namespace.clone().unwrap_or_default();
        let (old, old_revision) =
            stored.map_or((None, None), |s| (Some(s.value), Some(s.revision)));
        // Kubernetes' optimistic concurrency, for what an apply says it was made from.
        match (&applied_version, old_revision) {
            (Some(_), None) => {
                return Err(refuse(
                    &what,
                    &FieldError::new(
                        "metadata.resourceVersion",
                        "must not be set on create (the store sets it)",
                    ),
                ));
            }
            (Some(applied), Some(stored)) if *applied != stored.to_string() => {
                return Err(Status::aborted(format!(
                    "{what}: the object has been modified (resourceVersion {stored}, applied {applied}); apply your changes to the latest version"
                )));
            }
            _ => {}
        }
        if let Some(old) = &old {
            object.keep_filled(old);
            object.check_update(old).map_err(|e| refuse(&what, &e))?;
        }
        Ok(Draft {
            object,
            old,
            old_revision,
            key,
            namespace,
            what,
        })
    }

    /// Carry the controller-owned metadata over from the stored version; nothing to do
    /// when nothing changed, nothing written on a dry run, else the object is stored
    /// conditional on the revision that was read.
    pub(super) async fn commit<T: Object>(
        &self,
        draft: &mut Draft<T>,
        dry_run: bool,
    ) -> Result<Committed, Status> {
        let old = draft.old.as_ref();
        let spec_changed = old.is_some_and(|o| draft.object.spec_differs(o));
        inherit_metadata(
            draft.object.metadata_mut(),
            old.map(Object::metadata),
            spec_changed,
        );
        // Marked for deletion, and this apply leaves it no finalizer: it goes now.
        let meta = draft.object.metadata();
        if meta.deletion_timestamp.is_some() && meta.finalizers.is_empty() {
            if !dry_run {
                let kind = super::kind_of(T::INFO.name)?;
                let name = meta.name.clone();
                // At the version read: a finalizer added meanwhile keeps it.
                let at = draft.old_revision.map(Precondition::Revision);
                self.remove(kind, &draft.namespace, &name, "finalizers", at)
                    .await?;
            }
            // Nothing written: what an apply would do next (an image list's jobs, a
            // SidecarSet's history) is not done for an object that is gone.
            return Ok(Committed {
                outcome: Outcome::Deleted,
                dry_run,
                revision: draft.old_revision.unwrap_or(0),
                written: false,
            });
        }
        if old == Some(&draft.object) {
            return Ok(Committed {
                outcome: Outcome::Unchanged,
                dry_run,
                revision: draft.old_revision.unwrap_or(0),
                written: false,
            });
        }
        let outcome = if old.is_some() {
            Outcome::Configured
        } else {
            Outcome::Created
        };
        if dry_run {
            return Ok(Committed {
                outcome,
                dry_run,
                revision: 0,
                written: false,
            });
        }
        let precondition = draft
            .old_revision
            .map_or(Precondition::Absent, Precondition::Revision);
        let revision = self
            .store
            .put_as(draft.key.clone(), &draft.object, precondition)
            .await
            .map_err(store_status)?;
        Ok(Committed {
            outcome,
            dry_run,
            revision,
            written: true,
        })
    }

    async fn apply_image_pull_job(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let mut draft = self.draft::<ImagePullJob>(value).await?;
        let committed = self.commit(&mut draft, dry_run).await?;
        if committed.outcome == Outcome::Unchanged {
            // Unchanged: answered with the job's status, as `get` shows it.
            let object = self
                .get_object(
                    Kind::ImagePullJob,
                    &draft.namespace,
                    &draft.object.metadata.name,
                )
                .await?;
            return Ok(ApplyResponse {
                object: Some(object),
                outcome: committed.word(),
            });
        }
        if committed.written {
            tracing::info!(job = %draft.what, image = %draft.object.spec.image, outcome = ?committed.outcome, "job applied");
            self.jobs.wake();
        }
        applied(&draft.object, committed)
    }

    /// A SidecarSet joins pods created from now on (and rolls its containers out to the
    /// pods that have it).
    async fn apply_sidecar_set(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let mut draft = self.draft::<SidecarSet>(value).await?;
        let committed = self.commit(&mut draft, dry_run).await?;
        if committed.written {
            tracing::info!(sidecar_set = %draft.what, outcome = ?committed.outcome, "sidecar set applied");
            self.record_revision(&draft.object).await?;
        }
        applied(&draft.object, committed)
    }

    /// The SidecarSets new pod `what` may be injected with, each at the version it gets
    /// (`injectionStrategy.revision`); a revision asked for that is not recorded is a
    /// failed precondition, as Kruise's webhook refuses the pod.
    async fn sidecar_sets_for(&self, what: &str, pod: &Pod) -> Result<Vec<Versioned>, Status> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let mut out = Vec::new();
        let listed = self
            .store
            .list_all_objects::<SidecarSet>()
            .await
            .map_err(store_status)?;
        // A set this release cannot read may be one the pod needs: the pod waits rather
        // than start without its sidecars (as the cluster's webhook refuses it).
        if let Some((key, detail)) = listed.undecodable.first() {
            return Err(Status::unavailable(format!(
                "{what}: SidecarSet {} cannot be read by controller {} ({detail}): no pod is created until it can, so none starts without its sidecars",
                key.name,
                crate::VERSION
            )));
        }
        for stored in listed.decoded {
            let set = stored.value;
            if !set.matches(namespace, &pod.metadata.labels) {
                continue;
            }
            let history = self.revision_history(&set.metadata.name).await?;
            let (set, revision) =
                injected_revision(&set, &history, &pod.metadata.labels, fastrand::f64())
                    .map_err(|e| Status::failed_precondition(format!("{what}: {e}")))?;
            out.push(Versioned { set, revision });
        }
        Ok(out)
    }

    /// The SidecarSet's current version joins its history (Kruise's ControllerRevision).
    async fn record_revision(&self, set: &SidecarSet) -> Result<(), Status> {
        let (mut history, precondition) = self.read_history(&set.metadata.name).await?;
        if history.record(set) {
            self.store
                .put(
                    history_key(&set.metadata.name),
                    to_json(&history)?.into_bytes(),
                    precondition,
                )
                .await
                .map_err(store_status)?;
        }
        Ok(())
    }

    pub(super) async fn revision_history(&self, set: &str) -> Result<History, Status> {
        Ok(self.read_history(set).await?.0)
    }

    /// SidecarSet `set`'s history and the precondition a write of it goes under. A
    /// history this release cannot read (a newer one wrote it) is refused, never started
    /// again over it.
    async fn read_history(&self, set: &str) -> Result<(History, Precondition), Status> {
        let stored = self
            .store
            .get(history_key(set))
            .await
            .map_err(store_status)?;
        let precondition = stored
            .as_ref()
            .map_or(Precondition::Absent, |s| Precondition::Revision(s.revision));
        let history = match stored.map(rigger_store::typed::decode::<History>) {
            Some(Ok(history)) => history.value,
            Some(Err(error)) => return Err(store_status(error)),
            None => History::default(),
        };
        Ok((history, precondition))
    }

    /// The nodes' pods get the new set of cooperators.
    async fn apply_cooperator(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let mut draft = self.draft::<LifecycleCooperator>(value).await?;
        let committed = self.commit(&mut draft, dry_run).await?;
        if committed.written {
            tracing::info!(cooperator = %draft.what, outcome = ?committed.outcome, "lifecycle cooperator applied");
            self.pods.send_to_all().await;
        }
        applied(&draft.object, committed)
    }

    async fn apply_secret(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let mut draft = self.draft::<Secret>(value).await?;
        let committed = self.commit(&mut draft, dry_run).await?;
        if committed.written {
            tracing::info!(secret = %draft.what, outcome = ?committed.outcome, "secret applied");
            // Pods naming it in imagePullSecrets get it with their node's next set.
            self.pods.send_to_all().await;
        }
        applied(&draft.object.redacted(), committed)
    }

    /// A Pod is placed on a node first when it names none: a ready node matching
    /// `nodeSelector` with the fewest pods. Running it is the node agent's.
    async fn apply_pod(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let mut draft = self.draft::<Pod>(value).await?;
        let pod = &mut draft.object;
        // Sidecars: injected into new pods; an existing pod keeps what it was given.
        match &draft.old {
            Some(old) => rigger_api::sidecar_set::keep_injected(pod, old),
            None => {
                let sets = self.sidecar_sets_for(&draft.what, pod).await?;
                rigger_api::sidecar_set::inject(pod, &sets, &rigger_proto::time::now_rfc3339())
                    .and_then(|()| rigger_api::pod::validate(pod))
                    .map_err(|e| refuse(&draft.what, &e))?;
            }
        }
        if let Some(old) = &draft.old {
            // Placement is the controller's: an apply without nodeName keeps the node.
            if pod.spec.node_name.is_none() {
                pod.spec.node_name.clone_from(&old.spec.node_name);
            }
            // Images (and metadata) change in place; the agent updates those containers.
            rigger_api::pod::check_in_place_change(&old.spec, &pod.spec)
                .map_err(|e| refuse(&draft.what, &e))?;
        }
        // No ready node matching now (agents reconnecting after a restart, say): taken
        // and left Pending, as Kubernetes does; the pending pods' pass places it.
        let mut waits = None;
        if pod.spec.node_name.is_none() {
            match self.place(pod).await {
                Ok(node) => draft.object.spec.node_name = Some(node),
                Err(error) => waits = Some(error.reason),
            }
        }
        let committed = self.commit(&mut draft, dry_run).await?;
        if committed.written {
            tracing::info!(pod = %draft.what, node = ?draft.object.spec.node_name, outcome = ?committed.outcome, "pod applied");
            if let Some(node) = &draft.object.spec.node_name {
                self.pods.send_to(node).await;
            }
            if let Some(why) = &waits {
                tracing::info!(pod = %draft.what, %why, "pod pending: no node takes it now");
            }
        }
        applied(&draft.object, committed)
    }

    /// For a Rigger pod, the containers must be the pod's. The pod is resolved once, at
    /// creation, and named in Kruise's labels.
    async fn apply_recreate_request(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let mut draft = self.draft::<ContainerRecreateRequest>(value).await?;
        let target = match &draft.old {
            Some(old) => old.metadata.labels.clone(),
            None => self
                .resolve_recreate_pod(&draft.namespace, &draft.object)
                .await
                .map_err(|e| draft.refuse(&e))?,
        };
        if draft.old.is_none() {
            self.fill_status_contexts(&draft.namespace, &mut draft.object)
                .await?;
        }
        for label in [
            crate::engines::recreate_requests::POD_UID_LABEL,
            crate::engines::recreate_requests::NODE_NAME_LABEL,
            crate::engines::recreate_requests::POD_OWNER_LABEL,
        ] {
            if let Some(value) = target.get(label) {
                draft
                    .object
                    .metadata
                    .labels
                    .insert(label.to_owned(), value.clone());
            }
        }
        let committed = self.commit(&mut draft, dry_run).await?;
        if committed.written {
            tracing::info!(request = %draft.what, pod = %draft.object.spec.pod_name, outcome = ?committed.outcome, "container recreate request applied");
            self.recreates.wake();
        }
        applied(&draft.object, committed)
    }
}

impl ControlService {
    /// Kruise's webhook fills each container's `statusContext` from the pod's status
    /// when the request is created: the instance running then is the one to recreate.
    /// Done here for Rigger's pods whose status names the container.
    async fn fill_status_contexts(
        &self,
        namespace: &str,
        request: &mut ContainerRecreateRequest,
    ) -> Result<(), Status> {
        if request
            .spec
            .containers
            .iter()
            .all(|c| c.status_context.is_some())
        {
            return Ok(());
        }
        let pod_key = ObjectKey::new(rigger_api::pod::KIND, namespace, &request.spec.pod_name);
        let Some(status) = self
            .record_of(crate::engines::pods::status_key(&pod_key))
            .await?
        else {
            return Ok(());
        };
        let statuses = status["containerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for container in &mut request.spec.containers {
            if container.status_context.is_some() {
                continue;
            }
            let Some(found) = statuses
                .iter()
                .find(|c| c["name"] == container.name.as_str())
            else {
                continue;
            };
            let context = StatusContext {
                container_id: found["containerID"].as_str().unwrap_or_default().to_owned(),
                restart_count: found["restartCount"]
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
            };
            // Only a containerd ID as the agent reports them; anything else is left out.
            if context.is_containerd() {
                container.status_context = Some(context);
            }
        }
        Ok(())
    }
}

/// `Kind namespace/name` of a document, for refusals before it is decoded.
pub(super) fn object_name(value: &serde_json::Value) -> String {
    let kind = value["kind"].as_str().unwrap_or("object");
    let name = value["metadata"]["name"].as_str().unwrap_or("(unnamed)");
    let namespace = value["metadata"]["namespace"]
        .as_str()
        .unwrap_or(DEFAULT_NAMESPACE);
    format!("{kind} {namespace}/{name}")
}

pub(super) use crate::engines::sidecar_sets::history_key;

/// A refusal naming the object, then the field.
fn refuse(what: &str, e: &FieldError) -> Status {
    if e.path.is_empty() {
        Status::invalid_argument(format!("{what}: {}", e.reason))
    } else {
        Status::invalid_argument(format!("{what}: {e}"))
    }
}

/// A new uid for an object (random, 128 bits, UUID-formatted as Kubernetes does).
fn new_uid() -> String {
    let (a, b) = (fastrand::u64(..), fastrand::u64(..));
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        (b >> 48) & 0x3fff | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// Carry the controller-owned metadata over from the stored version.
/// `value` with a name made from `metadata.generateName` when it has none (the prefix
/// and five characters of Kubernetes' alphabet for them), and whether it was made.
fn with_generated_name(mut value: serde_json::Value) -> (serde_json::Value, bool) {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let metadata = &value["metadata"];
    let named = metadata["name"].as_str().is_some_and(|n| !n.is_empty());
    if let (false, Some(prefix)) = (named, metadata["generateName"].as_str()) {
        let suffix: String = (0..5)
            .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
            .collect();
        value["metadata"]["name"] = serde_json::Value::String(format!("{prefix}{suffix}"));
        return (value, true);
    }
    (value, false)
}

fn inherit_metadata(meta: &mut ObjectMeta, stored: Option<&ObjectMeta>, spec_changed: bool) {
    match stored {
        Some(old) => {
            meta.uid.clone_from(&old.uid);
            meta.creation_timestamp.clone_from(&old.creation_timestamp);
            meta.deletion_timestamp.clone_from(&old.deletion_timestamp);
            meta.generation = Some(old.generation.unwrap_or(1) + u64::from(spec_changed));
        }
        None => {
            meta.uid = Some(new_uid());
            meta.creation_timestamp = Some(rigger_proto::time::now_rfc3339());
            meta.generation = Some(1);
        }
    }
}

pub(super) fn applied<T: Serialize>(
    object: &T,
    committed: Committed,
) -> Result<ApplyResponse, Status> {
    Ok(ApplyResponse {
        object: Some(proto::Object {
            json: to_json(object)?,
            revision: committed.revision,
        }),
        outcome: committed.word(),
    })
}
