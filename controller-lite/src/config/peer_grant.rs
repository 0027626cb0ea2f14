//! The peer grant keys: what the controller signs peer grants with, and the public keys
//! agents accept grants of.

use rigger_daemon::config::{ConfigError, Setting};

pub(super) const PEER_GRANT_KEY: Setting = Setting {
    key: "peer_grant_key",
    flag: "--peer-grant-key",
    env: "RIGGER_CONTROLLER_PEER_GRANT_KEY",
};
pub(super) const PEER_GRANT_VERIFY_KEYS: Setting = Setting {
    key: "peer_grant_verify_keys",
    flag: "--peer-grant-verify-keys",
    env: "RIGGER_CONTROLLER_PEER_GRANT_VERIFY_KEYS",
};

/// The peer grant key, read and checked: the private half signs grants, the public
/// half goes to every agent when it registers, with those of `peer_grant_verify_keys`.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerGrantKey {
    pub private_pem: Vec<u8>,
    pub public_pem: String,
    /// The other keys agents accept grants of (the next one, retired ones), public PEM.
    pub verify_pems: Vec<String>,
}

impl PeerGrantKey {
    /// Every public key agents accept grants of, the signing one first.
    pub fn public_pems(&self) -> Vec<String> {
        std::iter::once(self.public_pem.clone())
            .chain(self.verify_pems.iter().cloned())
            .collect()
    }
}

impl std::fmt::Debug for PeerGrantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerGrantKey")
            .field("public_pem", &self.public_pem)
            .finish_non_exhaustive()
    }
}

/// Read the peer grant key at `path`: an Ed25519 private key in PEM that signs.
pub(super) fn peer_grant_key(path: &std::path::Path) -> Result<PeerGrantKey, ConfigError> {
    let invalid = |reason: String| PEER_GRANT_KEY.invalid(format!("{}: {reason}", path.display()));
    let private_pem =
        rigger_daemon::config::read_small_file(path).map_err(|e| invalid(e.to_string()))?;
    let text = std::str::from_utf8(&private_pem).map_err(|e| invalid(e.to_string()))?;
    let key = rcgen::KeyPair::from_pem(text).map_err(|e| invalid(e.to_string()))?;
    if !key.is_compatible(&rcgen::PKCS_ED25519) {
        return Err(invalid("not an Ed25519 key".to_owned()));
    }
    let public_pem = key.public_key_pem();
    rigger_proto::peer_grant::GrantSigner::from_pem(&private_pem, public_pem.as_bytes())
        .map_err(|e| invalid(e.to_string()))?;
    Ok(PeerGrantKey {
        public_pem,
        private_pem,
        verify_pems: Vec::new(),
    })
}

/// The public half of the Ed25519 key at `path` (a public or a private key in PEM): a
/// key agents accept grants of besides the signing one.
pub(super) fn peer_grant_verify_key(path: &std::path::Path) -> Result<String, ConfigError> {
    let invalid =
        |reason: String| PEER_GRANT_VERIFY_KEYS.invalid(format!("{}: {reason}", path.display()));
    let pem = rigger_daemon::config::read_small_file(path).map_err(|e| invalid(e.to_string()))?;
    let text = std::str::from_utf8(&pem).map_err(|e| invalid(e.to_string()))?;
    let public_pem = if text.contains("PUBLIC KEY") {
        text.to_owned()
    } else {
        let key = rcgen::KeyPair::from_pem(text).map_err(|e| invalid(e.to_string()))?;
        if !key.is_compatible(&rcgen::PKCS_ED25519) {
            return Err(invalid("not an Ed25519 key".to_owned()));
        }
        key.public_key_pem()
    };
    rigger_proto::peer_grant::GrantVerifier::from_pems([public_pem.as_bytes()])
        .map_err(|e| invalid(e.to_string()))?;
    Ok(public_pem)
}
