//! Retry delays for reconnecting to containerd or the controller.

use std::time::Duration;

/// Exponential backoff with jitter, so a fleet of agents does not reconnect in lockstep.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            attempt: 0,
        }
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(2u32.saturating_pow(self.attempt))
            .min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        // Between half the ceiling and the ceiling: spread out, never zero.
        ceiling.mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let first = b.next_delay();
        assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
        for _ in 0..10 {
            assert!(b.next_delay() <= Duration::from_secs(1));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
