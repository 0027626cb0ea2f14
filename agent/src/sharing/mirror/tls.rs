//! The mirror answers only the node's containerd: HTTPS on loopback, and a client
//! certificate required that only root can read. The agent keeps a small PKI of its own
//! for it under `<state_dir>/mirror/` (0700, every file 0600): a CA, the mirror's server
//! certificate (for the loopback address it listens on), and the client certificate and
//! key containerd presents — named in `hosts.toml` as `ca` and `client`. Any other
//! process on the node, or a pod in the host's network, gets no answer: it cannot
//! complete the handshake.

use std::net::IpAddr;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

use rigger_pull::peers::PeerIdentity;

/// The files of the mirror's PKI, in its directory.
pub const CA_FILE: &str = "ca.pem";
const CA_KEY_FILE: &str = "ca-key.pem";
const SERVER_FILE: &str = "server.pem";
const SERVER_KEY_FILE: &str = "server-key.pem";
/// What containerd presents (`client = [["client.pem", "client-key.pem"]]`).
pub const CLIENT_FILE: &str = "client.pem";
pub const CLIENT_KEY_FILE: &str = "client-key.pem";
/// The address the server certificate was made for.
const LISTEN_FILE: &str = "listen";

#[derive(Debug, thiserror::Error)]
#[error("the mirror's TLS files in {dir}: {detail}")]
pub struct MirrorTlsError {
    pub dir: PathBuf,
    pub detail: String,
}

/// The mirror's server TLS, built from its files.
#[derive(Debug, Clone)]
pub struct MirrorTls {
    pub server: Arc<rustls::ServerConfig>,
    pub dir: PathBuf,
}

/// The mirror's PKI in `dir`, made when missing, unreadable, or made for another
/// address than `listen`'s; kept otherwise (containerd's `hosts.toml` names the files).
pub fn ensure(dir: &Path, listen: IpAddr) -> Result<MirrorTls, MirrorTlsError> {
    let error = |detail: String| MirrorTlsError {
        dir: dir.to_owned(),
        detail,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| error(e.to_string()))?;
    if let Ok(server) = load(dir, listen) {
        return Ok(MirrorTls {
            server,
            dir: dir.to_owned(),
        });
    }
    tracing::info!(dir = %dir.display(), "making the mirror's certificates (containerd's hosts.toml names ca.pem and client.pem)");
    make(dir, listen).map_err(error)?;
    let server = load(dir, listen).map_err(error)?;
    Ok(MirrorTls {
        server,
        dir: dir.to_owned(),
    })
}

fn read(dir: &Path, file: &str) -> Result<Vec<u8>, String> {
    std::fs::read(dir.join(file)).map_err(|e| format!("{file}: {e}"))
}

/// The server config from the files, when they are whole and made for `listen`.
fn load(dir: &Path, listen: IpAddr) -> Result<Arc<rustls::ServerConfig>, String> {
    let made_for = read(dir, LISTEN_FILE)?;
    if String::from_utf8_lossy(&made_for).trim() != listen.to_string() {
        return Err("made for another address".to_owned());
    }
    // The client's pair must be there and whole too: containerd reads it.
    for file in [CA_KEY_FILE, CLIENT_FILE, CLIENT_KEY_FILE] {
        let text = String::from_utf8(read(dir, file)?).map_err(|e| format!("{file}: {e}"))?;
        if !text.contains("-----BEGIN") {
            return Err(format!("{file}: not PEM"));
        }
    }
    let identity = PeerIdentity {
        ca_pem: read(dir, CA_FILE)?,
        cert_pem: read(dir, SERVER_FILE)?,
        key_pem: read(dir, SERVER_KEY_FILE)?,
    };
    crate::sharing::peers::serve::server_config(&identity).map_err(|e| e.to_string())
}

/// A new CA, server certificate (for `listen`, `localhost` and the loopback addresses)
/// and client certificate, written durably, each file 0600.
fn make(dir: &Path, listen: IpAddr) -> Result<(), String> {
    let issue = |e: rcgen::Error| e.to_string();
    let ca_key = KeyPair::generate().map_err(issue)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(issue)?;
    ca.distinguished_name
        .push(DnType::CommonName, "rigger-agent mirror CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca.self_signed(&ca_key).map_err(issue)?;

    let server_key = KeyPair::generate().map_err(issue)?;
    let mut server = CertificateParams::new(vec!["localhost".to_owned()]).map_err(issue)?;
    server
        .distinguished_name
        .push(DnType::CommonName, "rigger-agent mirror");
    let mut addresses = vec![
        listen,
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ];
    addresses.dedup();
    server
        .subject_alt_names
        .extend(addresses.into_iter().map(SanType::IpAddress));
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = server.signed_by(&server_key, &ca, &ca_key).map_err(issue)?;

    let client_key = KeyPair::generate().map_err(issue)?;
    let mut client = CertificateParams::new(Vec::<String>::new()).map_err(issue)?;
    client
        .distinguished_name
        .push(DnType::CommonName, "containerd (this node's)");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = client.signed_by(&client_key, &ca, &ca_key).map_err(issue)?;

    let write = |file: &str, text: String| {
        rigger_daemon::durable::write_atomically(&dir.join(file), text.as_bytes())
            .map_err(|e| format!("{file}: {e}"))
    };
    // The address last: until it is written, the files count as unmade.
    let _ = std::fs::remove_file(dir.join(LISTEN_FILE));
    write(CA_KEY_FILE, ca_key.serialize_pem())?;
    write(CA_FILE, ca.pem())?;
    write(SERVER_KEY_FILE, server_key.serialize_pem())?;
    write(SERVER_FILE, server.pem())?;
    write(CLIENT_KEY_FILE, client_key.serialize_pem())?;
    write(CLIENT_FILE, client.pem())?;
    write(LISTEN_FILE, listen.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_pki_is_made_once_private_and_made_again_for_another_address() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("mirror");
        let loopback = IpAddr::from([127, 0, 0, 1]);
        ensure(&dir, loopback).unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        for file in [
            CA_FILE,
            CA_KEY_FILE,
            SERVER_FILE,
            SERVER_KEY_FILE,
            CLIENT_FILE,
            CLIENT_KEY_FILE,
        ] {
            assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
        }
        let client = std::fs::read(dir.join(CLIENT_KEY_FILE)).unwrap();
        // Kept across starts: containerd's hosts.toml names these files.
        ensure(&dir, loopback).unwrap();
        assert_eq!(std::fs::read(dir.join(CLIENT_KEY_FILE)).unwrap(), client);
        // A torn set is made again.
        std::fs::write(dir.join(SERVER_FILE), b"torn").unwrap();
        ensure(&dir, loopback).unwrap();
        assert_ne!(std::fs::read(dir.join(CLIENT_KEY_FILE)).unwrap(), client);
        // Another address: made again for it.
        let before = std::fs::read(dir.join(CLIENT_KEY_FILE)).unwrap();
        ensure(&dir, IpAddr::from([127, 0, 0, 2])).unwrap();
        assert_ne!(std::fs::read(dir.join(CLIENT_KEY_FILE)).unwrap(), before);
    }
}
