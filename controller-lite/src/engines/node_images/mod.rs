//! Kruise's daemon's part, done by Rigger's agents: each node's NodeImage (written by
//! Kruise's manager, or anyone with the right to) asks for image tags; the node's agent
//! pulls them, and the NodeImage's status is written as Kruise's daemon writes it
//! (counts, and each tag's phase, progress, imageID, times and version).
//!
//! The decisions are in [`decide`]; this module reads NodeImages and secrets from the
//! store, sends the agents their tasks, takes their reports and writes the statuses.
//!
//! Pull secrets are read from [`DAEMON_SECRETS_NAMESPACE`] only, where Kruise's manager
//! copies a job's secrets for its daemon (the fix of CVE-2024-36532): a NodeImage that
//! names a secret elsewhere cannot make a node's agent receive it.

pub mod decide;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rigger_api::image_pull_job::NodePullPhase;
use rigger_api::node_image::{self, NodeImage, NodeImageSpec, NodeImageStatus};
use rigger_api::secret::{self, Secret};
use rigger_proto::v1::{
    CancelTask, ControllerMessage, PullImage, Task, TaskStatus, controller_message, task,
};
use tokio::sync::Notify;

use crate::fleet::nodes::NodeRegistry;
use decide::{PullKey, TagPull};
use rigger_store::{ObjectKey, Precondition, Store, StoreError};

pub use decide::TASK_PREFIX;

/// Where Kruise's manager puts the pull secrets its daemon may read.
pub const DAEMON_SECRETS_NAMESPACE: &str = "kruise-daemon-config";
/// The store kind of a NodeImage's status (its status subresource in a cluster).
pub const STATUS_KIND: &str = "NodeImage.status";
/// Tags pulled at once on one node.
const PER_NODE: usize = 4;
const TICK: Duration = Duration::from_millis(500);

pub fn is_node_image_task(id: &str) -> bool {
    id.starts_with(TASK_PREFIX)
}

#[derive(Debug, Default)]
struct State {
    pulls: BTreeMap<PullKey, TagPull>,
    /// Task id → its tag.
    tasks: HashMap<String, PullKey>,
    /// Nodes whose status is to be written.
    dirty: BTreeSet<String>,
    /// Nodes whose stored status was read (once, after a start).
    loaded: HashSet<String>,
    /// Nodes that have a NodeImage that decodes (as of the last pass): only theirs get
    /// a status.
    with_node_image: HashSet<String>,
    /// Each node's NodeImage as last taken in, by store revision (decoded or held): a
    /// pass reads again only the NodeImages that changed since.
    revisions: HashMap<String, u64>,
    /// A pass has taken the NodeImages in.
    passed: bool,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    nodes: NodeRegistry,
    node_timeout: Duration,
    state: Mutex<State>,
    wake: Notify,
    /// Where each tag's pull that ends is told, as Kruise's daemon tells it.
    events: Arc<dyn crate::events::EventSink>,
}

/// The engine; cheap to clone.
#[derive(Debug, Clone)]
pub struct NodeImageEngine {
    inner: Arc<Inner>,
}

/// What one pass reads: the NodeImages that changed since the last pass.
#[derive(Debug)]
pub struct NodeImageSnapshot {
    /// Nodes whose NodeImage changed, and its spec.
    changed: Vec<(String, NodeImageSpec)>,
    /// Nodes whose NodeImage changed and does not decode: their pulls are left as they are.
    held: Vec<String>,
    /// Nodes whose NodeImage is gone.
    gone: Vec<String>,
    /// The revisions of the changed and held ones.
    revisions: Vec<(String, u64)>,
    /// Stored statuses of nodes seen for the first time.
    previous: BTreeMap<String, NodeImageStatus>,
    /// Docker config documents of the secrets the pulls name.
    secrets: HashMap<(String, String), Result<String, String>>,
}

