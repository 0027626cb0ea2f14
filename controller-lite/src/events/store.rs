//! [`EventSink`] on Rigger's own store (embedded or etcd): Events in Kubernetes' core/v1
//! shape, which `riggerctl get events` and `riggerctl describe` read. One task writes
//! them from a bounded queue, so no engine waits on the store. An event that repeats
//! (the same object, reason and message) is one object whose `count` and
//! `lastTimestamp` move, as Kubernetes aggregates them; events last [`TTL`]
//! (Kubernetes' `--event-ttl`), and past [`MOST`] the oldest go first. As Kubernetes'
//! recorder does, an object gets at most [`BURST`] events at once and then one per
//! [`REFILL`] (an agent cycling a task through failures cannot fill the store), and
//! only the leader prunes.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use rigger_api::event::{Event as StoredEvent, EventSource, InvolvedObject, KIND};
use rigger_proto::pod::ObjectMeta;
use rigger_proto::time::rfc3339;
use tokio_util::sync::CancellationToken;

use super::{Event, EventQueue, EventSink};
use rigger_store::Leadership;
use rigger_store::{ObjectKey, Precondition, Store};

/// Events waiting to be written.
const QUEUE: usize = 1024;
/// How long an event is kept after it last happened.
pub const TTL: Duration = Duration::from_secs(3600);
/// Events kept at most; the store is not a log.
pub const MOST: usize = 5000;
/// How often old events are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Events one object may get at once (Kubernetes' spam filter's burst)...
pub const BURST: f64 = 25.0;
/// ...and then one per this long.
pub const REFILL: Duration = Duration::from_secs(300);
/// The longest name prefix an event takes from its object's (names stay within 253).
const NAME_PREFIX: usize = 200;
/// Who reports.
const COMPONENT: &str = "rigger-controller";

/// Events written to the store.
#[derive(Debug, Clone)]
pub struct StoreEvents {
    /// Its drops are said at each prune.
    queue: EventQueue,
}

impl EventSink for StoreEvents {
    fn record(&self, event: Event) {
        self.queue.record(event);
    }
}

/// What makes two events one (Kubernetes' aggregation key, less the source).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Same {
    namespace: String,
    kind: String,
    name: String,
    uid: String,
    reason: &'static str,
    message: String,
}

impl StoreEvents {
    /// Start the writer; it ends with `token` (or when every sender is gone). Old
    /// events are pruned while `leadership` holds.
    pub fn start(store: Store, leadership: Leadership, token: CancellationToken) -> Self {
        let (queue, mut queued) = EventQueue::new(QUEUE);
        tokio::spawn(async move {
            let mut writer = Writer::new(store);
            let mut prune = tokio::time::interval(PRUNE_EVERY);
            loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    event = queued.events.recv() => match event {
                        Some(event) => writer.write(event, SystemTime::now()).await,
                        None => return,
                    },
                    _ = prune.tick() => {
                        queued.say_dropped();
                        if leadership.is_leader() {
                            writer.prune(SystemTime::now()).await;
                        }
                    }
                }
            }
        });
        Self { queue }
    }
}

struct Writer {
    store: Store,
    /// Events written, by what makes them one: the stored event.
    seen: HashMap<Same, (ObjectKey, StoredEvent)>,
    /// The last name suffix given (names must not repeat).
    last_suffix: u128,
    /// Each object's spam filter: tokens left, when last counted.
    budgets: HashMap<(String, String, String), (f64, SystemTime)>,
}

impl Writer {
    fn new(store: Store) -> Self {
        Self {
            store,
            seen: HashMap::new(),
            last_suffix: 0,
            budgets: HashMap::new(),
        }
    }

    /// Whether the object `regarding` may have one more event at `now`.
    fn allowed(&mut self, regarding: &super::Regarding, now: SystemTime) -> bool {
        let key = (
            regarding.namespace.clone(),
            regarding.kind.clone(),
            regarding.name.clone(),
        );
        let (tokens, last) = self.budgets.entry(key).or_insert((BURST, now));
        let elapsed = now.duration_since(*last).unwrap_or_default();
        *tokens = (*tokens + elapsed.as_secs_f64() / REFILL.as_secs_f64()).min(BURST);
        *last = now;
        if *tokens < 1.0 {
            return false;
        }
        *tokens -= 1.0;
        true
    }

