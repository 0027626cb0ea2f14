//! Running a pod's handlers — probes and lifecycle hooks — the way kubelet does: `exec`
//! through CRI ExecSync in the container, `httpGet` to the pod's address (the host's:
//! pods use host networking) where a status in 200–399 succeeds, `tcpSocket` a connect,
//! `sleep` (hooks only) a wait in the agent, bounded by the grace period as kubelet's.
//! (OpenKruise ignores tcpSocket preStop hooks, kruise #2505; Rigger does not.)

use std::time::Duration;

use rigger_proto::pod::{
    Container, ExecAction, Handler, HttpGetAction, IntOrName, Probe, SleepAction, TcpSocketAction,
};

use crate::cri::Cri;

/// One of a handler's kinds (a probe's three, and a hook's `sleep`).
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    Exec(&'a ExecAction),
    HttpGet(&'a HttpGetAction),
    TcpSocket(&'a TcpSocketAction),
    Sleep(&'a SleepAction),
}

impl<'a> Action<'a> {
    pub fn of_handler(handler: &'a Handler) -> Option<Self> {
        Self::pick(
            handler.exec.as_ref(),
            handler.http_get.as_ref(),
            handler.tcp_socket.as_ref(),
        )
        .or(handler.sleep.as_ref().map(Self::Sleep))
    }

    pub fn of_probe(probe: &'a Probe) -> Option<Self> {
        Self::pick(
            probe.exec.as_ref(),
            probe.http_get.as_ref(),
            probe.tcp_socket.as_ref(),
        )
    }

    fn pick(
        exec: Option<&'a ExecAction>,
        http: Option<&'a HttpGetAction>,
        tcp: Option<&'a TcpSocketAction>,
    ) -> Option<Self> {
        exec.map(Self::Exec)
            .or(http.map(Self::HttpGet))
            .or(tcp.map(Self::TcpSocket))
    }
}

/// `host` as a URL's host: an IPv6 address in brackets (a pod's IP may be one), as
/// kubelet joins host and port.
fn url_host(host: &str) -> std::borrow::Cow<'_, str> {
    if host.contains(':') && !host.starts_with('[') {
        std::borrow::Cow::Owned(format!("[{host}]"))
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

/// A port by number, or by the name of one of the container's ports.
fn port(container: &Container, port: &IntOrName) -> Result<u16, String> {
    match port {
        IntOrName::Int(number) => Ok(*number),
        IntOrName::Name(name) => container
            .ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| format!("the container has no port named {name:?}")),
    }
}

/// Run `action` against `container_id` within `timeout`; `Err` says why it failed.
pub async fn run(
    cri: &impl Cri,
    container: &Container,
    container_id: &str,
    action: Action<'_>,
    timeout: Duration,
) -> Result<(), String> {
    match action {
        Action::Exec(exec) => {
            let exit_code = tokio::time::timeout(
                timeout.saturating_add(Duration::from_secs(1)),
                cri.exec(container_id, &exec.command, timeout),
            )
            .await
            .map_err(|_| format!("exec timed out after {}s", timeout.as_secs()))??;
            if exit_code == 0 {
                Ok(())
            } else {
                Err(format!("exec exited with {exit_code}"))
            }
        }
        Action::HttpGet(http) => {
            let port = port(container, &http.port)?;
            let scheme = match http.scheme.as_deref() {
                Some("HTTPS") => "https",
                _ => "http",
            };
            let host = url_host(http.host.as_deref().unwrap_or("127.0.0.1"));
            let path = http.path.as_deref().unwrap_or("/");
            let url = format!("{scheme}://{host}:{port}{path}");
            // kubelet does not verify probe certificates; neither does the agent.
            rigger_daemon::tls::install_crypto_provider();
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .tls_danger_accept_invalid_certs(true)
                .build()
                .map_err(|e| e.to_string())?;
            let mut request = client.get(&url);
            for header in &http.http_headers {
                request = request.header(&header.name, &header.value);
            }
            let response = request
                .send()
                .await
                .map_err(|e| format!("GET {url}: {}", rigger_daemon::error_chain(&e)))?;
            let status = response.status();
            if (200..400).contains(&status.as_u16()) {
                Ok(())
            } else {
                Err(format!("GET {url}: HTTP {status}"))
            }
        }
        Action::TcpSocket(tcp) => {
            let port = port(container, &tcp.port)?;
            let host = tcp.host.as_deref().unwrap_or("127.0.0.1");
            tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port)))
                .await
                .map_err(|_| format!("connect {host}:{port} timed out"))?
                .map(drop)
                .map_err(|e| format!("connect {host}:{port}: {e}"))
        }
        Action::Sleep(sleep) => {
            // As kubelet: the whole sleep if the grace period allows, else as much of it
            // as it does, and the hook counts as failed (the stop follows either way).
            let wanted = Duration::from_secs(u64::try_from(sleep.seconds).unwrap_or(0));
            tokio::time::sleep(wanted.min(timeout)).await;
            if wanted <= timeout {
                Ok(())
            } else {
                Err(format!(
                    "sleep of {}s cut short by the grace period ({}s left)",
                    wanted.as_secs(),
                    timeout.as_secs()
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_host_is_bracketed_in_a_url() {
        assert_eq!(url_host("10.244.1.7"), "10.244.1.7");
        assert_eq!(url_host("fd00::7"), "[fd00::7]");
        assert_eq!(url_host("[fd00::7]"), "[fd00::7]");
        assert_eq!(url_host("pod.example"), "pod.example");
    }
}
