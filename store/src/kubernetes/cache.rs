//! Lists served from watches: each resource the engines list is watched once (all
//! namespaces) and held in memory, so an engine's pass costs the API server nothing and
//! the controller's load does not grow with how often it looks, or with the fleet.
//!
//! A watch lags the writes it reports. So that the controller reads its own writes, each
//! write's result (the object, with its new resourceVersion, or a deletion) is kept in
//! an overlay until the watch has caught up with it: a list shows, per object, whichever
//! of the two is newer. [`merge`] is that rule, pure.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};

use super::route;

/// How long the first listing of a resource may take before a list fails.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// How many of its own writes' resourceVersions a watch keeps to recognise them.
const OWN_WRITES_KEPT: usize = 1024;

/// The resourceVersions of this controller's writes that a watch has not delivered yet,
/// so that their events wake nothing. One the watch never delivers (the object changed
/// again during a relist) stays until the next relist; past [`OWN_WRITES_KEPT`] all are
/// forgotten. Either way the worst is a write of ours taken for another's: one pass more.
/// So is a write whose event comes before its response does. The other way round, an
/// event of another writer's is taken for ours only if the API server answered our write
/// with that version: a no-op write answered while another's change was in flight (not
/// recorded when the watch has delivered that version already); that change is then
/// acted on at the engine's next tick.
#[derive(Debug, Default)]
struct OwnWrites(HashSet<u64>);

impl OwnWrites {
    fn wrote(&mut self, revision: u64) {
        if self.0.len() >= OWN_WRITES_KEPT {
            self.0.clear();
        }
        self.0.insert(revision);
    }

    /// Whether the event at `revision` is a write of ours (then forgotten).
    fn delivered(&mut self, revision: Option<u64>) -> bool {
        revision.is_some_and(|revision| self.0.remove(&revision))
    }

    /// The watch listed everything again: what it delivered meanwhile is not known.
    fn relisted(&mut self) {
        self.0.clear();
    }
}

/// What of a watched object is kept: all but its `managedFields`, the API server's record
/// of who set which field. No reader of the cache looks at them, Rigger's writes never
/// send them (`route` keeps only its own metadata), and with 5,000 nodes the cached
/// NodeImages held them for every write of each.
fn trim(object: &mut DynamicObject) {
    object.metadata.managed_fields = None;
}

/// This controller's own write of one object, until the watch shows it.
#[derive(Debug, Clone)]
pub enum Written {
    Present(Arc<DynamicObject>),
    /// Deleted at this resourceVersion.
    Deleted(u64),
}

impl Written {
    fn revision(&self) -> u64 {
        match self {
            Self::Present(object) => {
                route::revision_of(object.metadata.resource_version.as_deref()).unwrap_or(0)
            }
            Self::Deleted(revision) => *revision,
        }
    }
}

/// `(namespace, name)` of an object.
pub type Name = (String, String);

fn name_of(object: &DynamicObject) -> Name {
    (
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default(),
    )
}

/// The watch's objects with this controller's newer writes over them; the overlay
/// entries the watch has caught up with are dropped. `seen` is the newest
/// resourceVersion the watch has delivered: a write at or below it that the watch does
/// not hold was deleted since (watches deliver in resourceVersion order).
pub fn merge(
    watched: Vec<Arc<DynamicObject>>,
    overlay: &mut HashMap<Name, Written>,
    seen: u64,
) -> Vec<Arc<DynamicObject>> {
    let mut out: HashMap<Name, Arc<DynamicObject>> = HashMap::with_capacity(watched.len());
    let mut in_watch = std::collections::HashSet::with_capacity(watched.len());
    let mut caught_up = Vec::new();
    for object in watched {
        let name = name_of(&object);
        in_watch.insert(name.clone());
        let seen = route::revision_of(object.metadata.resource_version.as_deref()).unwrap_or(0);
        match overlay.get(&name) {
            Some(written) if written.revision() > seen => continue,
            Some(_) => caught_up.push(name.clone()),
            None => {}
        }
        out.insert(name, object);
    }
    for (name, written) in overlay.iter() {
        if out.contains_key(name) {
            continue;
        }
        match written {
            Written::Present(_) if written.revision() <= seen => caught_up.push(name.clone()),
            Written::Present(object) => {
                out.insert(name.clone(), object.clone());
            }
            // Gone from the watch too: the deletion has been seen.
            Written::Deleted(_) if !in_watch.contains(name) => caught_up.push(name.clone()),
            Written::Deleted(_) => {}
        }
    }
    for name in caught_up {
        overlay.remove(&name);
    }
    out.into_values().collect()
}

