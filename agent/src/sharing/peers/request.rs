//! What a peer asks this node for, read from the request alone (no I/O): a blob by
//! digest, whole or one byte range.
//!
//! Only the distribution API's blob path is answered, and only by digest: manifests and
//! tags never are (a tag is resolved at the registry by the node that pulls, so a peer
//! can never tell another node what an image is).

pub use rigger_proto::peer_grant::is_sha256_digest;

/// A repository name as the distribution spec has them (lowercase path components of
/// letters, digits and separators): the only names a peer URL is made of.
pub fn is_repository(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        })
}

/// A request's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// `GET /v2/`: the API's version check, which clients send first.
    Ping,
    /// `/v2/<repository>/blobs/<digest>`; the repository is not needed to find the blob.
    Blob { digest: String },
}

/// Why a request gets nothing (the status it is answered with).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("only blobs are served to peers, by digest: {0}")]
    NotServed(String),
    #[error("{0:?} is not a sha256 digest")]
    BadDigest(String),
}

/// Longest path read: a repository name is at most 255 characters (distribution).
const MAX_PATH: usize = 512;

/// The target of a request for `path` (the URL's path, without its query).
pub fn asked(path: &str) -> Result<Asked, Refusal> {
    if path.len() > MAX_PATH {
        return Err(Refusal::NotServed("the path is too long".to_owned()));
    }
    if path == "/v2/" || path == "/v2" {
        return Ok(Asked::Ping);
    }
    let not_served = || Refusal::NotServed(path.to_owned());
    let rest = path.strip_prefix("/v2/").ok_or_else(not_served)?;
    let (repository, digest) = rest.rsplit_once("/blobs/").ok_or_else(not_served)?;
    if !is_repository(repository) {
        return Err(not_served());
    }
    if !is_sha256_digest(digest) {
        return Err(Refusal::BadDigest(digest.to_owned()));
    }
    Ok(Asked::Blob {
        digest: digest.to_owned(),
    })
}

/// What part of a blob of `size` bytes to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// All of it (no Range header, or one this server ignores: several ranges, another
    /// unit, bad syntax — as RFC 9110 lets a server do).
    Whole,
    /// Bytes `start..end` (end exclusive), answered 206.
    Range { start: u64, end: u64 },
    /// A range that starts past the end: 416.
    Unsatisfiable,
}

/// The part of a blob of `size` bytes a `Range` header asks for.
pub fn part(range: Option<&str>, size: u64) -> Part {
    let Some(spec) = range.and_then(|r| r.trim().strip_prefix("bytes=")) else {
        return Part::Whole;
    };
    if spec.contains(',') {
        return Part::Whole;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Part::Whole;
    };
    let number = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (first, last) {
        // The last `n` bytes.
        ("", n) => match number(n) {
            Some(0) => Part::Unsatisfiable,
            Some(n) if size > 0 => Part::Range {
                start: size.saturating_sub(n),
                end: size,
            },
            Some(_) => Part::Unsatisfiable,
            None => Part::Whole,
        },
        (a, b) => {
            let Some(start) = number(a) else {
                return Part::Whole;
            };
            let end = match b {
                "" => size,
                b => match number(b) {
                    Some(last) if last >= start => last.saturating_add(1).min(size),
                    _ => return Part::Whole,
                },
            };
            if start >= size {
                Part::Unsatisfiable
            } else {
                Part::Range { start, end }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn blobs_by_digest_and_the_version_check_are_all_that_is_asked() {
        assert_eq!(asked("/v2/"), Ok(Asked::Ping));
        assert_eq!(
            asked(&format!("/v2/library/busybox/blobs/{DIGEST}")),
            Ok(Asked::Blob {
                digest: DIGEST.to_owned()
            })
        );
        for refused in [
            "/v2/library/busybox/manifests/latest".to_owned(),
            format!("/v2/library/busybox/manifests/{DIGEST}"),
            format!("/v2/blobs/{DIGEST}"),
            format!("/v2//blobs/{DIGEST}"),
            format!("/v2/../etc/blobs/{DIGEST}"),
            format!("/v2/a/./b/blobs/{DIGEST}"),
            format!("/v2/UPPER/blobs/{DIGEST}"),
            format!("/v3/x/blobs/{DIGEST}"),
            "/".to_owned(),
            format!("/v2/{}/blobs/{DIGEST}", "a/".repeat(300)),
        ] {
            assert!(
                matches!(asked(&refused), Err(Refusal::NotServed(_))),
                "{refused}"
            );
        }
    }

    #[test]
    fn only_sha256_digests_are_looked_up() {
        for bad in [
            "latest",
            "sha256:../../etc/passwd",
            "sha256:0123",
            "sha512:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
            "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef/x",
        ] {
            assert_eq!(
                asked(&format!("/v2/app/blobs/{bad}")),
                Err(Refusal::BadDigest(bad.to_owned())),
                "{bad}"
            );
        }
    }

    #[test]
    fn ranges_as_rfc_9110_reads_them() {
        let size = 1000;
        assert_eq!(part(None, size), Part::Whole);
        assert_eq!(
            part(Some("bytes=0-99"), size),
            Part::Range { start: 0, end: 100 }
        );
        assert_eq!(
            part(Some("bytes=900-"), size),
            Part::Range {
                start: 900,
                end: 1000
            }
        );
        // An end past the blob is cut to it.
        assert_eq!(
            part(Some("bytes=900-5000"), size),
            Part::Range {
                start: 900,
                end: 1000
            }
        );
        assert_eq!(
            part(Some("bytes=-10"), size),
            Part::Range {
                start: 990,
                end: 1000
            }
        );
        assert_eq!(
            part(Some("bytes=-5000"), size),
            Part::Range {
                start: 0,
                end: 1000
            }
        );
        assert_eq!(part(Some("bytes=1000-"), size), Part::Unsatisfiable);
        assert_eq!(part(Some("bytes=-0"), size), Part::Unsatisfiable);
        assert_eq!(part(Some("bytes=0-"), 0), Part::Unsatisfiable);
        // Ignored: the whole blob is sent.
        for ignored in [
            "bytes=0-1,5-6",
            "items=0-1",
            "bytes=5-1",
            "bytes=x-1",
            "bytes=+1-2",
            "bytes=99999999999999999999999-",
            "bytes=",
            "bytes=-",
        ] {
            assert_eq!(part(Some(ignored), size), Part::Whole, "{ignored}");
        }
        assert_eq!(
            part(Some(&format!("bytes=0-{}", u64::MAX)), size),
            Part::Range {
                start: 0,
                end: 1000
            }
        );
    }
}
