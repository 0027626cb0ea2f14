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

/// This node's certificate, key and the fleet's CA, read from the link's TLS files (for
/// serving peers and fetching from them); `None` without a complete set (a plaintext
/// controller, or none).
pub(super) fn node_identity(tls: &TlsSettings) -> Result<Option<PeerIdentity>, ConfigError> {
    let (Some(ca), Some(cert), Some(key)) = (&tls.ca_file, &tls.cert_file, &tls.key_file) else {
        return Ok(None);
    };
    Ok(Some(PeerIdentity {
        ca_pem: read_pem(CA_FILE, ca, "CERTIFICATE")?,
        cert_pem: read_pem(CERT_FILE, cert, "CERTIFICATE")?,
        key_pem: read_pem(KEY_FILE, key, "PRIVATE KEY")?,
    }))
}

pub(super) fn read_pem(setting: Setting, path: &Path, label: &str) -> Result<Vec<u8>, ConfigError> {
    let bytes = rigger_daemon::config::read_small_file(path)
        .map_err(|e| setting.invalid(format!("{}: {e}", path.display())))?;
    if !String::from_utf8_lossy(&bytes).contains(&format!(" {label}-----")) {
        return Err(setting.invalid(format!("{}: no PEM {label} in it", path.display())));
    }
    Ok(bytes)
}

pub(super) fn controller_endpoint(
    url: &str,
    tls: &TlsSettings,
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
    let missing = |setting: Setting| {
        setting.invalid(format!("is needed for the https:// controller {url:?}"))
    };
    let ca = read_pem(
        CA_FILE,
        tls.ca_file.as_deref().ok_or_else(|| missing(CA_FILE))?,
        "CERTIFICATE",
    )?;
    let cert = read_pem(
        CERT_FILE,
        tls.cert_file.as_deref().ok_or_else(|| missing(CERT_FILE))?,
        "CERTIFICATE",
    )?;
    let key = read_pem(
        KEY_FILE,
        tls.key_file.as_deref().ok_or_else(|| missing(KEY_FILE))?,
        "PRIVATE KEY",
    )?;
    endpoint
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                .identity(tonic::transport::Identity::from_pem(cert, key)),
        )
        .map_err(|e| CONTROLLER.invalid(format!("TLS settings: {e}")))
}

pub(super) const CA_FILE: Setting = Setting {
    key: "ca_file",
    flag: "--ca-file",
    env: "RIGGER_AGENT_CA_FILE",
};
pub(super) const CERT_FILE: Setting = Setting {
    key: "cert_file",
    flag: "--cert-file",
    env: "RIGGER_AGENT_CERT_FILE",
};
pub(super) const KEY_FILE: Setting = Setting {
    key: "key_file",
    flag: "--key-file",
    env: "RIGGER_AGENT_KEY_FILE",
};
pub(super) const INSECURE_PLAINTEXT: Setting = Setting {
    key: "insecure_plaintext",
    flag: "--insecure-plaintext",
    env: "RIGGER_AGENT_INSECURE_PLAINTEXT",
};
