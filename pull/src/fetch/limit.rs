//! Node-wide transfer limits: a cap on bytes per second shared by every download.

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

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
