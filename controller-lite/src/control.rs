//! The user API riggerctl speaks: apply, get, list and delete objects as JSON.
//!
//! Applied objects are validated whole before anything is written; a refusal names the
//! object and the field (`ImagePullJob default/warm: spec.parallelism: ...`). Writes are
//! conditional on the revision that was read, so two concurrent applies cannot silently
//! overwrite each other.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rigger_proto::v1::control_server::Control;
use rigger_proto::v1::{
    ApplyRequest, ApplyResponse, ContainerExec, ContainerLogs, DeleteRequest, DeleteResponse,
    GetRequest, LabelRequest, ListRequest, ListResponse, Object, PodExecRequest, PodLogsRequest,
    PodOutput, agent_request,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use crate::auth::{Role, UserAuth};
use crate::jobs::JobEngine;
use crate::leader::Leadership;
use crate::nodes::NodeRegistry;
use crate::pods::PodSync;
use crate::rate_limit::{ApiRate, ClientLimiter};
use crate::recreates::RecreateEngine;
use crate::store::{ObjectKey, Precondition, Store, StoreError};
use rigger_api::image_pull_job::ImagePullJob;
use rigger_api::pod::Pod;
use rigger_api::secret::Secret;
use rigger_api::{DEFAULT_NAMESPACE, FieldError, Kind, ObjectMeta};

/// The label `get pod` shows an agent-managed pod's lifecycle state in.
pub const LIFECYCLE_STATE_LABEL: &str = "lifecycle.rigger.dev/state";

/// Largest object accepted (a job or secret is a few kilobytes).
pub const MAX_OBJECT_BYTES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct ControlService {
    store: Store,
    nodes: NodeRegistry,
    jobs: JobEngine,
    recreates: RecreateEngine,
    pods: PodSync,
    users: UserAuth,
    limiter: Arc<ClientLimiter>,
    leadership: Leadership,
    node_timeout: Duration,
}

impl ControlService {
    #[allow(clippy::too_many_arguments)] // the API's collaborators, each kept once
    pub fn new(
        store: Store,
        nodes: NodeRegistry,
        jobs: JobEngine,
        recreates: RecreateEngine,
        pods: PodSync,
        users: UserAuth,
        leadership: Leadership,
        node_timeout: Duration,
        api_rate: ApiRate,
    ) -> Self {
        Self {
            store,
            nodes,
            jobs,
            recreates,
            pods,
            users,
            limiter: Arc::new(ClientLimiter::new(api_rate)),
            leadership,
            node_timeout,
        }
    }

    /// Who sent `request`, if they may act with `needed` and are within their request
    /// rate (per user; per address when there are no tokens).
    fn admit<T>(&self, request: &Request<T>, needed: Role) -> Result<String, Status> {
        let user = self.users.authorize(request, needed)?;
        let client = match (&self.users, request.remote_addr()) {
            (UserAuth::Open, Some(address)) => address.ip().to_string(),
            _ => user.clone(),
        };
        self.limiter.admit(&client)?;
        Ok(user)
    }

    /// Forget idle clients now and then: the limiter keeps one entry per client seen.
    pub fn spawn_limiter_cleanup(&self, stop: tokio_util::sync::CancellationToken) {
        let limiter = self.limiter.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(60));
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = every.tick() => limiter.forget_idle(),
                }
            }
        });
    }
}

#[allow(clippy::needless_pass_by_value)] // shaped for `map_err`
fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::NotFound { .. } => Status::not_found(e.to_string()),
        StoreError::Conflict { .. } => Status::aborted(e.to_string()),
        StoreError::Backend { .. } => Status::unavailable(e.to_string()),
    }
}

fn kind_of(text: &str) -> Result<Kind, Status> {
    Kind::resolve(text).ok_or_else(|| {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        Status::invalid_argument(format!(
            "unknown kind {text:?} (known: {})",
            known.join(", ")
        ))
    })
}

fn namespace_or_default(namespace: &str) -> &str {
    if namespace.is_empty() {
        DEFAULT_NAMESPACE
    } else {
        namespace
    }
}

/// Decode `value` as `T`, naming the field at fault.
fn decode<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        FieldError::new(path, e.into_inner().to_string())
    })
}