impl NodeImageEngine {
    pub fn new(
        store: Store,
        nodes: NodeRegistry,
        node_timeout: Duration,
        events: Arc<dyn crate::events::EventSink>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                nodes,
                node_timeout,
                state: Mutex::default(),
                wake: Notify::new(),
                events,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change under the lock is a field write; a panic cannot leave it torn.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// An agent (re)registered: its NodeImage tasks are sent again (it knows them by id
    /// and reports their outcome), and the statuses it holds are taken.
    pub fn node_connected(&self, node: &str, statuses: &[TaskStatus]) {
        {
            let mut state = self.lock();
            for ((owner, ..), pull) in &mut state.pulls {
                if owner == node && pull.task.is_some() {
                    pull.sent = false;
                }
            }
            // Its status is written from now on (see `flush`), if it has a NodeImage.
            if state.with_node_image.contains(node) {
                state.dirty.insert(node.to_owned());
            }
        }
        for status in statuses {
            self.report(node, status);
        }
        self.wake();
    }

    /// A task status from `node`'s agent.
    pub fn report(&self, node: &str, status: &TaskStatus) {
        let mut state = self.lock();
        let State {
            pulls,
            tasks,
            dirty,
            ..
        } = &mut *state;
        let Some(key) = tasks.get(&status.id) else {
            return;
        };
        if key.0 != node {
            tracing::warn!(%node, task = %status.id, "report for a task of another node refused");
            return;
        }
        let key = key.clone();
        let Some(pull) = pulls.get_mut(&key) else {
            return;
        };
        let before = pull.status.phase;
        if decide::fold(pull, &key.1, status, SystemTime::now()) {
            dirty.insert(key.0.clone());
            if pull.task.is_none() {
                tasks.remove(&status.id);
            }
            let phase = pull.status.phase;
            let ended = (before != phase
                && matches!(phase, NodePullPhase::Succeeded | NodePullPhase::Failed))
            .then(|| {
                let regarding = crate::events::Regarding {
                    api_version: rigger_api::fields::KRUISE_API_VERSION_V1BETA1.to_owned(),
                    kind: node_image::KIND.to_owned(),
                    namespace: String::new(),
                    name: key.0.clone(),
                    uid: String::new(),
                };
                let failed = (phase == NodePullPhase::Failed).then(|| pull.status.message.clone());
                crate::events::pull_ended(
                    regarding,
                    &key.0,
                    &decide::reference(&key.1, &key.2),
                    failed.as_deref(),
                )
            });
            drop(state);
            if let Some(event) = ended {
                self.inner.events.record(event);
            }
            self.wake();
        }
    }

    /// The docker config documents of the secrets named by `changed` specs and by the
    /// pulls not finished: read afresh each pass, so an edited secret reaches the next
    /// task.
    async fn read_secrets(
        &self,
        changed: &[(String, NodeImageSpec)],
    ) -> HashMap<(String, String), Result<String, String>> {
        let mut named: HashSet<(String, String)> = changed
            .iter()
            .flat_map(|(_, spec)| spec.images.values())
            .flat_map(|image| image.pull_secrets.iter())
            .map(|reference| (reference.namespace.clone(), reference.name.clone()))
            .collect();
        named.extend(
            self.lock()
                .pulls
                .values()
                .filter(|pull| !pull.finished())
                .flat_map(|pull| pull.secrets.iter())
                .map(|reference| (reference.namespace.clone(), reference.name.clone())),
        );
        let mut secrets = HashMap::new();
        for id in named {
            let document = if id.0 == DAEMON_SECRETS_NAMESPACE {
                match self
                    .inner
                    .store
                    .get_as::<Secret>(ObjectKey::new(secret::KIND, &id.0, &id.1))
                    .await
                {
                    Ok(Some(found)) => found
                        .value
                        .docker_config()
                        .unwrap_or_else(|| Err("is empty".to_owned())),
                    Ok(None) => Err("does not exist".to_owned()),
                    Err(error) => Err(format!("cannot be read: {error}")),
                }
            } else {
                Err(format!(
                    "is outside {DAEMON_SECRETS_NAMESPACE}, the only namespace node pulls take secrets from"
                ))
            };
            secrets.insert(id, document);
        }
        secrets
    }

    /// Send every tag due to start, and again those whose node reconnected.
    fn dispatch(&self, secrets: &HashMap<(String, String), Result<String, String>>) {
        let now = SystemTime::now();
        let ready: HashSet<String> = self
            .inner
            .nodes
            .readiness(now, self.inner.node_timeout)
            .into_iter()
            .filter(|(_, not_ready)| not_ready.is_none())
            .map(|(name, _)| name)
            .collect();
        let mut state = self.lock();
        let State {
            pulls,
            tasks,
            dirty,
            ..
        } = &mut *state;
        let starting = decide::to_start(pulls, &ready, now, PER_NODE);
        for key in starting {
            let Some(pull) = pulls.get_mut(&key) else {
                continue;
            };
            let (configs, refused) = docker_configs(pull, secrets);
            if let Some(reason) = refused {
                pull.status.phase = rigger_api::image_pull_job::NodePullPhase::Failed;
                pull.status.message = reason;
                dirty.insert(key.0.clone());
                continue;
            }
            let id = decide::task_id(&key, pull.version, pull.attempts + 1);
            let message = pull_message(&key, pull, &id, configs);
            if self.inner.nodes.send(&key.0, message) {
                decide::started(pull, id.clone(), now);
                tasks.insert(id, key.clone());
                dirty.insert(key.0.clone());
            }
        }
        // Tasks in flight whose node came back, or whose time limit changed: sent again
        // under the same id (the agent runs a task id once, reports it again, and takes
        // a new limit), with their secrets (an agent that restarted waits for them).
        for (key, pull) in pulls.iter_mut() {
            if let (Some(id), false) = (pull.task.clone(), pull.sent)
                && ready.contains(&key.0)
            {
                let (configs, _) = docker_configs(pull, secrets);
                let message = pull_message(key, pull, &id, configs);
                pull.sent = self.inner.nodes.send(&key.0, message);
            }
        }
    }

    /// Write the statuses of nodes that changed; a failed write is tried next pass. As
    /// Kruise's daemon writes only its own node's, only nodes whose agent ever registered
    /// here get a status: a NodeImage of a node without Rigger is left to whoever
    /// serves it.
    async fn flush(&self) {
        let writes: Vec<(String, NodeImageStatus)> = {
            let mut state = self.lock();
            let dirty = std::mem::take(&mut state.dirty);
            dirty
                .into_iter()
                .filter(|node| state.with_node_image.contains(node) && self.inner.nodes.knows(node))
                .map(|node| {
                    let status = decide::node_status(&state.pulls, &node);
                    (node, status)
                })
                .collect()
        };
        for (node, status) in writes {
            let key = ObjectKey::new(STATUS_KIND, "", &node);
            let result = match rigger_store::typed::encode(&key, &status) {
                Ok(bytes) => self.inner.store.put(key, bytes, Precondition::Any).await,
                Err(error) => Err(error),
            };
            match result {
                Ok(_) => {}
                // Its NodeImage was deleted meanwhile: nothing to write to.
                Err(StoreError::NotFound { .. }) => {}
                Err(error) => {
                    tracing::warn!(%node, %error, "cannot write the NodeImage's status");
                    self.lock().dirty.insert(node);
                }
            }
        }
    }
}

/// The docker configs of `pull`'s secrets as read, and why one cannot be used, if so.
fn docker_configs(
    pull: &TagPull,
    secrets: &HashMap<(String, String), Result<String, String>>,
) -> (Vec<String>, Option<String>) {
    let mut configs = Vec::new();
    let mut refused = None;
    for reference in &pull.secrets {
        match secrets.get(&(reference.namespace.clone(), reference.name.clone())) {
            Some(Ok(document)) => configs.push(document.clone()),
            Some(Err(reason)) => {
                refused = Some(format!(
                    "pull secret {}/{} {reason}",
                    reference.namespace, reference.name
                ));
            }
            None => refused = Some("pull secrets not read yet".to_owned()),
        }
    }
    (configs, refused)
}

fn pull_message(
    key: &PullKey,
    pull: &TagPull,
    id: &str,
    docker_configs: Vec<String>,
) -> ControllerMessage {
    ControllerMessage {
        message: Some(controller_message::Message::Task(Task {
            id: id.to_owned(),
            node_name: key.0.clone(),
            work: Some(task::Work::PullImage(PullImage {
                image: decide::reference(&key.1, &key.2),
                always: false,
                timeout_seconds: u32::try_from(pull.timeout().as_secs()).unwrap_or(u32::MAX),
                docker_configs,
                peers: Vec::new(),
            })),
        })),
    }
}

fn cancel(id: &str, reason: &str) -> ControllerMessage {
    ControllerMessage {
        message: Some(controller_message::Message::CancelTask(CancelTask {
            id: id.to_owned(),
            reason: reason.to_owned(),
        })),
    }
}

impl crate::engines::Engine for NodeImageEngine {
    const NAME: &'static str = "node images";
    const TICK: Duration = TICK;
    const WATCHES: &'static [&'static str] = &[node_image::KIND];
    type Snapshot = NodeImageSnapshot;

