//! Where the controller keeps what users applied and what agents reported: objects by
//! `(kind, namespace, name)`, each with the store-wide revision of its last change, so
//! updates can be made conditional (nothing overwritten by a stale read) and a
//! restarted controller continues from exactly what was committed.
//!
//! Backends sit behind one interface ([`Backend`]; the controller holds a [`Store`]): the
//! embedded store (the default, [`EmbeddedStore`]: a redb file in the data directory),
//! etcd ([`EtcdStore`], for several controller replicas) and a Kubernetes API server
//! ([`KubernetesStore`]). Each backend that serves several replicas brings its leader
//! election beside it ([`etcd::election`], [`kubernetes::lease`]); [`Leadership`] is what
//! the controller sees of either, and what fences the store's writes.
//!
//! Every backend passes the same contract ([`conformance`]).

mod embedded;
pub mod etcd;
pub mod kubernetes;
pub mod leadership;
pub mod typed;

pub use embedded::EmbeddedStore;
pub use etcd::EtcdStore;
pub use kubernetes::{KubernetesSettings, KubernetesStore};
pub use leadership::{LeaderError, Leadership};
pub use typed::{Versioned, key_of};

/// The layout of Rigger's own stores (embedded and etcd: keys, revisions, the JSON of
/// each record) this release writes and reads. A store carries the format it was written
/// in; one without (every release before 0.2.0) is of format 1. A newer format is
/// refused before anything is written, so a controller rolled back past a store format
/// change stops with the reason, the store as it was. In a cluster the API server's CRD
/// versions are the format.
pub const STORE_FORMAT: u64 = 1;