fn to_json<T: Serialize>(object: &T) -> Result<String, Status> {
    serde_json::to_string(object).map_err(|e| Status::internal(format!("cannot encode: {e}")))
}

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
fn inherit_metadata(meta: &mut ObjectMeta, stored: Option<&ObjectMeta>, spec_changed: bool) {
    match stored {
        Some(old) => {
            meta.uid.clone_from(&old.uid);
            meta.creation_timestamp.clone_from(&old.creation_timestamp);
            meta.generation = Some(old.generation.unwrap_or(1) + u64::from(spec_changed));
        }
        None => {
            meta.uid = Some(new_uid());
            meta.creation_timestamp = Some(rigger_proto::time::now_rfc3339());
            meta.generation = Some(1);
        }
    }
}

/// Fill in the default namespace; `(namespace, "Kind ns/name")` for messages.
fn default_namespace(kind: &str, meta: &mut ObjectMeta) -> (String, String) {
    let namespace = meta
        .namespace
        .get_or_insert_with(|| DEFAULT_NAMESPACE.to_owned())
        .clone();
    let what = format!("{kind} {namespace}/{}", meta.name);
    (namespace, what)
}

/// How an apply ended: kubectl's word for it and the object's revision.
struct Committed {
    outcome: String,
    revision: u64,
    /// The store was written (side effects such as telling a node follow only then).
    written: bool,
}

/// Objects whose metadata the API manages (uid, creation time, generation).
trait Managed: Serialize + serde::de::DeserializeOwned + PartialEq {
    fn metadata(&self) -> &ObjectMeta;
    fn metadata_mut(&mut self) -> &mut ObjectMeta;
    /// Whether the spec differs (the generation moves).
    fn spec_differs(&self, other: &Self) -> bool;
}

impl Managed for rigger_api::lifecycle_cooperator::LifecycleCooperator {
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn spec_differs(&self, other: &Self) -> bool {
        self.spec != other.spec
    }
}

impl Managed for rigger_api::sidecar_set::SidecarSet {
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn spec_differs(&self, other: &Self) -> bool {
        self.spec != other.spec
    }
}

fn applied<T: Serialize>(object: &T, committed: Committed) -> Result<ApplyResponse, Status> {
    Ok(ApplyResponse {
        object: Some(Object {
            json: to_json(object)?,
            revision: committed.revision,
        }),
        outcome: committed.outcome,
    })
}

impl ControlService {
    /// What is stored under `key`, and it decoded (`None` when absent or unreadable:
    /// an apply then writes over it).
    async fn read_stored<T: DeserializeOwned>(
        &self,
        key: &ObjectKey,
    ) -> Result<(Option<crate::store::Stored>, Option<T>), Status> {
        let stored = self.store.get(key.clone()).await.map_err(store_status)?;
        let old = stored
            .as_ref()
            .and_then(|s| serde_json::from_slice::<T>(&s.object).ok());
        Ok((stored, old))
    }

    /// Store a validated object under `key`: metadata carried over from the stored
    /// version, written only when it changed, conditional on the revision read.
    async fn store_version<T: Managed>(
        &self,
        key: ObjectKey,
        object: &mut T,
        dry_run: bool,
    ) -> Result<Committed, Status> {
        let (stored, old) = self.read_stored::<T>(&key).await?;
        let spec_changed = old.as_ref().is_some_and(|o| o.spec_differs(object));
        inherit_metadata(
            object.metadata_mut(),
            old.as_ref().map(Managed::metadata),
            spec_changed,
        );
        let unchanged = old.as_ref() == Some(&*object);
        self.commit(
            key,
            stored.as_ref(),
            old.is_some(),
            unchanged,
            &*object,
            dry_run,
        )
        .await
    }

    /// The end of every apply: nothing to do when `unchanged`, nothing written on a dry
    /// run, else `object` is stored conditional on the revision that was read.
    async fn commit<T: Serialize>(
        &self,
        key: ObjectKey,
        stored: Option<&crate::store::Stored>,
        existed: bool,
        unchanged: bool,
        object: &T,
        dry_run: bool,
    ) -> Result<Committed, Status> {
        if unchanged {
            return Ok(Committed {
                outcome: "unchanged".to_owned(),
                revision: stored.map_or(0, |s| s.revision),
                written: false,
            });
        }
        let outcome = if existed { "configured" } else { "created" };
        if dry_run {
            return Ok(Committed {
                outcome: format!("{outcome} (dry run)"),
                revision: 0,
                written: false,
            });
        }
        let precondition =
            stored.map_or(Precondition::Absent, |s| Precondition::Revision(s.revision));
        let revision = self
            .store
            .put(key, to_json(object)?.into_bytes(), precondition)
            .await
            .map_err(store_status)?;
        Ok(Committed {
            outcome: outcome.to_owned(),
            revision,
            written: true,
        })
    }