    fn wake_signal(&self) -> &Notify {
        &self.inner.wake
    }

    async fn observe(&self) -> Result<NodeImageSnapshot, StoreError> {
        // Read-only to Rigger's own API (no `Object`), so listed by kind; only what
        // changed since the last pass is decoded (with thousands of nodes, decoding
        // every NodeImage twice a second was a quarter of the leader's CPU). A NodeImage
        // this release cannot read (a newer one wrote it) holds its node: its pulls stay
        // as they are, and its status is not written.
        let known = |key: &ObjectKey, revision: u64| {
            self.lock().revisions.get(&key.name) == Some(&revision)
        };
        let listing = self
            .inner
            .store
            .list_changed(node_image::KIND, &known)
            .await?;
        let mut snapshot = NodeImageSnapshot {
            changed: Vec::new(),
            held: Vec::new(),
            gone: Vec::new(),
            revisions: Vec::new(),
            previous: BTreeMap::new(),
            secrets: HashMap::new(),
        };
        for stored in listing.changed {
            let node = stored.key.name.clone();
            snapshot.revisions.push((node.clone(), stored.revision));
            match rigger_store::typed::decode::<NodeImage>(stored) {
                Ok(image) => snapshot.changed.push((node, image.value.spec)),
                Err(error) => {
                    tracing::debug!(%node, %error, "a NodeImage does not decode; its node's pulls are left as they are");
                    snapshot.held.push(node);
                }
            }
        }
        let unseen: Vec<String> = {
            let state = self.lock();
            let present: HashSet<&str> = listing
                .present
                .iter()
                .map(|(key, _)| key.name.as_str())
                .collect();
            snapshot.gone = state
                .revisions
                .keys()
                .filter(|node| !present.contains(node.as_str()))
                .cloned()
                .collect();
            snapshot
                .changed
                .iter()
                .map(|(node, _)| node.clone())
                .filter(|node| !state.loaded.contains(node))
                .collect()
        };
        for node in unseen {
            let key = ObjectKey::new(STATUS_KIND, "", &node);
            match self.inner.store.get_as::<NodeImageStatus>(key).await {
                Ok(Some(status)) => {
                    snapshot.previous.insert(node, status.value);
                }
                // A status is a report of the pulls, written again from them: one that
                // does not decode (none yet, or Kruise's daemon's before a migration) is
                // started afresh. Only a NodeImage's spec holds its node.
                Ok(None) | Err(StoreError::Undecodable { .. }) => {
                    snapshot.previous.insert(node, NodeImageStatus::default());
                }
                Err(error) => return Err(error),
            }
        }
        snapshot.secrets = self.read_secrets(&snapshot.changed).await;
        Ok(snapshot)
    }

