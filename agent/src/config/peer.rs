//! Serving blobs to peers (`peer_*` settings): off unless `peer_listen` is set, and then
//! only with the controller link's TLS material, whose node certificate is what peers
//! check this node by.

use rigger_daemon::config::{ConfigError, Setting};

use rigger_pull::peers::{PeerIdentity, PeerPace};

use crate::sharing::peers::PeerSettings;
use crate::sharing::peers::serve::server_config;

/// Peer connections served at once by default: enough for a fan-out of a few nodes
/// fetching with ranges, few enough that the node's own work keeps its CPU.
pub const DEFAULT_PEER_MAX_CONNECTIONS: usize = 8;
/// Bytes per second served to peers by default (about 1.7 Gbit/s): a 10 Gbit/s node
/// keeps most of its link for its own pulls and workloads.
pub const DEFAULT_PEER_UPLOAD_RATE: u64 = 200 << 20;

/// The `peer_*` values as given.
#[derive(Debug, Default)]
pub(super) struct PeerArgs {
    pub(super) listen: Option<String>,
    pub(super) address: Option<String>,
    pub(super) max_connections: Option<usize>,
    pub(super) upload_rate: Option<String>,
}

/// The peer settings, checked; `None` when `peer_listen` is unset (and then no other
/// `peer_*` setting may be).
pub(super) fn resolve(
    args: PeerArgs,
    controller: Option<&str>,
    node_name: Option<&str>,
    identity: Option<&PeerIdentity>,
) -> Result<Option<PeerSettings>, ConfigError> {
    let Some(listen) = args.listen else {
        if args.address.is_some() || args.max_connections.is_some() || args.upload_rate.is_some() {
            return Err(PEER_LISTEN
                .invalid("is needed by peer_address, peer_max_connections and peer_upload_rate"));
        }
        return Ok(None);
    };
    let listen = PEER_LISTEN.socket_addr(Some(listen), "")?;
    if !controller.is_some_and(|c| c.split(',').all(|u| u.trim().starts_with("https://"))) {
        return Err(PEER_LISTEN.invalid(NEEDS_HTTPS));
    }
    let address = match args.address {
        Some(address) => address,
        None if listen.ip().is_unspecified() => {
            return Err(PEER_ADDRESS.invalid(format!(
                "is needed: peer_listen {listen} does not say where other nodes reach this one"
            )));
        }
        None => listen.to_string(),
    };
    let port_ok = address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !port_ok || address.contains('/') || address.chars().any(char::is_whitespace) {
        return Err(PEER_ADDRESS.invalid(format!("{address:?} is not host:port")));
    }
    let max_connections = args.max_connections.unwrap_or(DEFAULT_PEER_MAX_CONNECTIONS);
    if max_connections == 0 {
        return Err(PEER_MAX_CONNECTIONS.invalid("must be at least 1"));
    }
    let upload_rate =
        super::bytes(PEER_UPLOAD_RATE, args.upload_rate)?.unwrap_or(DEFAULT_PEER_UPLOAD_RATE);
    if upload_rate < 1 << 20 {
        return Err(PEER_UPLOAD_RATE.invalid("must be at least 1MiB"));
    }
    // The link read it (an https:// controller needs the same files).
    let Some(identity) = identity.cloned() else {
        return Err(PEER_LISTEN.invalid(NEEDS_HTTPS));
    };
    // The same check the server makes when it starts: a key that does not match its
    // certificate is a configuration error, found before anything binds.
    server_config(&identity).map_err(|e| PEER_LISTEN.invalid(e.to_string()))?;
    let Some(node) = node_name else {
        return Err(PEER_LISTEN.invalid(NEEDS_HTTPS));
    };
    Ok(Some(PeerSettings {
        node: node.to_owned(),
        listen,
        address,
        max_connections,
        upload_rate,
        identity,
    }))
}

/// The registry mirror's address, checked: loopback only (it is for this node's
/// containerd, and answers without credentials), and only with the link's node
/// certificate (it fetches from peers as this node).
pub(super) fn mirror(
    listen: Option<String>,
    controller: Option<&str>,
    identity: Option<&PeerIdentity>,
) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    let listen = MIRROR_LISTEN.socket_addr(Some(listen), "")?;
    if !listen.ip().is_loopback() {
        return Err(MIRROR_LISTEN.invalid(format!(
            "{listen} is not a loopback address: the mirror is for this node's containerd (e.g. 127.0.0.1:9442)"
        )));
    }
    let https = controller.is_some_and(|c| c.split(',').all(|u| u.trim().starts_with("https://")));
    if !https || identity.is_none() {
        return Err(MIRROR_LISTEN.invalid(NEEDS_HTTPS));
    }
    Ok(Some(listen))
}

