//! systemd `Type=notify` support. Outside systemd (no `NOTIFY_SOCKET`) these do nothing.

use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(states) {
        // Not fatal: the service still works, only systemd's view of it is late.
        tracing::warn!(%error, "could not notify systemd");
    }
}

/// Tell systemd the daemon is serving.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tell systemd the daemon has begun to stop.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// Update the one-line status `systemctl status` shows.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Ping systemd's watchdog (`WatchdogSec=`) at half its interval until `token` is
/// cancelled; a stalled runtime stops the pings and systemd restarts the service. Does
/// nothing when the unit has no watchdog.
pub async fn watchdog(token: tokio_util::sync::CancellationToken) {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return;
    };
    let mut ticker = tokio::time::interval(interval / 2);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = ticker.tick() => send(&[NotifyState::Watchdog]),
        }
    }
}