struct Watched {
    reader: Store<DynamicObject>,
    /// True once the watch listed everything. (Its own, not the reflector store's
    /// `wait_until_ready`: that one wakes only one of several waiters.)
    ready: tokio::sync::watch::Receiver<bool>,
    /// The newest resourceVersion the watch delivered.
    seen: Arc<std::sync::atomic::AtomicU64>,
    overlay: HashMap<Name, Written>,
    /// The resourceVersions of this controller's writes the watch has not delivered yet.
    own_writes: Arc<Mutex<OwnWrites>>,
    _watch: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The watches, by resource (`group/version/plural` and namespace).
#[derive(Default)]
pub struct ListCache {
    watched: Mutex<HashMap<String, Watched>>,
    /// Per resource, a count of the changes others made, for [`ListCache::changes`];
    /// made by whichever comes first, the watch or a subscriber.
    changes: Mutex<HashMap<String, tokio::sync::watch::Sender<u64>>>,
}

impl std::fmt::Debug for ListCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListCache")
    }
}

fn cache_key(resource: &ApiResource, namespace: Option<&str>) -> String {
    format!(
        "{}/{}/{}",
        resource.api_version,
        resource.plural,
        namespace.unwrap_or("")
    )
}

impl ListCache {
    /// Every object of `resource` (in `namespace`, or all), as watched, with this
    /// controller's writes over them. The first call starts the watch and waits for its
    /// first listing.
    pub async fn list(
        &self,
        client: &kube::Client,
        resource: &ApiResource,
        namespace: Option<&str>,
    ) -> Result<Vec<Arc<DynamicObject>>, String> {
        let key = cache_key(resource, namespace);
        let (reader, mut ready) = self.reader(client, resource, namespace, &key);
        tokio::time::timeout(SYNC_TIMEOUT, ready.wait_for(|ready| *ready))
            .await
            .map_err(|_| {
                format!(
                    "the watch of {} listed nothing within {SYNC_TIMEOUT:?}",
                    resource.plural
                )
            })?
            .map_err(|_| format!("the watch of {} stopped", resource.plural))?;
        let mut watched = lock(&self.watched);
        let Some(entry) = watched.get_mut(&key) else {
            return Ok(reader.state());
        };
        let seen = entry.seen.load(std::sync::atomic::Ordering::Acquire);
        Ok(merge(reader.state(), &mut entry.overlay, seen))
    }

    /// Changes to `resource`'s objects (in `namespace`, or all) that this controller did
    /// not write: the value counts them, and a relist counts as one. Subscribing does not
    /// start the watch; the first list does.
    pub fn changes(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
    ) -> tokio::sync::watch::Receiver<u64> {
        self.changes_sender(&cache_key(resource, namespace))
            .subscribe()
    }

    fn changes_sender(&self, key: &str) -> tokio::sync::watch::Sender<u64> {
        lock(&self.changes)
            .entry(key.to_owned())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .clone()
    }

