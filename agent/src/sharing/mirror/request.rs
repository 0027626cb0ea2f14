//! What containerd asks the mirror for, read from the request path alone (no I/O):
//! manifests and blobs by digest. A tag is never answered: `capabilities = ["pull"]`
//! keeps containerd resolving names at the registry, and a mirror that answered tags
//! could tell a node what an image is.

use crate::sharing::peers::request::{is_repository, is_sha256_digest};

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// `GET /v2/`: the API's version check.
    Ping,
    Manifest {
        repository: String,
        digest: String,
    },
    Blob {
        repository: String,
        digest: String,
    },
}

/// What `path` asks for, or why it gets nothing.
pub fn wanted(path: &str) -> Result<Wanted, String> {
    if path == "/v2/" || path == "/v2" {
        return Ok(Wanted::Ping);
    }
    let rest = path
        .strip_prefix("/v2/")
        .ok_or_else(|| "only the registry API (/v2/) is served".to_owned())?;
    let (repository, kind, reference) = ["manifests", "blobs"]
        .iter()
        .find_map(|kind| {
            let (repository, reference) = rest.rsplit_once(&format!("/{kind}/"))?;
            Some((repository, *kind, reference))
        })
        .ok_or_else(|| "only manifests and blobs are served".to_owned())?;
    if !is_repository(repository) {
        return Err(format!("{repository:?} is not a repository name"));
    }
    if !is_sha256_digest(reference) {
        return Err(format!(
            "only digests are served ({reference:?} is not one): names are resolved at the registry"
        ));
    }
    let (repository, digest) = (repository.to_owned(), reference.to_owned());
    Ok(match kind {
        "manifests" => Wanted::Manifest { repository, digest },
        _ => Wanted::Blob { repository, digest },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_and_blobs_by_digest_are_all_that_is_served() {
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(wanted("/v2/"), Ok(Wanted::Ping));
        assert_eq!(
            wanted(&format!("/v2/library/busybox/manifests/{digest}")),
            Ok(Wanted::Manifest {
                repository: "library/busybox".to_owned(),
                digest: digest.clone()
            })
        );
        assert_eq!(
            wanted(&format!("/v2/a/blobs/blobs/{digest}")),
            Ok(Wanted::Blob {
                repository: "a/blobs".to_owned(),
                digest: digest.clone()
            })
        );
        for refused in [
            "/v2/library/busybox/manifests/latest".to_owned(),
            format!("/v2/library/busybox/manifests/{}", "sha256:ABC"),
            format!("/v2/../etc/blobs/{digest}"),
            format!("/v2/Upper/blobs/{digest}"),
            format!("/v2//blobs/{digest}"),
            format!("/v2/a/tags/list/{digest}"),
            "/v2/_catalog".to_owned(),
            "/metrics".to_owned(),
        ] {
            assert!(wanted(&refused).is_err(), "{refused}");
        }
    }
}