/// Whether a store of format `found` (`None`: none recorded) at `location` is one this
/// release reads. Pure.
pub fn check_format(location: &str, found: Option<u64>) -> Result<(), StoreError> {
    match found {
        Some(format) if format > STORE_FORMAT => Err(StoreError::Backend {
            location: location.to_owned(),
            detail: format!(
                "written in store format {format} by a newer release; controller {} reads format {STORE_FORMAT} at most: nothing was changed, run that release (or newer) again",
                rigger_version::VERSION
            ),
        }),
        _ => Ok(()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {location}: {detail}")]
    Backend { location: String, detail: String },
    #[error("{key}: changed since revision {expected} (now {actual}); read it again")]
    Conflict {
        key: String,
        expected: u64,
        actual: u64,
    },
    #[error("{key}: not found")]
    NotFound { key: String },
    /// A stored object that is not what its kind says (written around the API, or by
    /// another version).
    #[error("{key}: stored object does not decode: {detail}")]
    Undecodable { key: String, detail: String },
    /// A write of a replica that does not lead (any more): refused before it is sent.
    #[error("{key}: not written: this controller replica does not lead")]
    NotLeading { key: String },
}

/// One stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub key: ObjectKey,
    /// The store revision of the object's last change.
    pub revision: u64,
    /// The object, as JSON.
    pub object: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub kind: String,
    /// Empty for cluster-wide kinds (Node).
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(kind: &str, namespace: &str, name: &str) -> Self {
        Self {
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    pub(crate) fn encode(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }

    pub(crate) fn decode(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, '/');
        Some(Self::new(parts.next()?, parts.next()?, parts.next()?))
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.kind, self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// When a write is allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// Whatever is there.
    Any,
    /// Only if the object does not exist.
    Absent,
    /// Only if the object is at this revision.
    Revision(u64),
}

pub(crate) fn check(
    key: &str,
    precondition: Precondition,
    current: Option<u64>,
) -> Result<(), StoreError> {
    match (precondition, current) {
        (Precondition::Any, _) | (Precondition::Absent, None) => Ok(()),
        (Precondition::Revision(expected), Some(actual)) if expected == actual => Ok(()),
        (Precondition::Absent, Some(actual)) => Err(StoreError::Conflict {
            key: key.to_owned(),
            expected: 0,
            actual,
        }),
        (Precondition::Revision(expected), actual) => Err(StoreError::Conflict {
            key: key.to_owned(),
            expected,
            actual: actual.unwrap_or(0),
        }),
    }
}

/// What a store backend does: objects by key with revisions, conditional writes. The
/// embedded store, etcd and a Kubernetes API server ([`KubernetesStore`]) implement it.
/// Everything above the store reaches a backend through [`Store`] only.
#[async_trait::async_trait]
pub trait Backend: std::fmt::Debug + Send + Sync + 'static {
    /// Write `object` under `key` if `precondition` holds; returns the new revision.
    async fn put(
        &self,
        key: ObjectKey,
        object: Vec<u8>,
        precondition: Precondition,
    ) -> Result<u64, StoreError>;

    /// Write every object whatever is there, in order, in as few requests as the
    /// backend allows (one transaction for the embedded store).
    async fn put_all(&self, objects: Vec<(ObjectKey, Vec<u8>)>) -> Result<(), StoreError>;

    async fn get(&self, key: ObjectKey) -> Result<Option<Stored>, StoreError>;

    /// Every object of `kind`, ordered by namespace and name.
    async fn list(&self, kind: &str) -> Result<Vec<Stored>, StoreError>;

    /// Delete `key` if `precondition` holds; deleting what is not there is `NotFound`.
    async fn delete(&self, key: ObjectKey, precondition: Precondition) -> Result<(), StoreError>;

    /// Every object of `kind` in [`list`](Self::list)'s order, whole only where
    /// `known(key, revision)` is false: a caller that keeps what it decoded reads again
    /// only what changed. A backend that holds its objects unencoded (a Kubernetes watch
    /// cache) skips encoding the others.
    async fn list_changed(
        &self,
        kind: &str,
        known: &KnownRevision<'_>,
    ) -> Result<Listing, StoreError> {
        Ok(Listing::of(self.list(kind).await?, known))
    }

    /// Changes to objects of `kind` that others made (its value counts them), where the
    /// backend sees them: a Kubernetes API server's watches (a user's `kubectl apply`).
    /// `None` where every write comes through this controller's API, which wakes the
    /// engines itself.
    fn changes(&self, _kind: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Hold every write request from now on to `leading`, checked as each request is
    /// sent, where the backend's writes take several requests (a Kubernetes API server:
    /// no transaction spans objects, and a write read afresh after a conflict is sent
    /// again). A backend whose every write is one request needs nothing beyond
    /// [`Store::fenced`]'s check.
    fn fence_writes(&self, _leading: tokio::sync::watch::Receiver<bool>) {}
}

/// Whether the caller holds object `key` at `revision` already.
pub type KnownRevision<'a> = dyn Fn(&ObjectKey, u64) -> bool + Send + Sync + 'a;

/// A [`Backend::list_changed`]: every object present, and the changed ones whole.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Every object of the kind, with its revision, in list order.
    pub present: Vec<(ObjectKey, u64)>,
    /// Those the caller did not know at their revision.
    pub changed: Vec<Stored>,
}

impl Listing {
    /// `listed` split by what `known` holds.
    pub fn of(listed: Vec<Stored>, known: &KnownRevision<'_>) -> Self {
        let mut listing = Self::default();
        for stored in listed {
            listing.present.push((stored.key.clone(), stored.revision));
            if !known(&stored.key, stored.revision) {
                listing.changed.push(stored);
            }
        }
        listing
    }
}

/// The store the controller runs on: one backend, shared by every task (cheap to clone).
/// Typed reads and writes are in [`typed`].
#[derive(Debug, Clone)]
pub struct Store(std::sync::Arc<dyn Backend>);

impl Store {
    pub fn new(backend: impl Backend) -> Self {
        Self(std::sync::Arc::new(backend))
    }

    /// Write `object` under `key` if `precondition` holds; returns the new revision.
    pub async fn put(
        &self,
        key: ObjectKey,
        object: Vec<u8>,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        self.0.put(key, object, precondition).await
    }

    /// Write every object whatever is there, in order (see [`Backend::put_all`]).
    pub async fn put_all(&self, objects: Vec<(ObjectKey, Vec<u8>)>) -> Result<(), StoreError> {
        self.0.put_all(objects).await
    }

    pub async fn get(&self, key: ObjectKey) -> Result<Option<Stored>, StoreError> {
        self.0.get(key).await
    }

    /// See [`Backend::changes`].
    pub fn changes(&self, kind: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.0.changes(kind)
    }

    /// Every object of `kind`, ordered by namespace and name.
    pub async fn list(&self, kind: &str) -> Result<Vec<Stored>, StoreError> {
        self.0.list(kind).await
    }

    /// See [`Backend::list_changed`].
    pub async fn list_changed(
        &self,
        kind: &str,
        known: &KnownRevision<'_>,
    ) -> Result<Listing, StoreError> {
        self.0.list_changed(kind, known).await
    }

    /// Delete `key` if `precondition` holds; deleting what is not there is `NotFound`.
    pub async fn delete(
        &self,
        key: ObjectKey,
        precondition: Precondition,
    ) -> Result<(), StoreError> {
        self.0.delete(key, precondition).await
    }

    /// This store with its writes refused (`NotLeading`) whenever `leading` is false:
    /// a replica that lost its lease stops writing the instant its campaign says so,
    /// even in the middle of a pass or in its last flush, before any other replica may
    /// take over. Reads go through.
    pub fn fenced(&self, leading: tokio::sync::watch::Receiver<bool>) -> Self {
        self.0.fence_writes(leading.clone());
        Self::new(Fenced {
            inner: self.0.clone(),
            leading,
        })
    }
}

/// See [`Store::fenced`].
#[derive(Debug)]
struct Fenced {
    inner: std::sync::Arc<dyn Backend>,
    leading: tokio::sync::watch::Receiver<bool>,
}

impl Fenced {
    fn check(&self, key: &ObjectKey) -> Result<(), StoreError> {
        if *self.leading.borrow() {
            Ok(())
        } else {
            Err(StoreError::NotLeading {
                key: key.to_string(),
            })
        }
    }
}

#[async_trait::async_trait]
impl Backend for Fenced {
    async fn put(
        &self,
        key: ObjectKey,
        object: Vec<u8>,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        self.check(&key)?;
        self.inner.put(key, object, precondition).await
    }

    async fn put_all(&self, objects: Vec<(ObjectKey, Vec<u8>)>) -> Result<(), StoreError> {
        if let Some((key, _)) = objects.first() {
            self.check(key)?;
        }
        self.inner.put_all(objects).await
    }

    async fn get(&self, key: ObjectKey) -> Result<Option<Stored>, StoreError> {
        self.inner.get(key).await
    }

    async fn list(&self, kind: &str) -> Result<Vec<Stored>, StoreError> {
        self.inner.list(kind).await
    }

    async fn list_changed(
        &self,
        kind: &str,
        known: &KnownRevision<'_>,
    ) -> Result<Listing, StoreError> {
        self.inner.list_changed(kind, known).await
    }

    async fn delete(&self, key: ObjectKey, precondition: Precondition) -> Result<(), StoreError> {
        self.check(&key)?;
        self.inner.delete(key, precondition).await
    }

    fn changes(&self, kind: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.changes(kind)
    }

    fn fence_writes(&self, leading: tokio::sync::watch::Receiver<bool>) {
        self.inner.fence_writes(leading);
    }
}

/// The behaviour every backend must show (revisions grow, conditional writes and deletes,
/// listing by kind in order), checked against a store the caller provides empty. Run by
/// the embedded store's tests and, against a real etcd, by the integration tests.
#[doc(hidden)]
pub async fn conformance(store: &Store) -> Result<(), String> {
    conformance_of(store, "ImagePullJob", "Secret", "default").await
}

/// [`conformance`] on objects of `kind` in `namespace` (with one of `other_kind` to
/// show that listing keeps to a kind): the Kubernetes store runs it on the
/// controller's records, whose bodies may be any JSON.
#[doc(hidden)]
pub async fn conformance_of(
    store: &Store,
    kind: &str,
    other_kind: &str,
    namespace: &str,
) -> Result<(), String> {
    fn ensure(ok: bool, what: &str) -> Result<(), String> {
        if ok { Ok(()) } else { Err(what.to_owned()) }
    }
    let e = |e: StoreError| e.to_string();
    let key = |name: &str| ObjectKey::new(kind, namespace, name);
    let r1 = store
        .put(key("a"), b"1".to_vec(), Precondition::Absent)
        .await
        .map_err(e)?;
    let double = store
        .put(key("a"), b"7".to_vec(), Precondition::Absent)
        .await;
    ensure(
        matches!(double, Err(StoreError::Conflict { .. })),
        &format!("a second create of the same key is a conflict (got {double:?})"),
    )?;
    let r2 = store
        .put(key("a"), b"2".to_vec(), Precondition::Revision(r1))
        .await
        .map_err(e)?;
    ensure(r2 > r1, "revisions grow")?;
    let stale = store
        .put(key("a"), b"3".to_vec(), Precondition::Revision(r1))
        .await;
    ensure(
        matches!(&stale, Err(err @ StoreError::Conflict { .. }) if err.to_string().contains(&format!("{kind}/{namespace}/a"))),
        "a write at a stale revision is a conflict naming the key",
    )?;
    let current = store.get(key("a")).await.map_err(e)?;
    ensure(
        current.is_some_and(|s| s.revision == r2 && s.object == b"2"),
        "get returns the last write with its revision",
    )?;
    for name in ["c", "b"] {
        store
            .put(key(name), b"{}".to_vec(), Precondition::Any)
            .await
            .map_err(e)?;
    }
    store
        .put(
            ObjectKey::new(other_kind, namespace, "s"),
            b"{}".to_vec(),
            Precondition::Any,
        )
        .await
        .map_err(e)?;
    let names: Vec<String> = store
        .list(kind)
        .await
        .map_err(e)?
        .into_iter()
        .map(|s| s.key.name)
        .collect();
    ensure(names == ["a", "b", "c"], "list returns one kind, in order")?;
    let known_a = key("a");
    let listing = store
        .list_changed(kind, &|key, revision| *key == known_a && revision == r2)
        .await
        .map_err(e)?;
    let present: Vec<&str> = listing
        .present
        .iter()
        .map(|(k, _)| k.name.as_str())
        .collect();
    let changed: Vec<&str> = listing
        .changed
        .iter()
        .map(|s| s.key.name.as_str())
        .collect();
    ensure(
        present == ["a", "b", "c"] && changed == ["b", "c"] && listing.present[0].1 == r2,
        "list_changed names every object and gives whole only those not known at their revision",
    )?;
    let stale_delete = store.delete(key("a"), Precondition::Revision(r1)).await;
    ensure(
        matches!(stale_delete, Err(StoreError::Conflict { .. })),
        "a delete at a stale revision is a conflict",
    )?;
    store
        .delete(key("a"), Precondition::Revision(r2))
        .await
        .map_err(e)?;
    ensure(store.get(key("a")).await.map_err(e)?.is_none(), "deleted")?;
    let missing = store.delete(key("a"), Precondition::Any).await;
    ensure(
        matches!(missing, Err(StoreError::NotFound { .. })),
        "deleting what is not there is NotFound",
    )?;
    let batch: Vec<(ObjectKey, Vec<u8>)> = ["x", "y", "b"]
        .iter()
        .map(|name| (key(name), format!("\"{name}\"").into_bytes()))
        .collect();
    store.put_all(batch).await.map_err(e)?;
    let listed = store.list(kind).await.map_err(e)?;
    let mut revisions = Vec::new();
    for name in ["x", "y", "b"] {
        let stored = listed.iter().find(|s| s.key.name == name);
        ensure(
            stored.is_some_and(|s| s.object == format!("\"{name}\"").as_bytes()),
            "put_all writes every object, over what was there",
        )?;
        revisions.extend(stored.map(|s| s.revision));
    }
    ensure(
        revisions.iter().all(|r| *r > r2),
        "put_all moves the revisions on",
    )
}