    async fn apply_image_pull_job(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let name = object_name(&value);
        let mut job: ImagePullJob = decode(value).map_err(|e| refuse(&name, &e))?;
        job.status = None;
        let (namespace, what) =
            default_namespace(rigger_api::image_pull_job::KIND, &mut job.metadata);
        job.validate().map_err(|e| refuse(&what, &e))?;
        let key = ObjectKey::new(
            rigger_api::image_pull_job::KIND,
            &namespace,
            &job.metadata.name,
        );
        let stored = self.store.get(key.clone()).await.map_err(store_status)?;
        let old =
            match &stored {
                Some(s) => Some(serde_json::from_slice::<ImagePullJob>(&s.object).map_err(
                    |e| Status::internal(format!("{key}: stored object unreadable: {e}")),
                )?),
                None => None,
            };
        if let Some(old) = &old {
            let immutable = [
                ("spec.image", old.spec.image != job.spec.image),
                ("spec.selector", old.spec.selector != job.spec.selector),
                (
                    "spec.podSelector",
                    old.spec.pod_selector != job.spec.pod_selector,
                ),
            ];
            if let Some((field, _)) = immutable.iter().find(|(_, changed)| *changed) {
                return Err(refuse(
                    &what,
                    &FieldError::new(
                        *field,
                        "cannot change on an existing job; delete it and apply again",
                    ),
                ));
            }
        }
        let spec_changed = old.as_ref().is_some_and(|o| o.spec != job.spec);
        inherit_metadata(
            &mut job.metadata,
            old.as_ref().map(|o| &o.metadata),
            spec_changed,
        );
        if old.as_ref() == Some(&job) {
            let object = self
                .get_object(Kind::ImagePullJob, &namespace, &job.metadata.name)
                .await?;
            return Ok(ApplyResponse {
                object: Some(object),
                outcome: "unchanged".to_owned(),
            });
        }
        let committed = self
            .commit(key, stored.as_ref(), old.is_some(), false, &job, dry_run)
            .await?;
        if committed.written {
            tracing::info!(job = %what, image = %job.spec.image, outcome = %committed.outcome, "job applied");
            self.jobs.wake();
        }
        applied(&job, committed)
    }

    /// Store a SidecarSet: it joins pods created from now on (and rolls its containers
    /// out to the pods that have it).
    async fn apply_sidecar_set(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        use rigger_api::sidecar_set::{self as sidecar_set, SidecarSet};
        let name = object_name(&value);
        let mut object: SidecarSet = decode(value).map_err(|e| refuse(&name, &e))?;
        object.status = None;
        // Cluster-scoped, as in Kruise.
        object.metadata.namespace = None;
        let what = format!("{} {}", sidecar_set::KIND, object.metadata.name);
        object.validate().map_err(|e| refuse(&what, &e))?;
        let key = ObjectKey::new(sidecar_set::KIND, "", &object.metadata.name);
        let committed = self.store_version(key, &mut object, dry_run).await?;
        if committed.written {
            tracing::info!(sidecar_set = %what, outcome = %committed.outcome, "sidecar set applied");
        }
        applied(&object, committed)
    }

    /// Kruise's SidecarSet counts, from the pods it was injected into.
    async fn sidecar_set_status(
        &self,
        set: &rigger_api::sidecar_set::SidecarSet,
    ) -> Result<rigger_api::sidecar_set::SidecarSetStatus, Status> {
        let hash = set.hash();
        let mut status = rigger_api::sidecar_set::SidecarSetStatus {
            observed_generation: set.metadata.generation.unwrap_or(1),
            ..Default::default()
        };
        for stored in self
            .store
            .list(rigger_api::pod::KIND)
            .await
            .map_err(store_status)?
        {
            let Ok(pod) = serde_json::from_slice::<Pod>(&stored.object) else {
                continue;
            };
            let Some(version) = rigger_api::sidecar_set::injected(&pod).remove(&set.metadata.name)
            else {
                continue;
            };
            let ready = self
                .store
                .get(crate::pods::status_key(&stored.key))
                .await
                .map_err(store_status)?
                .and_then(|s| serde_json::from_slice::<serde_json::Value>(&s.object).ok())
                .is_some_and(|status| crate::pods::is_ready(&status));
            let updated = version.hash == hash;
            status.matched_pods += 1;
            status.updated_pods += u32::from(updated);
            status.ready_pods += u32::from(ready);
            status.updated_ready_pods += u32::from(updated && ready);
        }
        Ok(status)
    }