    async fn pass(&self, snapshot: NodeImageSnapshot) {
        let cancels = {
            let mut state = self.lock();
            let state = &mut *state;
            let synced = decide::sync(
                &mut state.pulls,
                &snapshot.changed,
                &snapshot.gone,
                &snapshot.previous,
            );
            // Taken in only now that the pulls are synced: a pass that stopped short
            // leaves these NodeImages to be read again.
            state.loaded.extend(snapshot.previous.keys().cloned());
            state.revisions.extend(snapshot.revisions);
            for node in &snapshot.gone {
                state.revisions.remove(node);
                state.with_node_image.remove(node);
                // A NodeImage made again under this name starts from its own status.
                state.loaded.remove(node);
            }
            for node in &snapshot.held {
                state.with_node_image.remove(node);
            }
            for (node, _) in &snapshot.changed {
                // Back (it decodes again, or was made again) after the first pass: its
                // status is written from the pulls, not left to the next report. At the
                // start, agents' registrations mark theirs.
                if state.with_node_image.insert(node.clone()) && state.passed {
                    state.dirty.insert(node.clone());
                }
            }
            state.passed = true;
            state.dirty.extend(synced.dirty);
            for (_, task) in &synced.cancel {
                state.tasks.remove(task);
            }
            synced.cancel
        };
        for (node, task) in cancels {
            self.inner.nodes.send(
                &node,
                cancel(&task, "the NodeImage no longer asks for this tag"),
            );
        }
        self.dispatch(&snapshot.secrets);
        self.flush().await;
    }

    async fn finish(&self) {
        self.flush().await;
    }
}