    fn reader(
        &self,
        client: &kube::Client,
        resource: &ApiResource,
        namespace: Option<&str>,
        key: &str,
    ) -> (Store<DynamicObject>, tokio::sync::watch::Receiver<bool>) {
        let mut watched = lock(&self.watched);
        if let Some(entry) = watched.get(key) {
            return (entry.reader.clone(), entry.ready.clone());
        }
        let api: Api<DynamicObject> = match namespace {
            Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
            None => Api::all_with(client.clone(), resource),
        };
        let writer = reflector::store::Writer::new(resource.clone());
        let reader = writer.as_reader();
        let plural = resource.plural.clone();
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen_by_watch = seen.clone();
        let own_writes = Arc::new(Mutex::new(OwnWrites::default()));
        let own_writes_of_watch = own_writes.clone();
        let changed = self.changes_sender(key);
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default()).modify(trim),
        )
        .default_backoff();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        ready_tx.send_replace(true);
                        // What changed while the watch was down is not known: all of it.
                        lock(&own_writes_of_watch).relisted();
                        changed.send_modify(|count| *count = count.wrapping_add(1));
                    }
                    Ok(watcher::Event::Apply(object) | watcher::Event::Delete(object)) => {
                        let revision =
                            route::revision_of(object.metadata.resource_version.as_deref());
                        seen_by_watch
                            .fetch_max(revision.unwrap_or(0), std::sync::atomic::Ordering::AcqRel);
                        if !lock(&own_writes_of_watch).delivered(revision) {
                            changed.send_modify(|count| *count = count.wrapping_add(1));
                        }
                    }
                    Ok(watcher::Event::InitApply(object)) => {
                        let revision =
                            route::revision_of(object.metadata.resource_version.as_deref());
                        seen_by_watch
                            .fetch_max(revision.unwrap_or(0), std::sync::atomic::Ordering::AcqRel);
                    }
                    Ok(watcher::Event::Init) => {}
                    Err(error) => {
                        tracing::warn!(resource = %plural, %error, "watch interrupted; resuming");
                    }
                }
            }
        });
        watched.insert(
            key.to_owned(),
            Watched {
                reader: reader.clone(),
                ready: ready.clone(),
                seen,
                overlay: HashMap::new(),
                own_writes,
                _watch: AbortOnDrop(task),
            },
        );
        (reader, ready)
    }

    /// The newest resourceVersion of object `name` of `resource` (cached as `namespace`
    /// says) that the watch or this controller's last write knows; `None` when the watch
    /// does not run, or knows it absent or deleted.
    pub fn known_revision(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: &Name,
    ) -> Option<u64> {
        let watched = lock(&self.watched);
        let entry = watched.get(&cache_key(resource, namespace))?;
        let mut object = reflector::ObjectRef::new_with(&name.1, resource.clone());
        if !name.0.is_empty() {
            object = object.within(&name.0);
        }
        let from_watch = entry
            .reader
            .get(&object)
            .and_then(|watched| route::revision_of(watched.metadata.resource_version.as_deref()));
        match (entry.overlay.get(name), from_watch) {
            (Some(written), Some(seen)) if written.revision() < seen => Some(seen),
            (Some(written @ Written::Present(_)), _) => Some(written.revision()),
            (Some(Written::Deleted(_)), _) => None,
            (None, seen) => seen,
        }
    }

    /// Remember this controller's write of an object (for resources listed through the
    /// cache; others need nothing).
    pub fn wrote(
        &self,
        resource: &ApiResource,
        namespace: Option<&str>,
        name: Name,
        written: Written,
    ) {
        let key = cache_key(resource, namespace);
        let mut watched = lock(&self.watched);
        if let Some(entry) = watched.get_mut(&key) {
            // A write at or below what the watch delivered changed nothing (the API server
            // answered a no-op with the current version) or was seen already: no event of
            // it is to come, and the version may be another writer's.
            let seen = entry.seen.load(std::sync::atomic::Ordering::Acquire);
            if written.revision() > seen {
                lock(&entry.own_writes).wrote(written.revision());
            }
            let newer = entry
                .overlay
                .get(&name)
                .is_none_or(|old| old.revision() <= written.revision());
            if newer {
                entry.overlay.insert(name, written);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_cached_object_keeps_all_but_its_managed_fields() {
        let mut object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
            "metadata": {"name": "n1", "resourceVersion": "7", "labels": {"a": "b"},
                         "managedFields": [{"manager": "rigger-controller", "operation": "Update"}]},
            "spec": {"images": {"nginx": {"tags": [{"tag": "1"}]}}},
            "status": {"desired": 1},
        }))
        .unwrap();
        let before = object.clone();
        trim(&mut object);
        assert_eq!(object.metadata.managed_fields, None);
        object.metadata.managed_fields = before.metadata.managed_fields.clone();
        assert_eq!(object, before, "nothing else changed");
    }

    fn object(name: &str, revision: u64) -> Arc<DynamicObject> {
        let mut object = DynamicObject::new(
            name,
            &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        object.metadata.namespace = Some("ns".into());
        object.metadata.resource_version = Some(revision.to_string());
        Arc::new(object)
    }

    fn names(objects: &[Arc<DynamicObject>]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = objects
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap(),
                    o.metadata.resource_version.clone().unwrap(),
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn own_writes_are_known_once_by_revision_and_forgotten_at_a_relist() {
        let mut own = OwnWrites::default();
        own.wrote(7);
        own.wrote(9);
        assert!(!own.delivered(Some(8)), "another's write between ours");
        assert!(own.delivered(Some(7)));
        assert!(!own.delivered(Some(7)), "an event of ours is ours once");
        assert!(
            !own.delivered(None),
            "an event without a version is another's"
        );
        own.relisted();
        assert!(
            !own.delivered(Some(9)),
            "after a relist, nothing is known as ours"
        );
        for revision in 0..=OWN_WRITES_KEPT as u64 {
            own.wrote(revision);
        }
        assert!(own.0.len() <= OWN_WRITES_KEPT, "bounded");
        assert!(
            own.delivered(Some(OWN_WRITES_KEPT as u64)),
            "the newest kept"
        );
    }

    #[test]
    fn own_writes_show_until_the_watch_catches_up_and_no_longer() {
        let key = |n: &str| ("ns".to_owned(), n.to_owned());
        let mut overlay = HashMap::new();
        overlay.insert(key("a"), Written::Present(object("a", 10)));
        overlay.insert(key("new"), Written::Present(object("new", 11)));
        overlay.insert(key("gone"), Written::Deleted(12));
        // The watch still shows a at 5 and gone at 7, and not yet new.
        let listed = merge(
            vec![object("a", 5), object("gone", 7), object("b", 3)],
            &mut overlay,
            7,
        );
        assert_eq!(
            names(&listed),
            [
                ("a".into(), "10".into()),
                ("b".into(), "3".into()),
                ("new".into(), "11".into())
            ]
        );
        assert_eq!(overlay.len(), 3, "nothing caught up yet");
        // The watch catches up: a at 10, new at 11, gone gone.
        let listed = merge(
            vec![object("a", 10), object("new", 11), object("b", 3)],
            &mut overlay,
            11,
        );
        assert_eq!(listed.len(), 3);
        assert!(overlay.is_empty(), "{overlay:?}");
        // Someone else recreated what we deleted: newer than our deletion, shown.
        overlay.insert(key("gone"), Written::Deleted(12));
        let listed = merge(vec![object("gone", 20)], &mut overlay, 20);
        assert_eq!(names(&listed), [("gone".into(), "20".into())]);
        // Our write, then a deletion by someone else the watch already delivered.
        overlay.insert(key("short"), Written::Present(object("short", 30)));
        assert_eq!(
            merge(vec![], &mut overlay, 29).len(),
            1,
            "not delivered yet"
        );
        assert!(merge(vec![], &mut overlay, 31).is_empty(), "deleted since");
        assert!(overlay.is_empty());
    }
}