    /// Store a LifecycleCooperator; the nodes' pods get the new set of cooperators.
    async fn apply_cooperator(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        use rigger_api::lifecycle_cooperator::{self as cooperator, LifecycleCooperator};
        let name = object_name(&value);
        let mut object: LifecycleCooperator = decode(value).map_err(|e| refuse(&name, &e))?;
        let (namespace, what) = default_namespace(cooperator::KIND, &mut object.metadata);
        object.validate().map_err(|e| refuse(&what, &e))?;
        let key = ObjectKey::new(cooperator::KIND, &namespace, &object.metadata.name);
        let committed = self.store_version(key, &mut object, dry_run).await?;
        if committed.written {
            tracing::info!(cooperator = %what, outcome = %committed.outcome, "lifecycle cooperator applied");
            self.pods.send_to_all().await;
        }
        applied(&object, committed)
    }

    async fn apply_secret(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let name = object_name(&value);
        let mut secret: Secret = decode(value).map_err(|e| refuse(&name, &e))?;
        let (namespace, what) = default_namespace(rigger_api::secret::KIND, &mut secret.metadata);
        secret
            .validate_and_normalize()
            .map_err(|e| refuse(&what, &e))?;
        let key = ObjectKey::new(rigger_api::secret::KIND, &namespace, &secret.metadata.name);
        let (stored, old) = self.read_stored::<Secret>(&key).await?;
        let changed = old
            .as_ref()
            .is_none_or(|o| o.data != secret.data || o.secret_type != secret.secret_type);
        inherit_metadata(
            &mut secret.metadata,
            old.as_ref().map(|o| &o.metadata),
            changed,
        );
        let committed = self
            .commit(
                key,
                stored.as_ref(),
                old.is_some(),
                old.as_ref() == Some(&secret),
                &secret,
                dry_run,
            )
            .await?;
        if committed.written {
            tracing::info!(secret = %what, outcome = %committed.outcome, "secret applied");
        }
        applied(&secret.redacted(), committed)
    }

    /// Store a Pod, placing it on a node first when it names none: a ready node matching
    /// `nodeSelector` with the fewest pods. Running it is the node agent's (issue 5).
    async fn apply_pod(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        let name = object_name(&value);
        let mut pod: Pod = decode(value).map_err(|e| refuse(&name, &e))?;
        pod.status = None;
        // Shown on reads, owned by the agent: a re-applied copy must not store it.
        pod.metadata.labels.remove(LIFECYCLE_STATE_LABEL);
        let (namespace, what) = default_namespace(rigger_api::pod::KIND, &mut pod.metadata);
        rigger_api::pod::validate(&pod).map_err(|e| refuse(&what, &e))?;
        let key = ObjectKey::new(rigger_api::pod::KIND, &namespace, &pod.metadata.name);
        let (stored, old) = self.read_stored::<Pod>(&key).await?;
        // Sidecars: injected into new pods; an existing pod keeps what it was given.
        match &old {
            Some(old) => rigger_api::sidecar_set::keep_injected(&mut pod, old),
            None => {
                let sets: Vec<rigger_api::sidecar_set::SidecarSet> = self
                    .store
                    .list(rigger_api::sidecar_set::KIND)
                    .await
                    .map_err(store_status)?
                    .iter()
                    .filter_map(|s| serde_json::from_slice(&s.object).ok())
                    .collect();
                rigger_api::sidecar_set::inject(&mut pod, &sets)
                    .and_then(|()| rigger_api::pod::validate(&pod))
                    .map_err(|e| refuse(&what, &e))?;
            }
        }
        if let Some(old) = &old {
            // Placement is the controller's: an apply without nodeName keeps the node.
            if pod.spec.node_name.is_none() {
                pod.spec.node_name.clone_from(&old.spec.node_name);
            }
            // Images (and metadata) change in place; the agent updates those containers.
            rigger_api::pod::check_in_place_change(&old.spec, &pod.spec)
                .map_err(|e| refuse(&what, &e))?;
        }
        if pod.spec.node_name.is_none() {
            pod.spec.node_name = Some(self.place(&pod).await.map_err(|e| refuse(&what, &e))?);
        }
        inherit_metadata(
            &mut pod.metadata,
            old.as_ref().map(|o| &o.metadata),
            old.as_ref().is_some_and(|o| o.spec != pod.spec),
        );
        let committed = self
            .commit(
                key,
                stored.as_ref(),
                old.is_some(),
                old.as_ref() == Some(&pod),
                &pod,
                dry_run,
            )
            .await?;
        if committed.written {
            tracing::info!(pod = %what, node = ?pod.spec.node_name, outcome = %committed.outcome, "pod applied");
            if let Some(node) = &pod.spec.node_name {
                self.pods.send_to(node).await;
            }
        }
        applied(&pod, committed)
    }

