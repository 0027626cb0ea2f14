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
    let stream = stream.default_backoff();
    futures::pin_mut!(stream);
    loop {
        let event = tokio::select! {
            () = token.cancelled() => return,
            event = stream.next() => event,
        };
        match event {
            Some(Ok(event)) => take(event),
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
}
