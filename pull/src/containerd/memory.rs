//! What containerd would hold after a pull, without a containerd: content (committed
//! blobs with their labels), ingests (resumable, locked while a stream writes them,
//! verified at commit), leases, image records, and an overlayfs-like snapshotter whose
//! snapshots are directories under `root` (a base layer's mount is a bind mount of its
//! directory; a layer above, an overlay mount with `upperdir=` and `lowerdir=`). It
//! answers as containerd does where the pipeline tells answers apart: `AlreadyExists`,
//! `NotFound`, a locked ingest, "unexpected commit digest".
//!
//! For tests of the pull engine, and of what drives it, without a lab.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use sha2::{Digest as _, Sha256};
use tonic::Status;

use super::{
    Call, Containerd, Descriptor, ImageRecord, Ingest, IngestMessage, Labels, LeaseResource, Mount,
    Scope,
};

/// A committed blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub data: Bytes,
    pub labels: Labels,
}

/// A snapshot, as the snapshotter keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub parent: Option<String>,
    pub committed: bool,
    pub labels: Labels,
    /// Where its files are.
    pub dir: PathBuf,
}

#[derive(Debug, Default)]
struct IngestState {
    data: Vec<u8>,
    locked: bool,
}

/// Everything held, by namespace (ingests and snapshots also by their keys).
#[derive(Debug, Default, Clone)]
pub struct Held {
    pub content: BTreeMap<(String, String), Blob>,
    pub images: BTreeMap<(String, String), ImageRecord>,
    /// (namespace, snapshotter, key or name) → snapshot.
    pub snapshots: BTreeMap<(String, String, String), Snapshot>,
    pub leases: BTreeMap<(String, String), Labels>,
    /// Ingests left (namespace, ref) and how many bytes each holds.
    pub ingests: BTreeMap<(String, String), usize>,
}

#[derive(Debug, Default)]
struct State {
    held: Held,
    ingests: HashMap<(String, String), IngestState>,
    next_snapshot: u64,
}

/// An in-memory containerd with its snapshots under `root`.
#[derive(Debug)]
pub struct Memory {
    root: PathBuf,
    state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn key(namespace: &str, name: &str) -> (String, String) {
    (namespace.to_owned(), name.to_owned())
}

impl Memory {
    /// Snapshots' directories go under `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            state: Arc::default(),
        }
    }

    /// What is held now.
    pub fn held(&self) -> Held {
        let state = lock(&self.state);
        let mut held = state.held.clone();
        held.ingests = state
            .ingests
            .iter()
            .map(|(k, i)| (k.clone(), i.data.len()))
            .collect();
        held
    }

    fn ready<'a, T: Send + 'a>(value: Result<T, Status>) -> Call<'a, T> {
        Box::pin(async move { value })
    }
}

/// The mounts a snapshot is used through: a bind mount of a base layer's directory, an
/// overlay of the directories below for one with parents.
fn mounts(state: &State, namespace: &str, snapshotter: &str, snapshot: &Snapshot) -> Vec<Mount> {
    let mut lowers = Vec::new();
    let mut parent = snapshot.parent.clone();
    while let Some(name) = parent {
        let Some(below) =
            state
                .held
                .snapshots
                .get(&(namespace.to_owned(), snapshotter.to_owned(), name.clone()))
        else {
            break;
        };
        lowers.push(below.dir.display().to_string());
        parent = below.parent.clone();
    }
    if lowers.is_empty() {
        return vec![Mount {
            kind: "bind".to_owned(),
            source: snapshot.dir.display().to_string(),
            options: vec!["rbind".to_owned(), "rw".to_owned()],
        }];
    }
    vec![Mount {
        kind: "overlay".to_owned(),
        source: "overlay".to_owned(),
        options: vec![
            format!("upperdir={}", snapshot.dir.display()),
            format!("lowerdir={}", lowers.join(":")),
        ],
    }]
}