    /// Store a ContainerRecreateRequest. Like Kruise's, its spec cannot change once
    /// created; for a Rigger pod, the containers must be the pod's.
    async fn apply_crr(
        &self,
        value: serde_json::Value,
        dry_run: bool,
    ) -> Result<ApplyResponse, Status> {
        use rigger_api::container_recreate_request::{self as crr, ContainerRecreateRequest};
        let name = object_name(&value);
        let mut request: ContainerRecreateRequest = decode(value).map_err(|e| refuse(&name, &e))?;
        request.status = None;
        let (namespace, what) = default_namespace(crr::KIND, &mut request.metadata);
        request.validate().map_err(|e| refuse(&what, &e))?;
        let key = ObjectKey::new(crr::KIND, &namespace, &request.metadata.name);
        let (stored, old) = self.read_stored::<ContainerRecreateRequest>(&key).await?;
        if let Some(old) = &old
            && old.spec != request.spec
        {
            return Err(refuse(
                &what,
                &FieldError::new(
                    "spec",
                    "cannot change once created; delete the request and apply a new one",
                ),
            ));
        }
        // The pod is resolved once, at creation, and named in Kruise's labels.
        let target = match &old {
            Some(old) => old.metadata.labels.clone(),
            None => self
                .resolve_crr_pod(&namespace, &request)
                .await
                .map_err(|e| refuse(&what, &e))?,
        };
        for label in [
            crate::recreates::POD_UID_LABEL,
            crate::recreates::NODE_NAME_LABEL,
            crate::recreates::POD_OWNER_LABEL,
        ] {
            if let Some(value) = target.get(label) {
                request
                    .metadata
                    .labels
                    .insert(label.to_owned(), value.clone());
            }
        }
        inherit_metadata(
            &mut request.metadata,
            old.as_ref().map(|o| &o.metadata),
            false,
        );
        let committed = self
            .commit(
                key,
                stored.as_ref(),
                old.is_some(),
                old.as_ref() == Some(&request),
                &request,
                dry_run,
            )
            .await?;
        if committed.written {
            tracing::info!(request = %what, pod = %request.spec.pod_name, outcome = %committed.outcome, "container recreate request applied");
            self.recreates.wake();
        }
        applied(&request, committed)
    }

    /// The request's pod: an agent-managed Pod object, else a kubelet pod some node's
    /// inventory shows. Kruise's labels naming its uid and node (and who runs it).
    async fn resolve_crr_pod(
        &self,
        namespace: &str,
        request: &rigger_api::container_recreate_request::ContainerRecreateRequest,
    ) -> Result<std::collections::BTreeMap<String, String>, FieldError> {
        use crate::recreates::{NODE_NAME_LABEL, POD_OWNER_LABEL, POD_UID_LABEL};
        let pod_name = &request.spec.pod_name;
        let pod_key = ObjectKey::new(rigger_api::pod::KIND, namespace, pod_name);
        let stored = self
            .store
            .get(pod_key)
            .await
            .map_err(|e| FieldError::new("spec.podName", format!("cannot read pods: {e}")))?
            .and_then(|s| serde_json::from_slice::<Pod>(&s.object).ok());
        let (owner, node, uid, containers) = match stored {
            Some(pod) => {
                let (Some(node), Some(uid)) =
                    (pod.spec.node_name.clone(), pod.metadata.uid.clone())
                else {
                    return Err(FieldError::new(
                        "spec.podName",
                        format!("pod {namespace}/{pod_name} is not placed on a node yet"),
                    ));
                };
                let names = pod.spec.containers.iter().map(|c| c.name.clone()).collect();
                ("rigger", node, uid, names)
            }
            None => match self.nodes.kubelet_pod(namespace, pod_name) {
                Some((node, pod)) => ("kubelet", node, pod.uid, pod.containers),
                None => {
                    return Err(FieldError::new(
                        "spec.podName",
                        format!(
                            "pod {namespace}/{pod_name} not found (neither a Rigger pod nor a running kubelet pod on any node)"
                        ),
                    ));
                }
            },
        };
        for (i, container) in request.spec.containers.iter().enumerate() {
            if !containers.contains(&container.name) {
                return Err(FieldError::new(
                    format!("spec.containers[{i}].name"),
                    format!("pod {pod_name:?} has no container {:?}", container.name),
                ));
            }
        }
        Ok([
            (POD_UID_LABEL.to_owned(), uid),
            (NODE_NAME_LABEL.to_owned(), node),
            (POD_OWNER_LABEL.to_owned(), owner.to_owned()),
        ]
        .into())
    }

