//! `rigger-controller certs`: a certificate authority and certificates for a lab or a
//! first try. Real deployments bring their own PKI; what Rigger needs from it is written
//! in docs/DESIGN.md (server certificate for the controller's names, one client
//! certificate per agent whose DNS name is the node name, the CA that signed them).
//!
//! The directory gets `ca.pem`/`ca-key.pem`, `controller.pem`/`controller-key.pem`,
//! `agent-<node>.pem`/`agent-<node>-key.pem` (for the link to the controller and for
//! serving blobs to peers), and on first use `tokens.csv` (an admin and a viewer token),
//! `riggerctl.toml` and `peer-grant-key.pem` (what the controller signs peer grants with). Run again with more `--node`s to add agents
//! under the same CA. Keys and tokens are written with mode 0600.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Generate { what: String, source: rcgen::Error },
    #[error("{0}")]
    Invalid(String),
}

/// What to issue.
#[derive(Debug, Clone)]
pub struct CertsRequest {
    pub out: PathBuf,
    /// DNS names and IP addresses the controller is reached at.
    pub hosts: Vec<String>,
    /// Node names to issue agent certificates for.
    pub nodes: Vec<String>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertsError + '_ {
    move |source| CertsError::Io {
        path: path.to_owned(),
        source,
    }
}

fn generate(what: &str) -> impl FnOnce(rcgen::Error) -> CertsError + '_ {
    move |source| CertsError::Generate {
        what: what.to_owned(),
        source,
    }
}

/// Write `contents` to a new file (never over an existing one); `secret` files get 0600.
fn write_new(path: &Path, contents: &str, secret: bool) -> Result<(), CertsError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .map_err(io(path))?;
    file.write_all(contents.as_bytes()).map_err(io(path))
}

/// A random token: 32 bytes from the OS, hex.
fn random_token() -> Result<String, CertsError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| CertsError::Invalid(format!("no randomness from the OS: {e}")))?;
    Ok(hex::encode(bytes))
}

struct Authority {
    certificate: rcgen::Certificate,
    key: KeyPair,
}

