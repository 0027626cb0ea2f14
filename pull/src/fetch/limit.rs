//! Node-wide transfer limits: the connections every download shares, and a cap on
//! bytes per second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};

use crate::presence::Presence;

/// The node's connections to registries: a permit per request, and a count of the
/// requests waiting for one. A permit free while nobody waits is an idle connection,
/// which a blob's last long request may share its work with ([`Self::take_idle`]).
#[derive(Debug, Clone)]
pub(crate) struct Connections {
    permits: Arc<Semaphore>,
    waiting: Presence,
}

impl Connections {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max.max(1))),
            waiting: Presence::default(),
        }
    }

    /// Wait for a connection of the node's; held until the permit drops.
    pub(crate) async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        let _waiting = self.waiting.enter();
        self.permits.clone().acquire_owned().await.ok()
    }

    /// Connections free while no request waits for one.
    pub(crate) fn idle(&self) -> usize {
        match self.waiting.now() {
            0 => self.permits.available_permits(),
            _ => 0,
        }
    }

    /// A connection that is free while no request waits for one, taken.
    pub(crate) fn take_idle(&self) -> Option<OwnedSemaphorePermit> {
        match self.waiting.now() {
            0 => self.permits.clone().try_acquire_owned().ok(),
            _ => None,
        }
    }
}

/// A token bucket holding up to one second of bytes.
#[derive(Debug)]
pub struct RateLimit {
    bytes_per_second: u64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimit {
    pub fn new(bytes_per_second: u64) -> Self {
        Self {
            bytes_per_second: bytes_per_second.max(1),
            state: Mutex::new((bytes_per_second as f64, Instant::now())),
        }
    }

    /// Wait until `n` more bytes may be transferred.
    pub async fn acquire(&self, n: usize) {
        let rate = self.bytes_per_second as f64;
        let wait = {
            let mut state = self.state.lock().await;
            let (tokens, last) = &mut *state;
            let now = Instant::now();
            *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rate).min(rate);
            *last = now;
            *tokens -= n as f64;
            if *tokens < 0.0 {
                Duration::from_secs_f64(-*tokens / rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_idle_connection_is_taken_only_when_free_and_nobody_waits() {
        let connections = Connections::new(1);
        assert_eq!(connections.idle(), 1);
        let held = connections.take_idle();
        assert!(held.is_some());
        assert_eq!(connections.idle(), 0);
        assert!(connections.take_idle().is_none(), "none free");
        let waiter = connections.clone();
        let waiting = tokio::spawn(async move { waiter.acquire().await.is_some() });
        while connections.waiting.now() == 0 {
            tokio::task::yield_now().await;
        }
        drop(held);
        // Free, but the waiter's: not idle.
        assert!(connections.take_idle().is_none());
        assert!(waiting.await.unwrap());
        assert!(connections.take_idle().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn debt_is_paid_in_time() {
        let limit = RateLimit::new(1000);
        let start = tokio::time::Instant::now();
        limit.acquire(1000).await; // the initial second of burst
        limit.acquire(500).await; // half a second of debt
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(450), "{waited:?}");
    }
}