impl Containerd for Memory {
    fn lease_create<'a>(&'a self, namespace: &'a str, id: &'a str, labels: Labels) -> Call<'a, ()> {
        let mut state = lock(&self.state);
        let result = match state.held.leases.insert(key(namespace, id), labels) {
            Some(_) => Err(Status::already_exists(format!("lease {id} exists"))),
            None => Ok(()),
        };
        Self::ready(result)
    }

    fn lease_delete<'a>(&'a self, namespace: &'a str, id: &'a str) -> Call<'a, ()> {
        let mut state = lock(&self.state);
        let result = match state.held.leases.remove(&key(namespace, id)) {
            Some(_) => Ok(()),
            None => Err(Status::not_found(format!("lease {id}"))),
        };
        Self::ready(result)
    }

    fn leases<'a>(&'a self, namespace: &'a str) -> Call<'a, Vec<String>> {
        let state = lock(&self.state);
        let ids = state
            .held
            .leases
            .keys()
            .filter(|(ns, _)| ns == namespace)
            .map(|(_, id)| id.clone())
            .collect();
        Self::ready(Ok(ids))
    }

    fn lease_resources<'a>(
        &'a self,
        _namespace: &'a str,
        _id: &'a str,
    ) -> Call<'a, Vec<LeaseResource>> {
        Self::ready(Ok(Vec::new()))
    }

    fn lease_delete_resource<'a>(
        &'a self,
        _namespace: &'a str,
        _id: &'a str,
        _resource: LeaseResource,
    ) -> Call<'a, ()> {
        Self::ready(Ok(()))
    }

    fn content_info<'a>(
        &'a self,
        scope: Scope<'a>,
        digest: &'a str,
    ) -> Call<'a, Option<(u64, Labels)>> {
        let state = lock(&self.state);
        let info = state
            .held
            .content
            .get(&key(scope.namespace, digest))
            .map(|b| (b.data.len() as u64, b.labels.clone()));
        Self::ready(Ok(info))
    }

    fn content_add_labels<'a>(
        &'a self,
        scope: Scope<'a>,
        digest: &'a str,
        labels: Labels,
    ) -> Call<'a, ()> {
        let mut state = lock(&self.state);
        let result = match state.held.content.get_mut(&key(scope.namespace, digest)) {
            Some(blob) => {
                blob.labels.extend(labels);
                Ok(())
            }
            None => Err(Status::not_found(format!("content {digest}"))),
        };
        Self::ready(result)
    }

    fn content_read<'a>(
        &'a self,
        scope: Scope<'a>,
        digest: &'a str,
        offset: u64,
        size: u64,
    ) -> Call<'a, futures::stream::BoxStream<'static, Result<Bytes, Status>>> {
        let state = lock(&self.state);
        let result = match state.held.content.get(&key(scope.namespace, digest)) {
            Some(blob) => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(blob.data.len());
                let end = match size {
                    0 => blob.data.len(),
                    n => start
                        .saturating_add(usize::try_from(n).unwrap_or(usize::MAX))
                        .min(blob.data.len()),
                };
                let data = blob.data.slice(start..end);
                let pieces: Vec<Result<Bytes, Status>> = (0..data.len())
                    .step_by(64 << 10)
                    .map(|at| Ok(data.slice(at..(at + (64 << 10)).min(data.len()))))
                    .collect();
                Ok(futures::stream::iter(pieces).boxed())
            }
            None => Err(Status::not_found(format!("content {digest}"))),
        };
        Self::ready(result)
    }

    fn ingest_open<'a>(
        &'a self,
        scope: Scope<'a>,
        reference: &'a str,
        total: u64,
        expected: &'a str,
    ) -> Call<'a, Box<dyn Ingest>> {
        let mut state = lock(&self.state);
        let namespace = scope.namespace;
        let result = if state.held.content.contains_key(&key(namespace, expected)) {
            Err(Status::already_exists(format!(
                "content {expected}: already exists"
            )))
        } else {
            let ingest = state.ingests.entry(key(namespace, reference)).or_default();
            if ingest.locked {
                Err(Status::unavailable(format!("ref {reference} locked")))
            } else {
                ingest.locked = true;
                let offset = ingest.data.len() as u64;
                Ok(Box::new(MemoryIngest {
                    state: self.state.clone(),
                    namespace: namespace.to_owned(),
                    reference: reference.to_owned(),
                    total,
                    expected: expected.to_owned(),
                    answers: VecDeque::from([Ok(offset)]),
                    closed: false,
                }) as Box<dyn Ingest>)
            }
        };
        Self::ready(result)
    }

    fn ingest_abort<'a>(&'a self, scope: Scope<'a>, reference: &'a str) -> Call<'a, ()> {
        let mut state = lock(&self.state);
        let result = match state.ingests.remove(&key(scope.namespace, reference)) {
            Some(_) => Ok(()),
            None => Err(Status::not_found(format!("ingest {reference}"))),
        };
        Self::ready(result)
    }

    fn content_root(&self) -> Call<'_, Option<std::path::PathBuf>> {
        // Its ingests are not containerd's files.
        Self::ready(Ok(None))
    }

    fn snapshotter_root<'a>(&'a self, _: &'a str) -> Call<'a, Option<std::path::PathBuf>> {
        Self::ready(Ok(None))
    }

    fn image_get<'a>(&'a self, namespace: &'a str, name: &'a str) -> Call<'a, Option<ImageRecord>> {
        let state = lock(&self.state);
        Self::ready(Ok(state.held.images.get(&key(namespace, name)).cloned()))
    }

    fn image_put<'a>(&'a self, scope: Scope<'a>, image: ImageRecord) -> Call<'a, ()> {
        let mut state = lock(&self.state);
        state
            .held
            .images
            .insert(key(scope.namespace, &image.name), image);
        Self::ready(Ok(()))
    }

    fn snapshot_prepare<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        key: &'a str,
        parent: Option<&'a str>,
        labels: Labels,
    ) -> Call<'a, Vec<Mount>> {
        let mut state = lock(&self.state);
        let at = |name: &str| {
            (
                scope.namespace.to_owned(),
                snapshotter.to_owned(),
                name.to_owned(),
            )
        };
        // containerd's unpacker: a snapshot whose ref label names one that exists.
        let target_exists = labels
            .get(super::SNAPSHOT_REF_LABEL)
            .is_some_and(|target| state.held.snapshots.contains_key(&at(target)));
        if target_exists || state.held.snapshots.contains_key(&at(key)) {
            return Self::ready(Err(Status::already_exists(format!(
                "snapshot {key}: already exists"
            ))));
        }
        if let Some(parent) = parent
            && !state
                .held
                .snapshots
                .get(&at(parent))
                .is_some_and(|p| p.committed)
        {
            return Self::ready(Err(Status::not_found(format!(
                "parent snapshot {parent} does not exist or is not committed"
            ))));
        }
        state.next_snapshot += 1;
        let dir = self
            .root
            .join("snapshots")
            .join(state.next_snapshot.to_string())
            .join("fs");
        if let Err(error) = std::fs::create_dir_all(&dir) {
            return Self::ready(Err(Status::internal(error.to_string())));
        }
        let snapshot = Snapshot {
            parent: parent.map(str::to_owned),
            committed: false,
            labels,
            dir,
        };
        let mounts = mounts(&state, scope.namespace, snapshotter, &snapshot);
        state.held.snapshots.insert(at(key), snapshot);
        Self::ready(Ok(mounts))
    }

    fn snapshot_commit<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        name: &'a str,
        key: &'a str,
        labels: Labels,
    ) -> Call<'a, ()> {
        let mut state = lock(&self.state);
        let at = |name: &str| {
            (
                scope.namespace.to_owned(),
                snapshotter.to_owned(),
                name.to_owned(),
            )
        };
        if state.held.snapshots.contains_key(&at(name)) {
            return Self::ready(Err(Status::already_exists(format!(
                "snapshot {name}: already exists"
            ))));
        }
        let result = match state.held.snapshots.remove(&at(key)) {
            Some(mut snapshot) if !snapshot.committed => {
                snapshot.committed = true;
                snapshot.labels.extend(labels);
                state.held.snapshots.insert(at(name), snapshot);
                Ok(())
            }
            Some(snapshot) => {
                state.held.snapshots.insert(at(key), snapshot);
                Err(Status::failed_precondition(format!(
                    "snapshot {key} is committed"
                )))
            }
            None => Err(Status::not_found(format!("snapshot {key}"))),
        };
        Self::ready(result)
    }

    fn snapshot_exists<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        key: &'a str,
    ) -> Call<'a, bool> {
        let state = lock(&self.state);
        Self::ready(Ok(state.held.snapshots.contains_key(&(
            scope.namespace.to_owned(),
            snapshotter.to_owned(),
            key.to_owned(),
        ))))
    }

    fn snapshot_remove<'a>(
        &'a self,
        scope: Scope<'a>,
        snapshotter: &'a str,
        key: &'a str,
    ) -> Call<'a, ()> {
        let mut state = lock(&self.state);
        let result = match state.held.snapshots.remove(&(
            scope.namespace.to_owned(),
            snapshotter.to_owned(),
            key.to_owned(),
        )) {
            Some(snapshot) => {
                let _ = std::fs::remove_dir_all(&snapshot.dir);
                Ok(())
            }
            None => Err(Status::not_found(format!("snapshot {key}"))),
        };
        Self::ready(result)
    }

    fn diff_apply<'a>(
        &'a self,
        _scope: Scope<'a>,
        _layer: &'a Descriptor,
        _mounts: Vec<Mount>,
    ) -> Call<'a, String> {
        Self::ready(Err(Status::unimplemented(
            "the in-memory containerd has no diff service (overlayfs only)",
        )))
    }
}