    /// The node and uid of a stored pod.
    async fn placement(&self, namespace: &str, name: &str) -> Result<(String, String), Status> {
        let key = ObjectKey::new(rigger_api::pod::KIND, namespace_or_default(namespace), name);
        let pod: Pod = self
            .store
            .get(key.clone())
            .await
            .map_err(store_status)?
            .and_then(|s| serde_json::from_slice(&s.object).ok())
            .ok_or_else(|| Status::not_found(format!("{key}: not found")))?;
        match (pod.spec.node_name, pod.metadata.uid) {
            (Some(node), Some(uid)) => Ok((node, uid)),
            _ => Err(Status::failed_precondition(format!(
                "{key}: not placed on a node"
            ))),
        }
    }

    /// The ready node matching the pod's nodeSelector that runs the fewest pods.
    async fn place(&self, pod: &Pod) -> Result<String, FieldError> {
        let mut pods_per_node: std::collections::HashMap<String, usize> =
            std::collections::HashMap::new();
        let stored =
            self.store.list(rigger_api::pod::KIND).await.map_err(|e| {
                FieldError::new("spec.nodeName", format!("cannot place the pod: {e}"))
            })?;
        for other in stored {
            if let Ok(other) = serde_json::from_slice::<Pod>(&other.object)
                && let Some(node) = other.spec.node_name
            {
                *pods_per_node.entry(node).or_default() += 1;
            }
        }
        let selector = rigger_api::LabelSelector {
            match_labels: pod.spec.node_selector.clone(),
            match_expressions: Vec::new(),
        };
        self.nodes
            .views(SystemTime::now(), self.node_timeout)
            .into_iter()
            .filter(|(_, view)| view.not_ready.is_none() && selector.matches(&view.labels))
            .map(|(name, _)| (pods_per_node.get(&name).copied().unwrap_or(0), name))
            .min()
            .map(|(_, name)| name)
            .ok_or_else(|| {
                FieldError::new(
                    "spec.nodeSelector",
                    "no ready node matches (set spec.nodeName, or start an agent with matching --node-labels)",
                )
            })
    }

    /// One stored object as the API shows it (job with status, secret redacted).
    async fn show(&self, kind: Kind, stored: crate::store::Stored) -> Result<Object, Status> {
        let json = match kind {
            Kind::ImagePullJob => {
                let mut job: ImagePullJob = serde_json::from_slice(&stored.object)
                    .map_err(|e| Status::internal(format!("{}: unreadable: {e}", stored.key)))?;
                let held = self.jobs.status_of(&stored.key, stored.revision);
                job.status = Some(match held {
                    Some(status) => status,
                    None => crate::job_status::read(&self.store, &stored.key)
                        .await
                        .map_err(store_status)?
                        .map(|(status, _)| status)
                        .unwrap_or_default(),
                });
                to_json(&job)?
            }
            Kind::Secret => {
                let secret: Secret = serde_json::from_slice(&stored.object)
                    .map_err(|e| Status::internal(format!("{}: unreadable: {e}", stored.key)))?;
                to_json(&secret.redacted())?
            }
            Kind::Pod => {
                let mut pod: serde_json::Value = serde_json::from_slice(&stored.object)
                    .map_err(|e| Status::internal(format!("{}: unreadable: {e}", stored.key)))?;
                if let Some(status) = self
                    .store
                    .get(crate::pods::status_key(&stored.key))
                    .await
                    .map_err(store_status)?
                    .and_then(|s| serde_json::from_slice::<serde_json::Value>(&s.object).ok())
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
                let mut request: serde_json::Value = serde_json::from_slice(&stored.object)
                    .map_err(|e| Status::internal(format!("{}: unreadable: {e}", stored.key)))?;
                request["status"] = self
                    .store
                    .get(crate::recreates::status_key(&stored.key))
                    .await
                    .map_err(store_status)?
                    .and_then(|s| serde_json::from_slice::<serde_json::Value>(&s.object).ok())
                    .unwrap_or_else(|| serde_json::json!({"phase": "Pending"}));
                request.to_string()
            }
            Kind::SidecarSet => {
                let mut set: rigger_api::sidecar_set::SidecarSet =
                    serde_json::from_slice(&stored.object).map_err(|e| {
                        Status::internal(format!("{}: unreadable: {e}", stored.key))
                    })?;
                set.status = Some(self.sidecar_set_status(&set).await?);
                to_json(&set)?
            }
            Kind::Node | Kind::LifecycleCooperator => {
                String::from_utf8_lossy(&stored.object).into_owned()
            }
        };
        Ok(Object {
            json,
            revision: stored.revision,
        })
    }

