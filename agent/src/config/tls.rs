//! How the agent proves who it is and checks whom it talks to: the controller link's
//! TLS (`ca_file`, `cert_file`, `key_file`, or `insecure_plaintext`), whose node
//! certificate also serves peers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rigger_daemon::config::{ConfigError, Setting};
use rigger_pull::peers::PeerIdentity;

use super::CONTROLLER;

/// How the agent proves who it is and checks the controller.
pub(super) struct TlsSettings {
    pub(super) ca_file: Option<PathBuf>,
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
    pub(super) insecure_plaintext: bool,
}

/// This node's certificate, key and the fleet's CA, read from the link's TLS files: what
/// the https:// controller `url` is reached with, and peers are served and fetched from.
fn node_identity(tls: &TlsSettings, url: &str) -> Result<PeerIdentity, ConfigError> {
    let file = |setting: Setting, path: &Option<PathBuf>, label: &str| {
        let path = path.as_deref().ok_or_else(|| {
            setting.invalid(format!("is needed for the https:// controller {url:?}"))
        })?;
        read_pem(setting, path, label)
    };
    Ok(PeerIdentity {
        ca_pem: file(CA_FILE, &tls.ca_file, "CERTIFICATE")?,
        cert_pem: file(CERT_FILE, &tls.cert_file, "CERTIFICATE")?,
        key_pem: file(KEY_FILE, &tls.key_file, "PRIVATE KEY")?,
    })
}

fn read_pem(setting: Setting, path: &Path, label: &str) -> Result<Vec<u8>, ConfigError> {
    let bytes = rigger_daemon::config::read_small_file(path)
        .map_err(|e| setting.invalid(format!("{}: {e}", path.display())))?;
    if !String::from_utf8_lossy(&bytes).contains(&format!(" {label}-----")) {
        return Err(setting.invalid(format!("{}: no PEM {label} in it", path.display())));
    }
    Ok(bytes)
}

/// The endpoint of the controller replica at `url`. The node's identity is read from the
/// TLS files for the first https:// one into `identity`, and shared by the others.
pub(super) fn controller_endpoint(
    url: &str,
    tls: &TlsSettings,
    identity: &mut Option<PeerIdentity>,
) -> Result<tonic::transport::Endpoint, ConfigError> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map(|e| {
            e.connect_timeout(Duration::from_secs(10))
                .http2_keep_alive_interval(Duration::from_secs(30))
                .keep_alive_timeout(Duration::from_secs(10))
        })
        .map_err(|e| CONTROLLER.invalid(format!("{url:?} is not a URL ({e})")))?;
    if url.starts_with("http://") {
        if !tls.insecure_plaintext {
            return Err(CONTROLLER.invalid(format!(
                "{url:?} is plain text: tasks and pull secrets would travel unencrypted and the controller could not check who this node is; use https:// with ca_file, cert_file and key_file, or set insecure_plaintext on trusted networks"
            )));
        }
        return Ok(endpoint);
    }
    if !url.starts_with("https://") {
        return Err(CONTROLLER.invalid(format!("{url:?}: expected an https:// URL")));
    }
    if tls.insecure_plaintext {
        return Err(
            INSECURE_PLAINTEXT.invalid(format!("contradicts the https:// controller {url:?}"))
        );
    }
    let identity = match identity {
        Some(identity) => identity,
        None => identity.insert(node_identity(tls, url)?),
    };
    endpoint
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&identity.ca_pem))
                .identity(tonic::transport::Identity::from_pem(
                    &identity.cert_pem,
                    &identity.key_pem,
                )),
        )
        .map_err(|e| CONTROLLER.invalid(format!("TLS settings: {e}")))
}

const CA_FILE: Setting = Setting {
    key: "ca_file",
    flag: "--ca-file",
    env: "RIGGER_AGENT_CA_FILE",
};
const CERT_FILE: Setting = Setting {
    key: "cert_file",
    flag: "--cert-file",
    env: "RIGGER_AGENT_CERT_FILE",
};
const KEY_FILE: Setting = Setting {
    key: "key_file",
    flag: "--key-file",
    env: "RIGGER_AGENT_KEY_FILE",
};
const INSECURE_PLAINTEXT: Setting = Setting {
    key: "insecure_plaintext",
    flag: "--insecure-plaintext",
    env: "RIGGER_AGENT_INSECURE_PLAINTEXT",
};
