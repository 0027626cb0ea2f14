//! What the cluster's watches have in common: one kind's objects kept by key as a watch
//! lists and changes them ([`Relisted`], pure), and the loop that follows a watch until
//! the controller stops ([`follow`]).

use futures::{Stream, StreamExt as _};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use std::collections::HashMap;
use tokio_util::sync::CancellationToken;

/// Objects by key, as a watch has them: a restarted watch lists everything again, and
/// what it does not list is gone.
#[derive(Debug)]
pub struct Relisted<V> {
    pub current: HashMap<String, V>,
    listing: Option<HashMap<String, V>>,
}

impl<V> Default for Relisted<V> {
    fn default() -> Self {
        Self {
            current: HashMap::new(),
            listing: None,
        }
    }
}

impl<V: Clone + PartialEq> Relisted<V> {
    /// Take in one watch event; `true` when what is kept changed. `entry` is an object's
    /// key and what is kept of it (`None`: nothing to keep, so a kept one is forgotten);
    /// `key` its key alone.
    pub fn apply<K>(
        &mut self,
        event: Event<K>,
        entry: impl Fn(&K) -> Option<(String, V)>,
        key: impl Fn(&K) -> Option<String>,
    ) -> bool {
        match event {
            Event::Init => {
                self.listing = Some(HashMap::new());
                false
            }
            Event::InitApply(object) => {
                if let (Some(listing), Some((key, value))) = (&mut self.listing, entry(&object)) {
                    listing.insert(key, value);
                }
                false
            }
            Event::InitDone => {
                self.current = self.listing.take().unwrap_or_default();
                true
            }
            Event::Apply(object) => match entry(&object) {
                Some((key, value)) => self.current.insert(key, value.clone()) != Some(value),
                None => key(&object).is_some_and(|key| self.current.remove(&key).is_some()),
            },
            Event::Delete(object) => {
                key(&object).is_some_and(|key| self.current.remove(&key).is_some())
            }
        }
    }
}

/// Follow `stream` (the watch of `what`) until `token` is cancelled, handing each event
/// to `take`. A broken watch or a failed list is retried with kube's default backoff
/// (from 0.8 s, doubling to 30 s, jittered): a re-list is the most expensive request a
/// controller makes of a big cluster, and an API server that refuses one must not be
/// asked again every second.
pub async fn follow<K>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send,
    what: &str,
    mut take: impl FnMut(Event<K>),
    token: CancellationToken,
) {
    follow_gathering(
        stream,
        what,
        None,
        |step| {
            if let Step::Event(event) = step {
                take(event);
            }
        },
        token,
    )
    .await;
}

/// What [`follow_gathering`] hands on: an event, or the moment to publish what the
/// events since the last one gathered.
#[derive(Debug)]
pub enum Step<K> {
    Event(K),
    Publish,
}

/// [`follow`], with `take` also told to publish every `publish_every` (where given):
/// for a watch whose readers need a whole view rebuilt from every object, not each
/// event. At a hundred Pods made a second that rebuild on every event held the watch
/// behind the API server, which then ended it ("too old resource version") and it
/// listed every Pod again.
pub async fn follow_gathering<K>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>> + Send,
    what: &str,
    publish_every: Option<std::time::Duration>,
    mut take: impl FnMut(Step<Event<K>>),
    token: CancellationToken,
) {
    let stream = stream.default_backoff();
    futures::pin_mut!(stream);
    let mut publishing = publish_every.map(|every| {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    let next_publish = async |ticks: &mut Option<tokio::time::Interval>| match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    };
    loop {
        let event = tokio::select! {
            () = token.cancelled() => return,
            () = next_publish(&mut publishing) => {
                take(Step::Publish);
                continue;
            }
            event = stream.next() => event,
        };
        match event {
            Some(Ok(event)) => take(Step::Event(event)),
            Some(Err(error)) => {
                tracing::warn!(%error, "watching the cluster's {what}; retrying after a backoff");
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_watch_whose_list_keeps_failing_is_retried_with_a_growing_backoff() {
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = polls.clone();
        // Every list fails, as a busy API server's would.
        let failing = futures::stream::poll_fn(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            std::task::Poll::Ready(Some(Err::<Event<()>, _>(watcher::Error::NoResourceVersion)))
        });
        let token = CancellationToken::new();
        let following = tokio::spawn(follow(failing, "things", |_| {}, token.clone()));
        tokio::time::sleep(Duration::from_secs(60)).await;
        token.cancel();
        following.await.ok();
        // 0.8 s doubling (jittered) to 30 s: a handful of lists in a minute, not sixty.
        let lists = polls.load(Ordering::SeqCst);
        assert!((3..=9).contains(&lists), "{lists} lists in a minute");
    }

    #[tokio::test(start_paused = true)]
    async fn events_are_published_by_the_clock_not_one_by_one_and_the_last_ones_too() {
        // A burst of a thousand events, then a watch that falls quiet.
        let events = (0..1000_u32).map(|n| Ok::<_, watcher::Error>(Event::Apply(n)));
        let stream = futures::stream::iter(events).chain(futures::stream::pending());
        let published = Arc::new(std::sync::Mutex::new(Vec::new()));
        let token = CancellationToken::new();
        let following = {
            let published = published.clone();
            let mut taken = 0_u32;
            tokio::spawn(follow_gathering(
                stream,
                "things",
                Some(Duration::from_millis(500)),
                move |step| match step {
                    Step::Event(_) => taken += 1,
                    Step::Publish => published.lock().unwrap().push(taken),
                },
                token.clone(),
            ))
        };
        tokio::time::sleep(Duration::from_millis(1600)).await;
        token.cancel();
        following.await.ok();
        let published = published.lock().unwrap().clone();
        // Ticks at 0, 0.5, 1 and 1.5 s: four publishes for a thousand events, the last
        // with every event in it although none came after the burst.
        assert_eq!(published.len(), 4, "{published:?}");
        assert_eq!(published.last(), Some(&1000), "{published:?}");
    }
}
