//! The webhook's settings as resolved from the controller's configuration
//! (which checks them before anything binds).

use std::net::SocketAddr;

/// The webhook, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarWebhookSettings {
    pub listen: SocketAddr,
    pub reached_at: WebhookAddress,
}

/// How the API server reaches the webhook (its `clientConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookAddress {
    Service {
        namespace: String,
        name: String,
    },
    /// `https://HOST:PORT`, without a path.
    Url {
        base: String,
        host: String,
    },
}

impl WebhookAddress {
    /// The names the serving certificate must hold.
    pub fn certificate_names(&self) -> Vec<String> {
        match self {
            Self::Service { namespace, name } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ],
            Self::Url { host, .. } => vec![host.clone()],
        }
    }
}
