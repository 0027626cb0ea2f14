//! Registry hosts from containerd's `certs.d` layout (`<dir>/<host[:port]>/hosts.toml`),
//! so Rigger pulls from the same mirrors, in the same order, as containerd on the node.
//!
//! ```toml
//! server = "https://registry.example"          # the upstream, tried last
//! [host."http://mirror.local:5000"]            # tried first, in file order
//!   capabilities = ["pull", "resolve"]
//!   skip_verify = false
//! ```

use std::path::{Path, PathBuf};

/// containerd's default location for `hosts.toml` directories.
pub const DEFAULT_HOSTS_DIR: &str = "/etc/containerd/certs.d";

/// One place the image can be fetched from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `scheme://host[:port]`, no trailing slash.
    pub url: String,
    /// May resolve tags to digests (fetch manifests by tag).
    pub resolve: bool,
    /// May serve blobs and manifests by digest.
    pub pull: bool,
    pub skip_verify: bool,
    /// The registry itself (`server`), not a mirror: its credentials are the registry's.
    pub upstream: bool,
}

impl Endpoint {
    pub fn is_plain_http(&self) -> bool {
        self.url.starts_with("http://")
    }

    /// `host[:port]` of the endpoint.
    pub fn authority(&self) -> &str {
        self.url
            .split_once("://")
            .map_or(self.url.as_str(), |(_, rest)| rest)
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
}

#[derive(Debug, Default, serde::Deserialize)]
struct HostEntry {
    capabilities: Option<Vec<String>>,
    #[serde(default)]
    skip_verify: bool,
}

/// The endpoints for `registry` (as written in image references, e.g. `docker.io` or
/// `127.0.0.1:5000`), mirrors first, upstream last.
pub fn endpoints(
    dir: &Path,
    registry: &str,
    plain_http: bool,
) -> Result<Vec<Endpoint>, HostsError> {
    let candidates = [
        dir.join(registry).join("hosts.toml"),
        dir.join("_default").join("hosts.toml"),
    ];
    let file = candidates.iter().find(|p| p.exists());
    let default_scheme = if plain_http { "http" } else { "https" };
    let upstream_host = if registry == "docker.io" {
        "registry-1.docker.io"
    } else {
        registry
    };
    let default_server = format!("{default_scheme}://{upstream_host}");

    let Some(path) = file else {
        return Ok(vec![Endpoint {
            url: default_server,
            resolve: true,
            pull: true,
            skip_verify: false,
            upstream: true,
        }]);
    };
    let text = std::fs::read_to_string(path).map_err(|source| HostsError::Read {
        path: path.clone(),
        source,
    })?;
    let parsed: HostsFile = toml::from_str(&text).map_err(|e| HostsError::Parse {
        path: path.clone(),
        message: e.message().to_owned(),
    })?;

    let mut endpoints = Vec::new();
    for (url, value) in parsed.host {
        let entry: HostEntry =
            value
                .try_into()
                .map_err(|e: toml::de::Error| HostsError::Parse {
                    path: path.clone(),
                    message: format!("host {url:?}: {}", e.message()),
                })?;
        let url = normalize(path, &url)?;
        let caps = entry
            .capabilities
            .unwrap_or_else(|| vec!["pull".into(), "resolve".into(), "push".into()]);
        endpoints.push(Endpoint {
            url,
            resolve: caps.iter().any(|c| c == "resolve"),
            pull: caps.iter().any(|c| c == "pull"),
            skip_verify: entry.skip_verify,
            upstream: false,
        });
    }
    let server = match parsed.server {
        Some(server) => normalize(path, &server)?,
        None => default_server,
    };
    match endpoints.iter_mut().find(|e| e.url == server) {
        Some(listed) => listed.upstream = true,
        None => endpoints.push(Endpoint {
            url: server,
            resolve: true,
            pull: true,
            skip_verify: false,
            upstream: true,
        }),
    }
    Ok(endpoints)
}

fn normalize(path: &Path, url: &str) -> Result<String, HostsError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(HostsError::BadUrl {
            path: path.to_owned(),
            url: url.to_owned(),
        });
    }
    // A `/v2` suffix is allowed by containerd and means the same host.
    Ok(url.trim_end_matches('/').trim_end_matches("/v2").to_owned())
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
        assert_eq!(e[0].url, "https://registry-1.docker.io");
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
        let urls: Vec<&str> = e.iter().map(|e| e.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "http://z-mirror:5000",
                "https://a-mirror",
                "https://registry-1.docker.io"
            ]
        );
        assert!(!e[0].resolve && e[0].pull && e[0].is_plain_http());
        assert!(e[1].resolve && e[1].skip_verify);
        assert_eq!(e[0].authority(), "z-mirror:5000");
        let upstream: Vec<bool> = e.iter().map(|e| e.upstream).collect();
        assert_eq!(
            upstream,
            [false, false, true],
            "only the server is the registry"
        );
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "r.example", "[host.\"ftp://x\"]\n");
        let err = endpoints(dir.path(), "r.example", false).unwrap_err();
        assert!(err.to_string().contains("ftp://x"), "{err}");
        write(dir.path(), "s.example", "server = [");
        let err = endpoints(dir.path(), "s.example", false).unwrap_err();
        assert!(err.to_string().contains("s.example/hosts.toml"), "{err}");
    }
}
