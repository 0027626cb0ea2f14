//! Registry hosts from containerd's `certs.d` layout (`<dir>/<host[:port]>/hosts.toml`),
//! read as containerd reads them (`remotes/docker/config/hosts.go`), so Rigger pulls
//! from the same mirrors, in the same order, with the same TLS and headers:
//!
//! ```toml
//! server = "https://registry.example"          # the upstream, tried last
//! ca = "/etc/ssl/registry-ca.pem"              # the server's own settings, as a host's
//! [host."https://mirror.local:5000"]           # tried first, in file order
//!   capabilities = ["pull", "resolve"]
//!   skip_verify = false
//!   ca = ["mirror-ca.pem"]                     # relative to this file's directory
//!   client = [["client.pem", "client.key"]]    # or "both.pem", or ["a.pem", "b.pem"]
//!   header = { x-mirror-token = "abc" }        # a value or a list of values
//!   dial_timeout = "3s"
//! [host."https://proxy.local/registry/api"]
//!   override_path = true                       # the API root is the URL's path
//! ```
//!
//! A host directory without `hosts.toml` is read docker's way: `*.crt` are CA files,
//! `*.cert` client certificates (with the `*.key` of the same name).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// containerd's default location for `hosts.toml` directories.
pub const DEFAULT_HOSTS_DIR: &str = "/etc/containerd/certs.d";

/// One place the image can be fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `scheme://host[:port]`, no trailing slash.
    pub url: String,
    /// The API root on that host: `/v2` unless `override_path` says otherwise.
    pub api_root: String,
    /// May resolve tags to digests (fetch manifests by tag).
    pub resolve: bool,
    /// May serve blobs and manifests by digest.
    pub pull: bool,
    /// The registry itself (`server`), not a mirror: its credentials are the registry's.
    pub upstream: bool,
    pub tls: Tls,
    /// Sent with every request to this host (and its token service), as containerd does.
    pub headers: Vec<(String, String)>,
    pub dial_timeout: Option<Duration>,
    /// The file this came from, for messages.
    pub source: Option<PathBuf>,
}

/// TLS settings of one host. Paths are absolute (relative ones are resolved against the
/// directory of the `hosts.toml` that named them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    pub skip_verify: bool,
    /// PEM files of CA certificates trusted in addition to the system's.
    pub ca_files: Vec<PathBuf>,
    pub client_pairs: Vec<ClientPair>,
}

/// A client certificate and its key; without `key`, the certificate file holds both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientPair {
    pub certificate: PathBuf,
    pub key: Option<PathBuf>,
}

impl Endpoint {
    fn plain(url: String) -> Self {
        Self {
            url,
            api_root: "/v2".to_owned(),
            resolve: true,
            pull: true,
            upstream: true,
            tls: Tls::default(),
            headers: Vec::new(),
            dial_timeout: None,
            source: None,
        }
    }

    pub fn is_plain_http(&self) -> bool {
        self.url.starts_with("http://")
    }

    /// `host[:port]` of the endpoint.
    pub fn authority(&self) -> &str {
        self.url
            .split_once("://")
            .map_or(self.url.as_str(), |(_, rest)| rest)
    }

    /// `scheme://host[:port]/api-root`: what `/<repository>/manifests/…` follows.
    pub fn api_url(&self) -> String {
        format!("{}{}", self.url, self.api_root)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: host {url:?} must start with http:// or https://")]
    BadUrl { path: PathBuf, url: String },
}

#[derive(Debug, Default, serde::Deserialize)]
struct HostsFile {
    server: Option<String>,
    /// In file order (toml's `preserve_order`): the order is the fallback order.
    #[serde(default)]
    host: toml::map::Map<String, toml::Value>,
    /// The server's own settings sit at the top level.
    #[serde(flatten)]
    server_entry: HostEntry,
}

#[derive(Debug, Default, serde::Deserialize)]
struct HostEntry {
    capabilities: Option<Vec<String>>,
    #[serde(default)]
    skip_verify: bool,
    ca: Option<OneOrMany>,
    client: Option<ClientSetting>,
    #[serde(default)]
    header: toml::map::Map<String, toml::Value>,
    #[serde(default)]
    override_path: bool,
    dial_timeout: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(one) => vec![one],
            Self::Many(many) => many,
        }
    }
}