    async fn write(&mut self, event: Event, now: SystemTime) {
        if !self.allowed(&event.regarding, now) {
            tracing::debug!(reason = event.reason, object = %event.regarding.name, "an object's events past its burst: dropped");
            return;
        }
        // The store holds at most MOST: past it, the oldest go before another is made.
        if self.seen.len() >= MOST {
            self.prune(now).await;
        }
        let regarding = &event.regarding;
        let namespace = if regarding.namespace.is_empty() {
            "default".to_owned()
        } else {
            regarding.namespace.clone()
        };
        let same = Same {
            namespace: namespace.clone(),
            kind: regarding.kind.clone(),
            name: regarding.name.clone(),
            uid: regarding.uid.clone(),
            reason: event.reason,
            message: event.message.clone(),
        };
        let at = rfc3339(now);
        let (key, stored, precondition) = match self.seen.get(&same) {
            Some((key, earlier)) => {
                let mut again = earlier.clone();
                again.count = again.count.saturating_add(1);
                again.last_timestamp = at;
                (key.clone(), again, Precondition::Any)
            }
            None => {
                let prefix: String = regarding.name.chars().take(NAME_PREFIX).collect();
                let name = format!("{prefix}.{:x}", self.suffix(now));
                let stored = StoredEvent {
                    api_version: "v1".to_owned(),
                    kind: KIND.to_owned(),
                    metadata: ObjectMeta {
                        name: name.clone(),
                        namespace: Some(namespace.clone()),
                        creation_timestamp: Some(at.clone()),
                        ..ObjectMeta::default()
                    },
                    involved_object: InvolvedObject {
                        api_version: regarding.api_version.clone(),
                        kind: regarding.kind.clone(),
                        namespace: regarding.namespace.clone(),
                        name: regarding.name.clone(),
                        uid: regarding.uid.clone(),
                    },
                    reason: event.reason.to_owned(),
                    message: event.message.clone(),
                    event_type: if event.warning { "Warning" } else { "Normal" }.to_owned(),
                    count: 1,
                    first_timestamp: at.clone(),
                    last_timestamp: at,
                    source: EventSource {
                        component: COMPONENT.to_owned(),
                    },
                    reporting_component: COMPONENT.to_owned(),
                };
                // Made, never written over (a clock stepped back after a restart).
                (
                    ObjectKey::new(KIND, &namespace, &name),
                    stored,
                    Precondition::Absent,
                )
            }
        };
        let Ok(bytes) = serde_json::to_vec(&stored) else {
            return;
        };
        match self.store.put(key.clone(), bytes, precondition).await {
            Ok(_) => {
                self.seen.insert(same, (key, stored));
            }
            Err(error) => {
                tracing::warn!(%error, reason = event.reason, object = %regarding.name, "cannot record an event");
            }
        }
    }

    /// A name suffix (hex of the time in nanoseconds, as Kubernetes' recorder makes
    /// them) after every earlier one.
    fn suffix(&mut self, now: SystemTime) -> u128 {
        let nanos = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        self.last_suffix = nanos.max(self.last_suffix + 1);
        self.last_suffix
    }