fn authority(out: &Path) -> Result<(Authority, bool), CertsError> {
    let (cert_path, key_path) = (out.join("ca.pem"), out.join("ca-key.pem"));
    if cert_path.exists() {
        let pem = std::fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
        let key_pem = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
        let key = KeyPair::from_pem(&key_pem).map_err(generate("ca-key.pem"))?;
        // rcgen signs with the CA's name and key; re-creating the certificate object
        // from its parameters gives the same issuer for new certificates.
        let params = CertificateParams::from_ca_cert_pem(&pem).map_err(generate("ca.pem"))?;
        let certificate = params.self_signed(&key).map_err(generate("ca.pem"))?;
        return Ok((Authority { certificate, key }, false));
    }
    let key = KeyPair::generate().map_err(generate("CA key"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate("CA"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, "Rigger lab CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let certificate = params.self_signed(&key).map_err(generate("CA"))?;
    write_new(&key_path, &key.serialize_pem(), true)?;
    write_new(&cert_path, &certificate.pem(), false)?;
    Ok((Authority { certificate, key }, true))
}

fn issue(
    ca: &Authority,
    out: &Path,
    stem: &str,
    common_name: &str,
    names: &[String],
    usages: &[ExtendedKeyUsagePurpose],
) -> Result<PathBuf, CertsError> {
    let cert_path = out.join(format!("{stem}.pem"));
    if cert_path.exists() {
        return Err(CertsError::Invalid(format!(
            "{} exists already; remove it to issue a new one",
            cert_path.display()
        )));
    }
    let key = KeyPair::generate().map_err(generate(stem))?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(generate(stem))?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = usages.to_vec();
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let certificate = params
        .signed_by(&key, &ca.certificate, &ca.key)
        .map_err(generate(stem))?;
    write_new(
        &out.join(format!("{stem}-key.pem")),
        &key.serialize_pem(),
        true,
    )?;
    write_new(&cert_path, &certificate.pem(), false)?;
    Ok(cert_path)
}

/// The key the controller signs peer grants with (Ed25519, PKCS#8 PEM, 0600): agents
/// check a grant with its public half, which the controller sends them.
fn peer_grant_key(out: &Path) -> Result<PathBuf, CertsError> {
    let path = out.join(PEER_GRANT_KEY_FILE);
    let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).map_err(generate("peer grant key"))?;
    write_new(&path, &key.serialize_pem(), true)?;
    Ok(path)
}

/// Where `certs` writes the peer grant key, beside the CA.
pub const PEER_GRANT_KEY_FILE: &str = "peer-grant-key.pem";

/// Issue what `request` asks for; returns the files written.
pub fn create(request: &CertsRequest) -> Result<Vec<PathBuf>, CertsError> {
    for node in &request.nodes {
        rigger_proto::check_node_name(node).map_err(CertsError::Invalid)?;
    }
    let out = &request.out;
    std::fs::create_dir_all(out).map_err(io(out))?;
    let (ca, new_ca) = authority(out)?;
    let mut written = Vec::new();
    if new_ca {
        written.push(out.join("ca.pem"));
        let hosts = if request.hosts.is_empty() {
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
        } else {
            request.hosts.clone()
        };
        written.push(issue(
            &ca,
            out,
            "controller",
            "rigger-controller",
            &hosts,
            &[ExtendedKeyUsagePurpose::ServerAuth],
        )?);
        written.push(peer_grant_key(out)?);
        let tokens = out.join("tokens.csv");
        let admin = random_token()?;
        write_new(
            &tokens,
            &format!(
                "# token,user,role (admin: everything; viewer: get, list, wait)\n{admin},admin,admin\n{},viewer,viewer\n",
                random_token()?
            ),
            true,
        )?;
        written.push(tokens);
        let config = out.join("riggerctl.toml");
        let ca_file = std::fs::canonicalize(out.join("ca.pem")).map_err(io(out))?;
        write_new(
            &config,
            &format!(
                "# riggerctl --config {} (or RIGGERCTL_CONFIG)\nserver = \"https://{}:9450\"\nca_file = \"{}\"\ntoken = \"{admin}\"\n",
                config.display(),
                hosts[0],
                ca_file.display()
            ),
            true,
        )?;
        written.push(config);
    }
    for node in &request.nodes {
        written.push(issue(
            &ca,
            out,
            &format!("agent-{node}"),
            node,
            std::slice::from_ref(node),
            // A client of the controller, and a server of blobs to the other nodes (the
            // peers dial it by its node name).
            &[
                ExtendedKeyUsagePurpose::ClientAuth,
                ExtendedKeyUsagePurpose::ServerAuth,
            ],
        )?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn keys_and_tokens_are_written_for_their_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let written = create(&CertsRequest {
            out: dir.path().join("pki"),
            hosts: Vec::new(),
            nodes: vec!["node-1".to_owned()],
        })
        .unwrap();
        assert!(!written.is_empty());
        for path in written {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            let secret =
                name.ends_with("-key.pem") || name == "tokens.csv" || name == "riggerctl.toml";
            assert_eq!(mode, if secret { 0o600 } else { 0o644 }, "{name}");
        }
    }

    #[test]
    fn the_peer_grant_key_signs_grants_its_public_half_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pki");
        create(&CertsRequest {
            out: out.clone(),
            hosts: Vec::new(),
            nodes: Vec::new(),
        })
        .unwrap();
        let private = std::fs::read(out.join(PEER_GRANT_KEY_FILE)).unwrap();
        let public = KeyPair::from_pem(std::str::from_utf8(&private).unwrap())
            .unwrap()
            .public_key_pem();
        let signer =
            rigger_proto::peer_grant::GrantSigner::from_pem(&private, public.as_bytes()).unwrap();
        let verifier =
            rigger_proto::peer_grant::GrantVerifier::from_pems([public.as_bytes()]).unwrap();
        let now = std::time::SystemTime::now();
        let what = rigger_proto::peer_grant::GrantFor {
            node: "node-1",
            server: "node-2",
            image: "r.example/a:1",
        };
        let grant = signer
            .sign(what, now, now + std::time::Duration::from_secs(60))
            .unwrap();
        assert_eq!(verifier.verify(&grant, now).unwrap().image, "r.example/a:1");
    }
}
