//! Watch: one feed per kind, shared by every watcher of it. The feed lists the kind as
//! `get` shows it once a second while anyone watches, and turns what changed into
//! events, each at the next resource version, kept for a while so a watcher can resume;
//! each watcher gets the events its selection wants. A fleet's worth of watchers costs
//! one listing a second, and each is sent what changed, not the whole list again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rigger_api::Kind;
use rigger_proto::v1::{Object, WatchEvent};
use tokio::sync::broadcast;
use tokio_stream::Stream;
use tonic::Status;

use super::{ControlService, ObjectName, Selection};

/// How often a watched kind is listed.
const INTERVAL: Duration = Duration::from_secs(1);
/// Changes kept for watchers that resume (and for one that falls behind this far).
const HISTORY: usize = 4096;

pub type EventStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

#[derive(Debug, Default)]
pub struct WatchHub {
    feeds: Mutex<HashMap<Kind, Arc<Feed>>>,
}

#[derive(Debug)]
struct Feed {
    tx: broadcast::Sender<Arc<Change>>,
    state: Mutex<FeedState>,
    /// Held from a listing to its update: listings apply in the order they were read,
    /// so an older one never follows a newer one.
    listing: tokio::sync::Mutex<()>,
}

/// An event and the namespace of its object (selections filter on it unparsed).
#[derive(Debug)]
struct Change {
    namespace: String,
    event: WatchEvent,
}

#[derive(Debug, Default)]
struct FeedState {
    /// Each object as last shown, by namespace and name.
    objects: BTreeMap<(String, String), Object>,
    history: VecDeque<Arc<Change>>,
    version: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn event(kind: &str, object: Object, version: u64) -> WatchEvent {
    WatchEvent {
        r#type: kind.to_owned(),
        object: Some(object),
        resource_version: version,
    }
}

type Key = ObjectName;

/// What changed from `before` to `now`, as events (pure).
fn changes<'a>(
    before: &'a BTreeMap<Key, Object>,
    now: &'a BTreeMap<Key, Object>,
) -> Vec<(&'static str, &'a Key, Object)> {
    let mut out = Vec::new();
    for (key, object) in now {
        match before.get(key) {
            None => out.push(("ADDED", key, object.clone())),
            Some(old) if old.json != object.json => out.push(("MODIFIED", key, object.clone())),
            Some(_) => {}
        }
    }
    for (key, object) in before {
        if !now.contains_key(key) {
            out.push(("DELETED", key, object.clone()));
        }
    }
    out
}

impl Feed {
    /// Take in a new listing: the changes become events.
    fn update(&self, listing: Vec<(Key, Object)>) {
        let now: BTreeMap<_, _> = listing.into_iter().collect();
        let mut state = lock(&self.state);
        let found: Vec<(&'static str, String, Object)> = changes(&state.objects, &now)
            .into_iter()
            .map(|(kind, key, object)| (kind, key.0.clone(), object))
            .collect();
        for (kind, namespace, object) in found {
            state.version += 1;
            let change = Arc::new(Change {
                namespace,
                event: event(kind, object, state.version),
            });
            if state.history.len() == HISTORY {
                state.history.pop_front();
            }
            state.history.push_back(change.clone());
            // No receiver is not an error: the poller stops at its next round.
            let _ = self.tx.send(change);
        }
        state.objects = now;
    }
}

impl WatchHub {
    /// A stream of `kind`'s changes for `selection`, from `resource_version` (0: every
    /// matching object first).
    pub async fn watch(
        &self,
        service: &ControlService,
        kind: Kind,
        selection: Selection,
        resource_version: u64,
    ) -> Result<EventStream, Status> {
        let (feed, fresh) = self.feed(service, kind).await?;
        if resource_version == 0 && !fresh {
            // Read your writes: the feed's listing can be a second old, older than a
            // write this client just saw acknowledged (`apply && wait`). Listed again
            // now; the changes go to every watcher, the new one starts from it.
            let _listing = feed.listing.lock().await;
            let listing = service.list_shown(kind, "").await?;
            feed.update(listing);
        }
        // Subscribed under the state lock: nothing between the snapshot and the stream
        // is missed or sent twice.
        let (rx, first) = {
            let state = lock(&feed.state);
            let rx = feed.tx.subscribe();
            let first: Vec<WatchEvent> = if resource_version == 0 {
                state
                    .objects
                    .iter()
                    .filter(|((namespace, _), o)| {
                        selection.in_namespace(namespace) && selection.selects(o)
                    })
                    .map(|(_, o)| event("ADDED", o.clone(), state.version))
                    .chain(std::iter::once(WatchEvent {
                        r#type: "SYNCED".to_owned(),
                        object: None,
                        resource_version: state.version,
                    }))
                    .collect()
            } else {
                let oldest = state
                    .history
                    .front()
                    .map_or(state.version + 1, |c| c.event.resource_version);
                if resource_version + 1 < oldest || resource_version > state.version {
                    return Err(Status::out_of_range(format!(
                        "resource version {resource_version} is not among the last {HISTORY} changes of {kind} (now {}); watch again from 0",
                        state.version
                    )));
                }
                state
                    .history
                    .iter()
                    .filter(|c| c.event.resource_version > resource_version)
                    .filter(|c| wanted(&selection, c))
                    .map(|c| c.event.clone())
                    .collect()
            };
            (rx, first)
        };
        let later = tokio_stream::wrappers::BroadcastStream::new(rx);
        let later = tokio_stream::StreamExt::filter_map(later, move |received| match received {
            Ok(change) => wanted(&selection, &change).then(|| Ok(change.event.clone())),
            Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
                Some(Err(Status::out_of_range(format!(
                    "this watch fell {n} changes behind; watch again from its last resource version"
                ))))
            }
        });
        let first = tokio_stream::iter(first.into_iter().map(Ok));
        Ok(Box::pin(tokio_stream::StreamExt::chain(first, later)))
    }