    async fn get_object(&self, kind: Kind, namespace: &str, name: &str) -> Result<Object, Status> {
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
}

/// `Kind namespace/name` of a document, for refusals before it is decoded.
fn object_name(value: &serde_json::Value) -> String {
    let kind = value["kind"].as_str().unwrap_or("object");
    let name = value["metadata"]["name"].as_str().unwrap_or("(unnamed)");
    let namespace = value["metadata"]["namespace"]
        .as_str()
        .unwrap_or(DEFAULT_NAMESPACE);
    format!("{kind} {namespace}/{name}")
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        self.leadership.require()?;
        let user = self.admit(&request, Role::Admin)?;
        let request = request.into_inner();
        if request.json.len() > MAX_OBJECT_BYTES {
            return Err(Status::invalid_argument(format!(
                "object is {} bytes; at most {MAX_OBJECT_BYTES} are accepted",
                request.json.len()
            )));
        }
        let value: serde_json::Value = serde_json::from_str(&request.json)
            .map_err(|e| Status::invalid_argument(format!("the object is not JSON: {e}")))?;
        let kind_text = value["kind"].as_str().ok_or_else(|| {
            Status::invalid_argument(format!("{}: kind: is required", object_name(&value)))
        })?;
        let kind = kind_of(kind_text)?;
        if kind.name() != kind_text {
            return Err(Status::invalid_argument(format!(
                "{}: kind: {kind_text:?}: expected {}",
                object_name(&value),
                kind.name()
            )));
        }
        tracing::debug!(%user, kind = %kind, dry_run = request.dry_run, "apply");
        let response = match kind {
            Kind::ImagePullJob => self.apply_image_pull_job(value, request.dry_run).await?,
            Kind::Secret => self.apply_secret(value, request.dry_run).await?,
            Kind::Pod => self.apply_pod(value, request.dry_run).await?,
            Kind::ContainerRecreateRequest => self.apply_crr(value, request.dry_run).await?,
            Kind::LifecycleCooperator => self.apply_cooperator(value, request.dry_run).await?,
            Kind::SidecarSet => self.apply_sidecar_set(value, request.dry_run).await?,
            Kind::Node => {
                return Err(Status::invalid_argument(
                    "Node objects are not applied: a node exists while its agent is registered",
                ));
            }
        };
        Ok(Response::new(response))
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<Object>, Status> {
        self.leadership.require()?;
        self.admit(&request, Role::Viewer)?;
        let request = request.into_inner();
        let kind = kind_of(&request.kind)?;
        let namespace = if kind.namespaced() {
            namespace_or_default(&request.namespace)
        } else {
            ""
        };
        Ok(Response::new(
            self.get_object(kind, namespace, &request.name).await?,
        ))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        self.leadership.require()?;
        self.admit(&request, Role::Viewer)?;
        let request = request.into_inner();
        let kind = kind_of(&request.kind)?;
        if kind == Kind::Node {
            let items = self
                .nodes
                .objects(SystemTime::now(), self.node_timeout)
                .into_iter()
                .map(|n| Object {
                    json: n.to_string(),
                    revision: 0,
                })
                .collect();
            return Ok(Response::new(ListResponse { items }));
        }
        let mut items = Vec::new();
        for stored in self.store.list(kind.name()).await.map_err(store_status)? {
            if request.namespace.is_empty()
                || !kind.namespaced()
                || stored.key.namespace == request.namespace
            {
                items.push(self.show(kind, stored).await?);
            }
        }
        Ok(Response::new(ListResponse { items }))
    }

    async fn logs(&self, request: Request<PodLogsRequest>) -> Result<Response<PodOutput>, Status> {
        self.leadership.require()?;
        self.admit(&request, Role::Viewer)?;
        let request = request.into_inner();
        let (node, uid) = self.placement(&request.namespace, &request.name).await?;
        let answer = self
            .pods
            .ask(
                &node,
                agent_request::Kind::Logs(ContainerLogs {
                    pod_uid: uid,
                    container: request.container,
                    tail_lines: request.tail_lines,
                }),
                Duration::from_secs(30),
            )
            .await?;
        Ok(Response::new(PodOutput {
            stdout: answer.stdout,
            stderr: answer.stderr,
            exit_code: answer.exit_code,
        }))
    }

    async fn label(&self, request: Request<LabelRequest>) -> Result<Response<Object>, Status> {
        self.leadership.require()?;
        let user = self.admit(&request, Role::Admin)?;
        let request = request.into_inner();
        if kind_of(&request.kind)? != Kind::Node {
            return Err(Status::invalid_argument(format!(
                "{}: riggerctl label sets labels on nodes; other objects take theirs from apply",
                request.kind
            )));
        }
        if !self.nodes.knows(&request.name) {
            return Err(Status::not_found(format!(
                "node {:?} not found (no agent of that name registered)",
                request.name
            )));
        }
        let change = crate::node_labels::LabelChange {
            set: request.set.into_iter().collect(),
            remove: request.remove,
            overwrite: request.overwrite,
        };
        let labels = crate::node_labels::save(&self.store, &request.name, &change)
            .await
            .map_err(store_status)?
            .map_err(Status::invalid_argument)?;
        tracing::info!(%user, node = %request.name, ?labels, "node labelled");
        self.nodes.set_node_admin_labels(&request.name, labels);
        self.jobs.wake();
        Ok(Response::new(
            self.get_object(Kind::Node, "", &request.name).await?,
        ))
    }

    async fn exec(&self, request: Request<PodExecRequest>) -> Result<Response<PodOutput>, Status> {
        self.leadership.require()?;
        let user = self.admit(&request, Role::Admin)?;
        let request = request.into_inner();
        if request.command.is_empty() {
            return Err(Status::invalid_argument("command: is required"));
        }
        let (node, uid) = self.placement(&request.namespace, &request.name).await?;
        tracing::info!(%user, pod = %request.name, %node, "exec");
        let timeout = u64::from(request.timeout_seconds.clamp(1, 3600));
        let answer = self
            .pods
            .ask(
                &node,
                agent_request::Kind::Exec(ContainerExec {
                    pod_uid: uid,
                    container: request.container,
                    command: request.command,
                    timeout_seconds: u32::try_from(timeout).unwrap_or(u32::MAX),
                }),
                Duration::from_secs(timeout + 10),
            )
            .await?;
        Ok(Response::new(PodOutput {
            stdout: answer.stdout,
            stderr: answer.stderr,
            exit_code: answer.exit_code,
        }))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        self.leadership.require()?;
        let user = self.admit(&request, Role::Admin)?;
        let request = request.into_inner();
        let kind = kind_of(&request.kind)?;
        if kind == Kind::Node {
            return Err(Status::invalid_argument(
                "Node objects are not deleted: a node leaves when its agent stops",
            ));
        }
        let namespace = if kind.namespaced() {
            namespace_or_default(&request.namespace)
        } else {
            ""
        };
        let key = ObjectKey::new(kind.name(), namespace, &request.name);
        // A pod's node is told once it is gone, so its agent stops it.
        let pod_node = match kind {
            Kind::Pod => self
                .store
                .get(key.clone())
                .await
                .map_err(store_status)?
                .and_then(|s| serde_json::from_slice::<Pod>(&s.object).ok())
                .and_then(|p| p.spec.node_name),
            _ => None,
        };
        self.store
            .delete(key.clone(), Precondition::Any)
            .await
            .map_err(store_status)?;
        tracing::info!(object = %key, %user, "deleted");
        if let Some(node) = pod_node {
            let _ = self
                .store
                .delete(crate::pods::status_key(&key), Precondition::Any)
                .await;
            self.pods.send_to(&node).await;
        }
        match kind {
            Kind::ImagePullJob => self.jobs.wake(),
            Kind::ContainerRecreateRequest => self.recreates.wake(),
            Kind::LifecycleCooperator => self.pods.send_to_all().await,
            _ => {}
        }
        Ok(Response::new(DeleteResponse {}))
    }
}