/// An ingest's stream: each message answered at once, in order.
#[derive(Debug)]
struct MemoryIngest {
    state: Arc<Mutex<State>>,
    namespace: String,
    reference: String,
    total: u64,
    expected: String,
    answers: VecDeque<Result<u64, Status>>,
    closed: bool,
}

impl MemoryIngest {
    fn answer(&self, message: IngestMessage) -> Result<u64, Status> {
        let mut state = lock(&self.state);
        let at = key(&self.namespace, &self.reference);
        let Some(ingest) = state.ingests.get_mut(&at) else {
            return Err(Status::not_found(format!("ingest {}", self.reference)));
        };
        match message {
            IngestMessage::Write { offset, data } => {
                if offset == 0 && data.is_empty() {
                    ingest.data.clear();
                } else if offset != ingest.data.len() as u64 {
                    return Err(Status::invalid_argument(format!(
                        "write at {offset}, but the ingest holds {}",
                        ingest.data.len()
                    )));
                }
                ingest.data.extend_from_slice(&data);
                Ok(ingest.data.len() as u64)
            }
            IngestMessage::Commit {
                total,
                offset,
                expected,
                labels,
            } => {
                let held = ingest.data.len() as u64;
                if held != total || offset != total || total != self.total {
                    return Err(Status::failed_precondition(format!(
                        "unexpected commit size {held}, expected {total}"
                    )));
                }
                let actual = format!("sha256:{}", hex::encode(Sha256::digest(&ingest.data)));
                if actual != expected || expected != self.expected {
                    return Err(Status::failed_precondition(format!(
                        "unexpected commit digest {actual}, expected {expected}"
                    )));
                }
                let data = Bytes::from(std::mem::take(&mut ingest.data));
                state.ingests.remove(&at);
                state
                    .held
                    .content
                    .insert(key(&self.namespace, &expected), Blob { data, labels });
                Ok(total)
            }
        }
    }
}

impl Ingest for MemoryIngest {
    fn send(&mut self, message: IngestMessage) -> BoxFuture<'_, Result<(), ()>> {
        let result = if self.closed {
            Err(())
        } else {
            let answer = self.answer(message);
            self.answers.push_back(answer);
            Ok(())
        };
        Box::pin(async move { result })
    }

    fn next(&mut self) -> Call<'_, Option<u64>> {
        let next = match self.answers.pop_front() {
            Some(Ok(offset)) => Ok(Some(offset)),
            Some(Err(status)) => Err(status),
            None => Ok(None),
        };
        Box::pin(async move { next })
    }

    fn close(&mut self) {
        self.closed = true;
        let mut state = lock(&self.state);
        if let Some(ingest) = state
            .ingests
            .get_mut(&key(&self.namespace, &self.reference))
        {
            ingest.locked = false;
        }
    }
}

impl Drop for MemoryIngest {
    fn drop(&mut self) {
        self.close();
    }
}