/// The pace peers must keep (`peer_min_rate`), checked: a floor of nothing would let a
/// peer trickle, and one above what any link carries would leave every peer.
pub(super) fn pace(min_rate: Option<u64>) -> Result<PeerPace, ConfigError> {
    let pace = PeerPace::default();
    let Some(min_rate) = min_rate else {
        return Ok(pace);
    };
    if !(64 << 10..=1 << 30).contains(&min_rate) {
        return Err(PEER_MIN_RATE.invalid("must be between 64KiB and 1GiB"));
    }
    Ok(PeerPace { min_rate, ..pace })
}

const NEEDS_HTTPS: &str = "needs an https:// controller: peers are served over TLS with the node certificate of the controller link (ca_file, cert_file, key_file), and only to nodes the controller grants";

const MIRROR_LISTEN: Setting = Setting {
    key: "mirror_listen",
    flag: "--mirror-listen",
    env: "RIGGER_AGENT_MIRROR_LISTEN",
};
const PEER_LISTEN: Setting = Setting {
    key: "peer_listen",
    flag: "--peer-listen",
    env: "RIGGER_AGENT_PEER_LISTEN",
};
const PEER_ADDRESS: Setting = Setting {
    key: "peer_address",
    flag: "--peer-address",
    env: "RIGGER_AGENT_PEER_ADDRESS",
};
const PEER_MAX_CONNECTIONS: Setting = Setting {
    key: "peer_max_connections",
    flag: "--peer-max-connections",
    env: "RIGGER_AGENT_PEER_MAX_CONNECTIONS",
};
pub(super) const PEER_MIN_RATE: Setting = Setting {
    key: "peer_min_rate",
    flag: "--peer-min-rate",
    env: "RIGGER_AGENT_PEER_MIN_RATE",
};
const PEER_UPLOAD_RATE: Setting = Setting {
    key: "peer_upload_rate",
    flag: "--peer-upload-rate",
    env: "RIGGER_AGENT_PEER_UPLOAD_RATE",
};

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair};

    use super::*;

    /// A CA and a node certificate for `node-a` in `dir`: (ca, cert, key) paths.
    fn pki(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut node = CertificateParams::new(vec!["node-a".to_owned()]).unwrap();
        node.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ];
        let node = node.signed_by(&key, &ca, &ca_key).unwrap();
        let paths = (
            dir.join("ca.pem"),
            dir.join("node.pem"),
            dir.join("node-key.pem"),
        );
        std::fs::write(&paths.0, ca.pem()).unwrap();
        std::fs::write(&paths.1, node.pem()).unwrap();
        std::fs::write(&paths.2, key.serialize_pem()).unwrap();
        paths
    }

    /// What the link read from these files.
    fn identity(ca: &Path, cert: &Path, key: &Path) -> PeerIdentity {
        PeerIdentity {
            ca_pem: std::fs::read(ca).unwrap(),
            cert_pem: std::fs::read(cert).unwrap(),
            key_pem: std::fs::read(key).unwrap(),
        }
    }

    fn listen(address: &str) -> PeerArgs {
        PeerArgs {
            listen: Some(address.to_owned()),
            ..PeerArgs::default()
        }
    }

    const HTTPS: Option<&str> = Some("https://controller:9450");

    #[test]
    fn the_mirror_listens_on_loopback_only_and_with_the_links_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki(dir.path());
        let id = identity(&ca, &cert, &key);
        assert_eq!(mirror(None, None, None).unwrap(), None);
        assert_eq!(
            mirror(Some("127.0.0.1:9442".to_owned()), HTTPS, Some(&id)).unwrap(),
            Some("127.0.0.1:9442".parse().unwrap())
        );
        for (listen, controller, identity) in [
            ("0.0.0.0:9442", HTTPS, Some(&id)),
            ("10.0.0.5:9442", HTTPS, Some(&id)),
            ("127.0.0.1:9442", Some("http://controller:9450"), Some(&id)),
            ("127.0.0.1:9442", HTTPS, None),
            ("nonsense", HTTPS, Some(&id)),
        ] {
            let error = mirror(Some(listen.to_owned()), controller, identity)
                .unwrap_err()
                .to_string();
            assert!(error.contains("mirror_listen"), "{error}");
        }
    }

    #[test]
    fn off_unless_peer_listen_and_then_with_the_links_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki(dir.path());
        let identity = identity(&ca, &cert, &key);
        assert!(
            resolve(PeerArgs::default(), HTTPS, Some("node-a"), Some(&identity))
                .unwrap()
                .is_none()
        );
        let settings = resolve(
            listen("10.0.0.5:9441"),
            HTTPS,
            Some("node-a"),
            Some(&identity),
        )
        .unwrap()
        .unwrap();
        assert_eq!(settings.address, "10.0.0.5:9441");
        assert_eq!(settings.max_connections, DEFAULT_PEER_MAX_CONNECTIONS);
        assert_eq!(settings.upload_rate, DEFAULT_PEER_UPLOAD_RATE);
        let any = PeerArgs {
            address: Some("node-a.example:9441".to_owned()),
            upload_rate: Some("50MiB".to_owned()),
            ..listen("0.0.0.0:9441")
        };
        let settings = resolve(any, HTTPS, Some("node-a"), Some(&identity))
            .unwrap()
            .unwrap();
        assert_eq!(
            (settings.address.as_str(), settings.upload_rate),
            ("node-a.example:9441", 50 << 20)
        );
    }

    #[test]
    fn bad_peer_settings_name_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = pki(dir.path());
        let good = identity(&ca, &cert, &key);
        let refused = |args: PeerArgs, controller: Option<&str>, identity: &PeerIdentity| {
            resolve(args, controller, Some("node-a"), Some(identity))
                .unwrap_err()
                .to_string()
        };
        let cases: Vec<(PeerArgs, Option<&str>, &PeerIdentity, &str)> = vec![
            (
                PeerArgs {
                    upload_rate: Some("1MiB".to_owned()),
                    ..PeerArgs::default()
                },
                HTTPS,
                &good,
                "`peer_listen`",
            ),
            (listen("10.0.0.5:9441"), None, &good, "`peer_listen`"),
            (
                listen("10.0.0.5:9441"),
                Some("http://controller:9450"),
                &good,
                "https:// controller",
            ),
            (listen("not-an-address"), HTTPS, &good, "`peer_listen`"),
            (listen("0.0.0.0:9441"), HTTPS, &good, "`peer_address`"),
            (
                PeerArgs {
                    address: Some("node-a".to_owned()),
                    ..listen("0.0.0.0:9441")
                },
                HTTPS,
                &good,
                "`peer_address`",
            ),
            (
                PeerArgs {
                    max_connections: Some(0),
                    ..listen("10.0.0.5:9441")
                },
                HTTPS,
                &good,
                "`peer_max_connections`",
            ),
            (
                PeerArgs {
                    upload_rate: Some("100KiB".to_owned()),
                    ..listen("10.0.0.5:9441")
                },
                HTTPS,
                &good,
                "`peer_upload_rate`",
            ),
        ];
        for (args, controller, identity, named) in cases {
            let error = refused(args, controller, identity);
            assert!(error.contains(named), "{error}");
        }
        // The certificate's key swapped for another key: found before anything binds.
        let other = dir.path().join("other-key.pem");
        std::fs::write(&other, KeyPair::generate().unwrap().serialize_pem()).unwrap();
        let error = refused(
            listen("10.0.0.5:9441"),
            HTTPS,
            &identity(&ca, &cert, &other),
        );
        assert!(error.contains("`peer_listen`"), "{error}");
        // Without the key the link cannot be set up either: the whole configuration is
        // refused naming the key.
        let no_key = crate::config::AgentConfigFile {
            controller: HTTPS.map(str::to_owned),
            node_name: Some("node-a".to_owned()),
            ca_file: Some(ca),
            cert_file: Some(cert),
            peer_listen: Some("10.0.0.5:9441".to_owned()),
            ..crate::config::AgentConfigFile::default()
        };
        let error =
            crate::config::AgentConfig::from_layers(no_key, crate::config::RunArgs::default())
                .unwrap_err()
                .to_string();
        assert!(error.contains("`key_file`"), "{error}");
    }
}
