//! Graceful shutdown: the first SIGTERM or SIGINT starts draining, a second one is not
//! needed because draining is bounded by the daemon's drain timeout.

use std::future::Future;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Which signal asked us to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    Terminate,
    Interrupt,
}

impl std::fmt::Display for StopSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
        })
    }
}

/// Install SIGTERM/SIGINT handlers now (so a signal arriving during start-up is not lost)
/// and return a future that resolves on the first of them.
pub fn stop_signal() -> std::io::Result<impl Future<Output = StopSignal>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => StopSignal::Terminate,
            _ = int.recv() => StopSignal::Interrupt,
        }
    })
}

/// Result of waiting for background work after shutdown was requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    Completed,
    TimedOut,
}

/// Cancel `token`, then wait up to `timeout` for `work` to finish.
pub async fn drain<F: Future>(token: &CancellationToken, timeout: Duration, work: F) -> Drain {
    token.cancel();
    match tokio::time::timeout(timeout, work).await {
        Ok(_) => Drain::Completed,
        Err(_) => Drain::TimedOut,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drain_reports_timeout() {
        let token = CancellationToken::new();
        let slow = std::future::pending::<()>();
        assert_eq!(
            drain(&token, Duration::from_millis(10), slow).await,
            Drain::TimedOut
        );
        assert!(token.is_cancelled());
    }

    #[tokio::test]
    async fn drain_waits_for_cancelled_work() {
        let token = CancellationToken::new();
        let child = token.clone();
        let work = tokio::spawn(async move { child.cancelled().await });
        let outcome = drain(&token, Duration::from_secs(5), work).await;
        assert_eq!(outcome, Drain::Completed);
    }
}