    /// `kind`'s feed, started (listed once, just now: `true`) if nobody watched it.
    async fn feed(
        &self,
        service: &ControlService,
        kind: Kind,
    ) -> Result<(Arc<Feed>, bool), Status> {
        if let Some(feed) = lock(&self.feeds).get(&kind) {
            return Ok((feed.clone(), false));
        }
        let listing = service.list_shown(kind, "").await?;
        let mut feeds = lock(&self.feeds);
        if let Some(feed) = feeds.get(&kind) {
            return Ok((feed.clone(), false)); // Another watcher started it meanwhile.
        }
        let feed = Arc::new(Feed {
            tx: broadcast::channel(HISTORY).0,
            state: Mutex::new(FeedState::default()),
            listing: tokio::sync::Mutex::new(()),
        });
        lock(&feed.state).objects = listing.into_iter().collect();
        feeds.insert(kind, feed.clone());
        drop(feeds);
        tokio::spawn(poll(service.clone(), kind, feed.clone()));
        Ok((feed, true))
    }
}

fn wanted(selection: &Selection, change: &Change) -> bool {
    selection.in_namespace(&change.namespace)
        && change
            .event
            .object
            .as_ref()
            .is_some_and(|o| selection.selects(o))
}

/// List `kind` every interval while anyone watches; then the feed goes.
async fn poll(service: ControlService, kind: Kind, feed: Arc<Feed>) {
    loop {
        tokio::time::sleep(INTERVAL).await;
        if feed.tx.receiver_count() == 0 {
            let mut feeds = lock(&service.watches.feeds);
            // A watcher that subscribed meanwhile keeps it going.
            if feed.tx.receiver_count() == 0 {
                feeds.remove(&kind);
                return;
            }
        }
        let _listing = feed.listing.lock().await;
        match service.list_shown(kind, "").await {
            Ok(listing) => feed.update(listing),
            Err(status) => tracing::warn!(%kind, error = %status.message(), "watch: cannot list"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Object `name` (in `default`) at version `value`, keyed as a listing keys it.
    fn object(name: &str, value: u32) -> (Key, Object) {
        let object = Object {
            json:
                serde_json::json!({"metadata": {"name": name, "namespace": "default"}, "v": value})
                    .to_string(),
            revision: 0,
        };
        (("default".to_owned(), name.to_owned()), object)
    }

    #[test]
    fn a_listing_becomes_the_changes_since_the_last() {
        let feed = Feed {
            tx: broadcast::channel(16).0,
            state: Mutex::new(FeedState::default()),
            listing: tokio::sync::Mutex::new(()),
        };
        let mut rx = feed.tx.subscribe();
        feed.update(vec![object("a", 1), object("b", 1)]);
        feed.update(vec![object("a", 2), object("b", 1)]);
        feed.update(vec![object("a", 2)]);
        feed.update(vec![object("a", 2)]);
        let mut seen = Vec::new();
        while let Ok(change) = rx.try_recv() {
            let event = &change.event;
            seen.push((
                event.r#type.clone(),
                serde_json::from_str::<serde_json::Value>(&event.object.as_ref().unwrap().json)
                    .unwrap()["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                event.resource_version,
            ));
        }
        assert_eq!(
            seen,
            [
                ("ADDED".to_owned(), "a".to_owned(), 1),
                ("ADDED".to_owned(), "b".to_owned(), 2),
                ("MODIFIED".to_owned(), "a".to_owned(), 3),
                ("DELETED".to_owned(), "b".to_owned(), 4),
            ]
        );
        assert_eq!(lock(&feed.state).history.len(), 4);
    }
}