    /// Delete events past [`TTL`], then the oldest past nine tenths of [`MOST`] (room
    /// for the next ones without a prune each), and forget what the writer knew of them
    /// (and of anything it holds older than [`TTL`]: another replica may have deleted it).
    async fn prune(&mut self, now: SystemTime) {
        let stored = match self.store.list(KIND).await {
            Ok(stored) => stored,
            Err(error) => {
                tracing::warn!(%error, "cannot list events to prune them");
                return;
            }
        };
        let mut events: Vec<(SystemTime, ObjectKey)> = stored
            .into_iter()
            .map(|s| {
                let last = serde_json::from_slice::<StoredEvent>(&s.object)
                    .ok()
                    .and_then(|e| humantime::parse_rfc3339(&e.last_timestamp).ok())
                    // An event that does not read goes first.
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                (last, s.key)
            })
            .collect();
        events.sort_by_key(|(last, _)| *last);
        let beyond = events.len().saturating_sub(MOST / 10 * 9);
        let gone: HashSet<ObjectKey> = events
            .into_iter()
            .enumerate()
            .filter(|(index, (last, _))| {
                *index < beyond || now.duration_since(*last).is_ok_and(|age| age > TTL)
            })
            .map(|(_, (_, key))| key)
            .collect();
        let old = |event: &StoredEvent| {
            humantime::parse_rfc3339(&event.last_timestamp)
                .ok()
                .is_none_or(|last| now.duration_since(last).is_ok_and(|age| age > TTL))
        };
        self.seen
            .retain(|_, (key, event)| !gone.contains(key) && !old(event));
        self.budgets.retain(|_, (tokens, last)| {
            *tokens < BURST || now.duration_since(*last).is_ok_and(|idle| idle < REFILL)
        });
        for key in gone {
            if let Err(error) = self.store.delete(key.clone(), Precondition::Any).await {
                tracing::debug!(%error, %key, "an old event was not deleted");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::events::Regarding;

    fn writer(dir: &std::path::Path) -> Writer {
        Writer::new(Store::new(rigger_store::EmbeddedStore::open(dir).unwrap()))
    }

    fn event(name: &str, message: &str) -> Event {
        Event {
            regarding: Regarding {
                api_version: "apps.kruise.io/v1alpha1".to_owned(),
                kind: "ImagePullJob".to_owned(),
                namespace: "default".to_owned(),
                name: name.to_owned(),
                uid: format!("uid-{name}"),
            },
            warning: false,
            reason: "PullImageSucceed",
            message: message.to_owned(),
        }
    }

    async fn stored(writer: &Writer) -> Vec<StoredEvent> {
        writer
            .store
            .list(KIND)
            .await
            .unwrap()
            .iter()
            .map(|s| serde_json::from_slice(&s.object).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn a_repeated_event_is_one_object_counted_and_another_is_another() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = writer(dir.path());
        let t0 = humantime::parse_rfc3339("2026-11-26T10:00:00Z").unwrap();
        writer.write(event("warm", "pulled on n1"), t0).await;
        writer
            .write(event("warm", "pulled on n1"), t0 + Duration::from_secs(5))
            .await;
        writer.write(event("warm", "pulled on n2"), t0).await;
        let mut events = stored(&writer).await;
        events.sort_by_key(|e| e.count);
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].count, 2);
        assert_eq!(events[1].first_timestamp, "2026-11-26T10:00:00Z");
        assert_eq!(events[1].last_timestamp, "2026-11-26T10:00:05Z");
        assert_eq!(events[1].involved_object.name, "warm");
        assert_eq!(events[1].event_type, "Normal");
        assert_ne!(events[0].metadata.name, events[1].metadata.name);
        assert!(events[0].metadata.name.starts_with("warm."));
    }

    #[tokio::test]
    async fn events_past_their_time_go_and_the_oldest_go_past_the_most() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = writer(dir.path());
        let t0 = humantime::parse_rfc3339("2026-11-26T10:00:00Z").unwrap();
        writer.write(event("old", "long ago"), t0).await;
        let later = t0 + TTL - Duration::from_secs(10);
        writer.write(event("recent", "just now"), later).await;
        writer.prune(t0 + TTL + Duration::from_secs(1)).await;
        let names: Vec<String> = stored(&writer)
            .await
            .into_iter()
            .map(|e| e.involved_object.name)
            .collect();
        assert_eq!(names, ["recent"]);
        // The pruned one is not counted on: it comes back as a new object.
        writer
            .write(event("old", "long ago"), t0 + TTL + Duration::from_secs(2))
            .await;
        let again = stored(&writer).await;
        let old = again
            .iter()
            .find(|e| e.involved_object.name == "old")
            .unwrap();
        assert_eq!(old.count, 1);
    }

    #[tokio::test]
    async fn an_object_gets_a_burst_of_events_then_one_per_refill() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = writer(dir.path());
        let t0 = humantime::parse_rfc3339("2026-11-26T10:00:00Z").unwrap();
        // A hostile agent cycling its task: a new failure message each time.
        for i in 0..40u64 {
            writer
                .write(
                    event("spammed", &format!("failure {i}")),
                    t0 + Duration::from_millis(i),
                )
                .await;
        }
        writer.write(event("other", "fine"), t0).await;
        let stored = stored(&writer).await;
        let spammed = stored
            .iter()
            .filter(|e| e.involved_object.name == "spammed")
            .count();
        assert_eq!(spammed, 25, "the burst, no more");
        assert!(stored.iter().any(|e| e.involved_object.name == "other"));
        // A refill after the last, one more.
        writer
            .write(
                event("spammed", "failure 41"),
                t0 + Duration::from_millis(40) + REFILL,
            )
            .await;
        let again = stored_count(&writer, "spammed").await;
        assert_eq!(again, 26);
    }

    async fn stored_count(writer: &Writer, name: &str) -> usize {
        stored(writer)
            .await
            .iter()
            .filter(|e| e.involved_object.name == name)
            .count()
    }
}