/// containerd's `client`: a file with both, a list of such files, or a list of pairs.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum ClientSetting {
    One(String),
    Many(Vec<ClientItem>),
}

#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum ClientItem {
    Combined(String),
    Pair(Vec<String>),
}

/// The endpoints for `registry` (as written in image references, e.g. `docker.io` or
/// `127.0.0.1:5000`), mirrors first, upstream last.
pub fn endpoints(
    dir: &Path,
    registry: &str,
    plain_http: bool,
) -> Result<Vec<Endpoint>, HostsError> {
    let default_scheme = if plain_http { "http" } else { "https" };
    let upstream_host = if registry == "docker.io" {
        "registry-1.docker.io"
    } else {
        registry
    };
    let default_server = format!("{default_scheme}://{upstream_host}");

    let host_dir = dir.join(registry);
    let file = [
        host_dir.join("hosts.toml"),
        dir.join("_default").join("hosts.toml"),
    ]
    .into_iter()
    .find(|p| p.exists());
    let Some(path) = file else {
        let mut server = Endpoint::plain(default_server);
        server.tls = docker_cert_files(&host_dir)?;
        return Ok(vec![server]);
    };
    let text = std::fs::read_to_string(&path).map_err(|source| HostsError::Read {
        path: path.clone(),
        source,
    })?;
    parse(&path, &text, default_server)
}

/// The endpoints a `hosts.toml` at `path` holding `text` describes.
fn parse(path: &Path, text: &str, default_server: String) -> Result<Vec<Endpoint>, HostsError> {
    let parse_error = |message: String| HostsError::Parse {
        path: path.to_owned(),
        message,
    };
    let parsed: HostsFile =
        toml::from_str(text).map_err(|e| parse_error(e.message().to_owned()))?;
    let base = path.parent().unwrap_or(Path::new("/"));

    let mut endpoints = Vec::new();
    for (url, value) in parsed.host {
        let entry: HostEntry = value
            .try_into()
            .map_err(|e: toml::de::Error| parse_error(format!("host {url:?}: {}", e.message())))?;
        endpoints.push(endpoint(path, base, &url, entry, false)?);
    }
    let server = parsed.server.unwrap_or(default_server);
    let server = endpoint(path, base, &server, parsed.server_entry, true)?;
    match endpoints
        .iter_mut()
        .find(|e| e.url == server.url && e.api_root == server.api_root)
    {
        Some(listed) => listed.upstream = true,
        None => endpoints.push(server),
    }
    Ok(endpoints)
}

/// One host of a `hosts.toml`, its settings checked and its paths made absolute.
fn endpoint(
    path: &Path,
    base: &Path,
    url: &str,
    entry: HostEntry,
    upstream: bool,
) -> Result<Endpoint, HostsError> {
    let invalid = |what: String| HostsError::Parse {
        path: path.to_owned(),
        message: format!("host {url:?}: {what}"),
    };
    let (origin, url_path) = split_url(path, url)?;
    let api_root = match url_path.trim_end_matches('/') {
        "" if entry.override_path => String::new(),
        "" => "/v2".to_owned(),
        p if p.ends_with("/v2") || entry.override_path => p.to_owned(),
        p => format!("{p}/v2"),
    };
    let (mut resolve, mut pull) = (true, true);
    if let Some(capabilities) = entry.capabilities {
        (resolve, pull) = (false, false);
        for capability in capabilities {
            match capability.to_ascii_lowercase().as_str() {
                "resolve" => resolve = true,
                "pull" => pull = true,
                "push" | "referrers" => {}
                _ => return Err(invalid(format!("unknown capability {capability:?}"))),
            }
        }
    }
    let absolute = |p: String| base.join(p);
    let ca_files = entry
        .ca
        .map(OneOrMany::into_vec)
        .unwrap_or_default()
        .into_iter()
        .map(absolute)
        .collect();
    let client_pairs = match entry.client {
        None => Vec::new(),
        Some(ClientSetting::One(both)) => vec![ClientPair {
            certificate: absolute(both),
            key: None,
        }],
        Some(ClientSetting::Many(items)) => items
            .into_iter()
            .map(|item| match item {
                ClientItem::Combined(both) => Ok(ClientPair {
                    certificate: absolute(both),
                    key: None,
                }),
                ClientItem::Pair(pair) => match <[String; 2]>::try_from(pair) {
                    Ok([certificate, key]) => Ok(ClientPair {
                        certificate: absolute(certificate),
                        key: Some(absolute(key)),
                    }),
                    Err(pair) => Err(invalid(format!(
                        "client pair {pair:?} must be [certificate, key]"
                    ))),
                },
            })
            .collect::<Result<_, _>>()?,
    };
    let mut headers = Vec::new();
    for (name, value) in entry.header {
        let values: OneOrMany = value.try_into().map_err(|_| {
            invalid(format!(
                "header {name:?} must be a string or a list of strings"
            ))
        })?;
        headers.extend(values.into_vec().into_iter().map(|v| (name.clone(), v)));
    }
    let dial_timeout = entry
        .dial_timeout
        .map(|text| {
            humantime::parse_duration(&text)
                .map_err(|e| invalid(format!("dial_timeout {text:?}: {e}")))
        })
        .transpose()?;
    Ok(Endpoint {
        url: origin,
        api_root,
        resolve,
        pull,
        upstream,
        tls: Tls {
            skip_verify: entry.skip_verify,
            ca_files,
            client_pairs,
        },
        headers,
        dial_timeout,
        source: Some(path.to_owned()),
    })
}

