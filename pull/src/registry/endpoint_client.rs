//! The HTTP client of one registry host, built from what its `hosts.toml` says: CA
//! files, client certificates, `skip_verify`, headers and the dial timeout. Every request
//! to the host (manifests, blobs, its token service) goes through it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest as _, Sha256};

use super::hosts::Endpoint;

/// Connecting to a host takes at most this long unless its `dial_timeout` says otherwise.
const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a host's client could not be built: a file or setting of its `hosts.toml`.
#[derive(Debug, thiserror::Error)]
#[error("{origin}host {url}: {detail}")]
pub struct ClientError {
    origin: String,
    url: String,
    detail: String,
}

/// Clients kept at most (hosts a node pulls from are few; a key changes only when a
/// host's settings or files do).
const CLIENTS_KEPT: usize = 64;

/// The HTTP clients of one engine's pulls, one per host configuration, so the pulls of
/// a node share their connections: six images pulled at once, each through a client of
/// its own, opened 73 connections for 145 requests within one 16-connection budget (a
/// new one cost the bench's distant registry 40 ms; a real one a TCP and TLS handshake)
/// while other pulls' connections idled.
#[derive(Debug, Clone, Default)]
pub struct Clients(Arc<Mutex<HashMap<[u8; 32], reqwest::Client>>>);

impl Clients {
    /// The client for `endpoint`: the one built before for the same settings and the same
    /// contents of its files (a CA file rewritten gets a new client), else a new one,
    /// built from the very bytes the key was made of.
    pub fn get(
        &self,
        endpoint: &Endpoint,
        stall_timeout: Duration,
    ) -> Result<reqwest::Client, ClientError> {
        let files = endpoint_files(endpoint);
        let key = files
            .as_ref()
            .map(|files| settings_key(endpoint, stall_timeout, files));
        if let Some(key) = &key
            && let Some(client) = self.lock().get(key)
        {
            return Ok(client.clone());
        }
        let client = match &files {
            Some(files) => build_from(endpoint, stall_timeout, &|path: &Path| {
                files
                    .get(path)
                    .cloned()
                    .ok_or_else(|| format!("{}: not read", path.display()))
            })?,
            // A file that cannot be read is not cached: `build` says what is wrong with it.
            None => build(endpoint, stall_timeout)?,
        };
        if let Some(key) = key {
            let mut clients = self.lock();
            if clients.len() >= CLIENTS_KEPT {
                clients.clear();
            }
            clients.insert(key, client.clone());
        }
        Ok(client)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], reqwest::Client>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The contents of every file `endpoint` names (`None` when one cannot be read).
fn endpoint_files(endpoint: &Endpoint) -> Option<HashMap<PathBuf, Vec<u8>>> {
    let pairs = endpoint.tls.client_pairs.iter();
    let paths =
        endpoint.tls.ca_files.iter().chain(
            pairs.flat_map(|pair| std::iter::once(&pair.certificate).chain(pair.key.as_ref())),
        );
    paths
        .map(|path| read(path).ok().map(|bytes| (path.clone(), bytes)))
        .collect()
}

/// What a client is built from: the host, its settings and its files' contents, each
/// list counted and each field length-prefixed, so no two configurations share a key.
fn settings_key(
    endpoint: &Endpoint,
    stall_timeout: Duration,
    files: &HashMap<PathBuf, Vec<u8>>,
) -> [u8; 32] {
    let mut hasher = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    let file = |path: &PathBuf| files.get(path).map_or(&[][..], Vec::as_slice);
    field(endpoint.url.as_bytes());
    field(&[u8::from(endpoint.tls.skip_verify)]);
    field(format!("{:?} {stall_timeout:?}", endpoint.dial_timeout).as_bytes());
    field(&(endpoint.headers.len() as u64).to_le_bytes());
    for (name, value) in &endpoint.headers {
        field(name.as_bytes());
        field(value.as_bytes());
    }
    field(&(endpoint.tls.ca_files.len() as u64).to_le_bytes());
    for ca in &endpoint.tls.ca_files {
        field(file(ca));
    }
    field(&(endpoint.tls.client_pairs.len() as u64).to_le_bytes());
    for pair in &endpoint.tls.client_pairs {
        field(file(&pair.certificate));
        match &pair.key {
            Some(key) => {
                field(b"key");
                field(file(key));
            }
            None => field(b"no key"),
        }
    }
    hasher.finalize().into()
}

/// The client for `endpoint`; a byte-less `stall_timeout` on a response is a failure.
pub fn build(endpoint: &Endpoint, stall_timeout: Duration) -> Result<reqwest::Client, ClientError> {
    build_from(endpoint, stall_timeout, &read)
}

/// [`build`], its files' bytes from `read`.
fn build_from(
    endpoint: &Endpoint,
    stall_timeout: Duration,
    read: &dyn Fn(&Path) -> Result<Vec<u8>, String>,
) -> Result<reqwest::Client, ClientError> {
    let fail = |detail: String| ClientError {
        origin: endpoint
            .source
            .as_ref()
            .map(|p| format!("{}: ", p.display()))
            .unwrap_or_default(),
        url: endpoint.url.clone(),
        detail,
    };
    let mut builder = reqwest::Client::builder()
        .connect_timeout(endpoint.dial_timeout.unwrap_or(DEFAULT_DIAL_TIMEOUT))
        .read_timeout(stall_timeout)
        .pool_max_idle_per_host(32)
        .user_agent(concat!("rigger-agent/", env!("CARGO_PKG_VERSION")))
        .danger_accept_invalid_certs(endpoint.tls.skip_verify);

    let mut roots = Vec::new();
    for file in &endpoint.tls.ca_files {
        let pem = read(file).map_err(&fail)?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| fail(format!("ca {}: {e}", file.display())))?;
        if certificates.is_empty() {
            return Err(fail(format!(
                "ca {}: no PEM certificate in it",
                file.display()
            )));
        }
        roots.extend(certificates);
    }
    if !roots.is_empty() {
        // As containerd: the system's roots and these.
        builder = builder.tls_certs_merge(roots);
    }

