//! The SidecarSet injection webhook's settings (Kubernetes mode, Rigger alone): where it
//! listens and how the API server reaches it, checked with the store they need.

use std::net::SocketAddr;

use rigger_daemon::config::{ConfigError, Setting};

use super::StoreConfig;
pub use crate::serve::webhook::settings::{SidecarWebhookSettings, WebhookAddress};

pub const DEFAULT_WEBHOOK_LISTEN: &str = "0.0.0.0:9443";
pub const DEFAULT_WEBHOOK_SERVICE: &str = "rigger-controller";

#[derive(Debug, Default, Clone, clap::Args)]
pub struct WebhookArgs {
    /// With the kubernetes store, Rigger alone: where the SidecarSet injection webhook
    /// (HTTPS, a certificate the controller keeps in a Secret of its namespace) listens
    /// [default: 0.0.0.0:9443].
    #[arg(
        long,
        env = "RIGGER_CONTROLLER_SIDECAR_WEBHOOK_LISTEN",
        value_name = "ADDR"
    )]
    pub sidecar_webhook_listen: Option<String>,
    /// With the kubernetes store: the Service (in kubernetes_namespace, port 443) the
    /// API server calls the webhook through [default: rigger-controller].
    #[arg(
        long,
        env = "RIGGER_CONTROLLER_SIDECAR_WEBHOOK_SERVICE",
        value_name = "NAME"
    )]
    pub sidecar_webhook_service: Option<String>,
    /// With the kubernetes store: the webhook's address as `https://HOST:PORT`, for a
    /// controller the API server reaches without a Service (outside the cluster);
    /// replaces sidecar_webhook_service.
    #[arg(
        long,
        env = "RIGGER_CONTROLLER_SIDECAR_WEBHOOK_URL",
        value_name = "URL"
    )]
    pub sidecar_webhook_url: Option<String>,
}

pub(super) const SIDECAR_WEBHOOK_LISTEN: Setting = Setting {
    key: "sidecar_webhook_listen",
    flag: "--sidecar-webhook-listen",
    env: "RIGGER_CONTROLLER_SIDECAR_WEBHOOK_LISTEN",
};
pub(super) const SIDECAR_WEBHOOK_SERVICE: Setting = Setting {
    key: "sidecar_webhook_service",
    flag: "--sidecar-webhook-service",
    env: "RIGGER_CONTROLLER_SIDECAR_WEBHOOK_SERVICE",
};
pub(super) const SIDECAR_WEBHOOK_URL: Setting = Setting {
    key: "sidecar_webhook_url",
    flag: "--sidecar-webhook-url",
    env: "RIGGER_CONTROLLER_SIDECAR_WEBHOOK_URL",
};

/// The webhook's settings: only with the kubernetes store, and not beside Kruise's
/// manager (whose webhook injects the sidecars then).
pub(super) fn sidecar_webhook(
    store: &StoreConfig,
    args: WebhookArgs,
) -> Result<Option<SidecarWebhookSettings>, ConfigError> {
    let settings = match store {
        StoreConfig::Kubernetes(settings) if !settings.kruise_manager => settings,
        _ => {
            for (setting, given) in [
                (
                    SIDECAR_WEBHOOK_LISTEN,
                    args.sidecar_webhook_listen.is_some(),
                ),
                (
                    SIDECAR_WEBHOOK_SERVICE,
                    args.sidecar_webhook_service.is_some(),
                ),
                (SIDECAR_WEBHOOK_URL, args.sidecar_webhook_url.is_some()),
            ] {
                if given {
                    return Err(setting.invalid(
                        "applies to the kubernetes store without kruise_manager only (Kruise's webhook injects sidecars beside it)",
                    ));
                }
            }
            return Ok(None);
        }
    };
    let listen_text = args
        .sidecar_webhook_listen
        .unwrap_or_else(|| DEFAULT_WEBHOOK_LISTEN.to_owned());
    let listen: SocketAddr = listen_text.parse().map_err(|_| {
        SIDECAR_WEBHOOK_LISTEN.invalid(format!("{listen_text:?} is not ADDRESS:PORT"))
    })?;
    let reached_at = match (args.sidecar_webhook_url, args.sidecar_webhook_service) {
        (Some(_), Some(_)) => {
            return Err(SIDECAR_WEBHOOK_URL.invalid("set it or sidecar_webhook_service, not both"));
        }
        (Some(url), None) => {
            let host = url_host(&url).map_err(|e| SIDECAR_WEBHOOK_URL.invalid(e))?;
            WebhookAddress::Url {
                base: url.trim_end_matches('/').to_owned(),
                host,
            }
        }
        (None, service) => {
            let name = service.unwrap_or_else(|| DEFAULT_WEBHOOK_SERVICE.to_owned());
            if !super::is_dns_label(&name) {
                return Err(
                    SIDECAR_WEBHOOK_SERVICE.invalid(format!("{name:?} is not a Service name"))
                );
            }
            WebhookAddress::Service {
                namespace: settings.namespace.clone(),
                name,
            }
        }
    };
    Ok(Some(SidecarWebhookSettings { listen, reached_at }))
}

/// The host of `https://HOST:PORT` (a DNS name or an IP address; brackets off an IPv6
/// one), or why the URL cannot be the webhook's.
fn url_host(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| format!("{url:?}: the API server calls webhooks over https:// only"))?;
    let authority = rest.trim_end_matches('/');
    if authority.contains(['/', '?', '#', '@']) || authority.is_empty() {
        return Err(format!(
            "{url:?}: give https://HOST:PORT only (the path is Rigger's, and no user or query)"
        ));
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6
            .split_once(']')
            .map(|(host, _)| host.to_owned())
            .ok_or_else(|| format!("{url:?}: an unclosed IPv6 address"))?,
        None => authority
            .split_once(':')
            .map_or(authority, |(host, _)| host)
            .to_owned(),
    };
    if host.is_empty() {
        return Err(format!("{url:?} names no host"));
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn webhook_urls_are_https_host_and_port_only() {
        assert_eq!(url_host("https://127.0.0.1:9443").unwrap(), "127.0.0.1");
        assert_eq!(url_host("https://[::1]:9443/").unwrap(), "::1");
        assert_eq!(
            url_host("https://rigger.example").unwrap(),
            "rigger.example"
        );
        for bad in [
            "http://127.0.0.1:9443",
            "https://127.0.0.1:9443/inject",
            "https://user@host:1",
            "https://",
        ] {
            assert!(url_host(bad).is_err(), "{bad}");
        }
    }
}