/// `scheme://authority` and the path of a host's URL; a bare host means HTTPS.
fn split_url(path: &Path, url: &str) -> Result<(String, String), HostsError> {
    let bad = || HostsError::BadUrl {
        path: path.to_owned(),
        url: url.to_owned(),
    };
    let full = if url.contains("://") {
        url.to_owned()
    } else {
        format!("https://{url}")
    };
    let parsed = reqwest::Url::parse(&full).map_err(|_| bad())?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(bad());
    }
    let origin = parsed.origin().ascii_serialization();
    Ok((origin, parsed.path().to_owned()))
}

/// docker's layout for a host directory without `hosts.toml`.
fn docker_cert_files(host_dir: &Path) -> Result<Tls, HostsError> {
    let read = |source| HostsError::Read {
        path: host_dir.to_owned(),
        source,
    };
    let entries = match std::fs::read_dir(host_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Tls::default()),
        Err(e) => return Err(read(e)),
    };
    let mut names: Vec<PathBuf> = Vec::new();
    for entry in entries {
        names.push(entry.map_err(read)?.path());
    }
    names.sort();
    let mut tls = Tls::default();
    for file in names.into_iter().filter(|p| p.is_file()) {
        match file.extension().and_then(|e| e.to_str()) {
            Some("crt") => tls.ca_files.push(file),
            Some("cert") => {
                let key = file.with_extension("key");
                tls.client_pairs.push(ClientPair {
                    key: key.is_file().then_some(key),
                    certificate: file,
                });
            }
            _ => {}
        }
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, host: &str, text: &str) {
        std::fs::create_dir_all(dir.join(host)).unwrap();
        std::fs::write(dir.join(host).join("hosts.toml"), text).unwrap();
    }

    #[test]
    fn no_file_means_the_registry_itself() {
        let dir = tempfile::tempdir().unwrap();
        let e = endpoints(dir.path(), "docker.io", false).unwrap();
        assert_eq!(e[0].api_url(), "https://registry-1.docker.io/v2");
        let e = endpoints(dir.path(), "127.0.0.1:5000", true).unwrap();
        assert_eq!(e[0].url, "http://127.0.0.1:5000");
    }

    #[test]
    fn mirrors_in_file_order_then_server() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "docker.io",
            r#"
server = "https://registry-1.docker.io"
[host."http://z-mirror:5000/v2"]
  capabilities = ["pull"]
[host."https://a-mirror"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
"#,
        );
        let e = endpoints(dir.path(), "docker.io", false).unwrap();
        let urls: Vec<String> = e.iter().map(Endpoint::api_url).collect();
        assert_eq!(
            urls,
            [
                "http://z-mirror:5000/v2",
                "https://a-mirror/v2",
                "https://registry-1.docker.io/v2"
            ]
        );
        assert!(!e[0].resolve && e[0].pull && e[0].is_plain_http());
        assert!(e[1].resolve && e[1].tls.skip_verify);
        assert_eq!(e[0].authority(), "z-mirror:5000");
        let upstream: Vec<bool> = e.iter().map(|e| e.upstream).collect();
        assert_eq!(
            upstream,
            [false, false, true],
            "only the server is the registry"
        );
    }

    #[test]
    fn tls_headers_paths_and_timeouts_as_containerd_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "reg.example",
            r#"