    // containerd offers every pair and Go picks the one the server asks for; rustls
    // holds one identity per client, so the first is presented and the rest named.
    if let Some(pair) = endpoint.tls.client_pairs.first() {
        if endpoint.tls.client_pairs.len() > 1 {
            tracing::warn!(
                host = %endpoint.url,
                using = %pair.certificate.display(),
                ignored = endpoint.tls.client_pairs.len() - 1,
                "several client certificates configured; Rigger presents the first"
            );
        }
        let mut pem = read(&pair.certificate).map_err(&fail)?;
        if let Some(key) = &pair.key {
            pem.push(b'\n');
            pem.extend(read(key).map_err(&fail)?);
        }
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            fail(format!(
                "client certificate {}: {e}",
                pair.certificate.display()
            ))
        })?;
        builder = builder.identity(identity);
    }

    let mut headers = HeaderMap::new();
    for (name, value) in &endpoint.headers {
        let header_name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| fail(format!("header {name:?} is not a valid header name")))?;
        let header_value = HeaderValue::from_str(value)
            .map_err(|_| fail(format!("header {name:?} has a value that cannot be sent")))?;
        headers.append(header_name, header_value);
    }
    builder
        .default_headers(headers)
        .build()
        .map_err(|e| fail(format!("HTTP client: {}", rigger_daemon::error_chain(&e))))
}

fn read(file: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::hosts::{ClientPair, Tls};
    use std::path::PathBuf;

    fn endpoint(tls: Tls, headers: Vec<(String, String)>) -> Endpoint {
        Endpoint {
            url: "https://mirror.example".to_owned(),
            api_root: "/v2".to_owned(),
            resolve: true,
            pull: true,
            upstream: false,
            tls,
            headers,
            dial_timeout: None,
            source: Some(PathBuf::from("/etc/containerd/certs.d/r/hosts.toml")),
        }
    }

    #[test]
    fn unusable_settings_name_the_file_the_host_and_the_setting() {
        rigger_daemon::tls::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let cases = [
            (
                Tls {
                    ca_files: vec![dir.path().join("missing.pem")],
                    ..Tls::default()
                },
                vec![],
                "missing.pem",
            ),
            (
                Tls {
                    ca_files: vec![junk.clone()],
                    ..Tls::default()
                },
                vec![],
                "no PEM certificate",
            ),
            (
                Tls {
                    client_pairs: vec![ClientPair {
                        certificate: junk,
                        key: None,
                    }],
                    ..Tls::default()
                },
                vec![],
                "client certificate",
            ),
            (
                Tls::default(),
                vec![("bad name".to_owned(), "v".to_owned())],
                "header \"bad name\"",
            ),
            (
                Tls::default(),
                vec![("x-ok".to_owned(), "line\nbreak".to_owned())],
                "cannot be sent",
            ),
        ];
        for (tls, headers, expected) in cases {
            let err = build(&endpoint(tls, headers), Duration::from_secs(1))
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{err}");
            assert!(
                err.starts_with(
                    "/etc/containerd/certs.d/r/hosts.toml: host https://mirror.example"
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn pulls_share_a_hosts_client_until_its_settings_or_files_change() {
        rigger_daemon::tls::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let clients = Clients::default();
        let plain = endpoint(Tls::default(), vec![]);
        let stall = Duration::from_secs(1);
        clients.get(&plain, stall).unwrap();
        clients.get(&plain, stall).unwrap();
        assert_eq!(
            clients.0.lock().unwrap().len(),
            1,
            "one client for one host"
        );
        let with_header = endpoint(Tls::default(), vec![("x-a".to_owned(), "1".to_owned())]);
        clients.get(&with_header, stall).unwrap();
        clients.get(&plain, Duration::from_secs(2)).unwrap();
        assert_eq!(clients.0.lock().unwrap().len(), 3);
        // A CA file: its contents are part of the key; unreadable, nothing is cached.
        let with_ca = endpoint(
            Tls {
                ca_files: vec![ca.clone()],
                ..Tls::default()
            },
            vec![],
        );
        assert!(clients.get(&with_ca, stall).is_err());
        assert_eq!(clients.0.lock().unwrap().len(), 3);
        let key =
            |endpoint: &Endpoint| settings_key(endpoint, stall, &endpoint_files(endpoint).unwrap());
        std::fs::write(&ca, "one").unwrap();
        let first = key(&with_ca);
        std::fs::write(&ca, "two").unwrap();
        assert!(first != key(&with_ca) && first != key(&plain));
        // A CA file's bytes are not a header's: lists are counted.
        std::fs::write(&ca, "x").unwrap();
        let header = endpoint(Tls::default(), vec![("x".to_owned(), String::new())]);
        assert_ne!(key(&with_ca), key(&header));
    }
}