server = "reg.example"
ca = "server-ca.pem"
header = { x-all = ["a", "b"] }
[host."https://m1.example/registry/api"]
  override_path = true
  ca = ["/etc/abs-ca.pem", "rel-ca.pem"]
  client = [["c.pem", "c.key"], "both.pem"]
  header = { x-mirror-token = "t0k" }
  dial_timeout = "1m30s"
[host."https://m2.example/prefix/"]
  client = "single.pem"
"#,
        );
        let at = dir.path().join("reg.example");
        let e = endpoints(dir.path(), "reg.example", false).unwrap();
        assert_eq!(e[0].api_url(), "https://m1.example/registry/api");
        assert_eq!(
            e[0].tls.ca_files,
            [PathBuf::from("/etc/abs-ca.pem"), at.join("rel-ca.pem")]
        );
        assert_eq!(
            e[0].tls.client_pairs,
            [
                ClientPair {
                    certificate: at.join("c.pem"),
                    key: Some(at.join("c.key"))
                },
                ClientPair {
                    certificate: at.join("both.pem"),
                    key: None
                }
            ]
        );
        assert_eq!(
            e[0].headers,
            [("x-mirror-token".to_owned(), "t0k".to_owned())]
        );
        assert_eq!(e[0].dial_timeout, Some(Duration::from_secs(90)));
        assert_eq!(e[1].api_url(), "https://m2.example/prefix/v2");
        assert_eq!(e[1].tls.client_pairs[0].key, None);
        // A bare server is HTTPS, with the top-level settings.
        assert_eq!(e[2].api_url(), "https://reg.example/v2");
        assert!(e[2].upstream);
        assert_eq!(e[2].tls.ca_files, [at.join("server-ca.pem")]);
        assert_eq!(
            e[2].headers,
            [
                ("x-all".to_owned(), "a".to_owned()),
                ("x-all".to_owned(), "b".to_owned())
            ]
        );
    }

    #[test]
    fn docker_style_cert_files_without_hosts_toml() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("reg.example:5000");
        std::fs::create_dir_all(&at).unwrap();
        for name in [
            "ca.crt",
            "client.cert",
            "client.key",
            "other.cert",
            "notes.txt",
        ] {
            std::fs::write(at.join(name), "x").unwrap();
        }
        let e = endpoints(dir.path(), "reg.example:5000", false).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].tls.ca_files, [at.join("ca.crt")]);
        assert_eq!(
            e[0].tls.client_pairs,
            [
                ClientPair {
                    certificate: at.join("client.cert"),
                    key: Some(at.join("client.key"))
                },
                ClientPair {
                    certificate: at.join("other.cert"),
                    key: None
                }
            ]
        );
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("r.example", "[host.\"ftp://x\"]\n", "ftp://x"),
            ("s.example", "server = [", "s.example/hosts.toml"),
            (
                "t.example",
                "[host.\"https://m\"]\ncapabilities = [\"pull\", \"fly\"]\n",
                "unknown capability \"fly\"",
            ),
            (
                "u.example",
                "[host.\"https://m\"]\ndial_timeout = \"soon\"\n",
                "dial_timeout \"soon\"",
            ),
            (
                "v.example",
                "[host.\"https://m\"]\nclient = [[\"a\", \"b\", \"c\"]]\n",
                "must be [certificate, key]",
            ),
            (
                "w.example",
                "[host.\"https://m\"]\nheader = { x = 3 }\n",
                "header \"x\"",
            ),
        ];
        for (host, text, expected) in cases {
            write(dir.path(), host, text);
            let err = endpoints(dir.path(), host, false).unwrap_err().to_string();
            assert!(err.contains(expected), "{host}: {err}");
            assert!(err.contains(&format!("{host}/hosts.toml")), "{host}: {err}");
        }
    }
}
