//! Image references as pulls read them, and the source label containerd derives from one.
//!
//! The grammar is distribution's (`reference/regexp.go`), read by hand: `oci-spec`'s
//! parser compiles one large regular expression on first use, which cost a one-shot pull
//! ~40 ms before its first request and kept ~7 MiB of the agent's memory for good. The
//! tests hold this parser to `oci-spec`'s on every case they know.

use oci_client::Reference;

/// An image reference a pull refuses.
#[derive(Debug, thiserror::Error)]
#[error("image reference {image:?} is invalid: {detail}")]
pub struct InvalidReference {
    pub image: String,
    pub detail: String,
}

const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_LEGACY: &str = "index.docker.io";
const DEFAULT_TAG: &str = "latest";
/// distribution's limit on a repository's name.
const REPOSITORY_MAX: usize = 255;
/// distribution's limit on a tag.
const TAG_MAX: usize = 128;

/// Parse an image reference the way pulls do (repository names must be lowercase).
pub(crate) fn parse_reference(image: &str) -> Result<Reference, InvalidReference> {
    parse(image).map_err(|detail| InvalidReference {
        image: image.to_owned(),
        detail: detail.to_owned(),
    })
}

/// `[domain/]path[:tag][@digest]`, normalised as docker and containerd do (`busybox`
/// is `docker.io/library/busybox:latest`).
fn parse(image: &str) -> Result<Reference, &'static str> {
    if image.is_empty() {
        return Err("the reference is empty");
    }
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    // A tag is what follows the last ':' after the last '/' (a port's ':' comes before).
    let (name, tag) = match rest.rfind(':') {
        Some(colon) if rest.rfind('/').is_none_or(|slash| colon > slash) => {
            (&rest[..colon], Some(&rest[colon + 1..]))
        }
        _ => (rest, None),
    };
    if !is_name(name) {
        return Err("invalid reference format: the name is not [host[:port]/]path");
    }
    if let Some(tag) = tag
        && !is_tag(tag)
    {
        return Err("invalid tag: 1 to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'");
    }
    if let Some(digest) = digest {
        check_digest(digest)?;
    }
    let (registry, repository) = split_domain(name);
    if repository.len() > REPOSITORY_MAX {
        return Err("the repository name is longer than 255 characters");
    }
    if repository.chars().any(|c| c.is_ascii_uppercase()) {
        return Err("repository names must be lowercase");
    }
    Ok(match (tag, digest) {
        (Some(tag), Some(digest)) => {
            Reference::with_tag_and_digest(registry, repository, tag.to_owned(), digest.to_owned())
        }
        (None, Some(digest)) => Reference::with_digest(registry, repository, digest.to_owned()),
        (tag, None) => {
            Reference::with_tag(registry, repository, tag.unwrap_or(DEFAULT_TAG).to_owned())
        }
    })
}

/// `path` or `domain/path`, where path is one or more `/`-separated components.
fn is_name(name: &str) -> bool {
    let all_paths = |s: &str| !s.is_empty() && s.split('/').all(is_path_component);
    all_paths(name)
        || name
            .split_once('/')
            .is_some_and(|(domain, path)| is_domain(domain) && all_paths(path))
}

/// Lowercase alphanumerics joined by one '.', one or two '_', or any number of '-'.
fn is_path_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if !alnum(first) || !alnum(last) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|b| !alnum(**b)).count();
        let separator = &component[i..i + run];
        let allowed = matches!(separator, "." | "_" | "__") || separator.bytes().all(|b| b == b'-');
        if !allowed {
            return false;
        }
        i += run;
    }
    true
}

/// `host[:port]`: dot-separated labels of alphanumerics and inner '-'.
fn is_domain(domain: &str) -> bool {
    let (host, port) = match domain.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (domain, None),
    };
    let label = |l: &str| {
        let bytes = l.as_bytes();
        !bytes.is_empty()
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
            && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
    };
    host.split('.').all(label)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn is_tag(tag: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    bytes.len() <= TAG_MAX
        && bytes.first().is_some_and(|b| word(*b))
        && bytes.iter().all(|b| word(*b) || *b == b'.' || *b == b'-')
}

/// `algorithm:hex`, of the algorithms and lengths distribution knows.
fn check_digest(digest: &str) -> Result<(), &'static str> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err("invalid digest: not algorithm:hex");
    };
    if hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("invalid digest: the hex part is not at least 32 hex digits");
    }
    let expected = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err("unsupported digest algorithm (sha256, sha384, sha512)"),
    };
    if hex.len() != expected {
        return Err("invalid digest: wrong length for its algorithm");
    }
    Ok(())
}

/// Which part of a name is the registry: the first component, when it has a '.' or a
/// ':' or is `localhost`; Docker Hub otherwise, whose one-component names are `library/`.
fn split_domain(name: &str) -> (String, String) {
    let (mut domain, mut path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first.to_owned(), rest.to_owned())
        }
        _ => (DOCKER_HUB.to_owned(), name.to_owned()),
    };
    if domain == DOCKER_HUB_LEGACY {
        domain = DOCKER_HUB.to_owned();
    }
    if domain == DOCKER_HUB && !path.contains('/') {
        path = format!("library/{path}");
    }
    (domain, path)
}

/// Refuse what a pull would refuse, before any work starts.
pub fn check_reference(image: &str) -> Result<(), String> {
    parse_reference(image).map(drop).map_err(|e| e.to_string())
}

/// The name containerd's image record gets for `image` (`docker.io/library/x:latest`).
pub fn normalized_name(image: &str) -> Result<String, String> {
    parse_reference(image)
        .map(|r| r.whole())
        .map_err(|e| e.to_string())
}

/// The name containerd's image record gets for `image`, and the digest the reference
/// pins, when it pins one.
pub fn normalized_and_pinned(image: &str) -> Result<(String, Option<String>), String> {
    parse_reference(image)
        .map(|r| (r.whole(), r.digest().map(str::to_owned)))
        .map_err(|e| e.to_string())
}

/// `containerd.io/distribution.source.<host without port>` = repository.
pub(crate) fn distribution_source(reference: &Reference) -> (String, String) {
    let host = reference.registry();
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    (
        format!("containerd.io/distribution.source.{host}"),
        reference.repository().to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn source_label_drops_the_port() {
        let r = parse("127.0.0.1:5000/team/app:1").unwrap();
        assert_eq!(
            distribution_source(&r),
            (
                "containerd.io/distribution.source.127.0.0.1".to_owned(),
                "team/app".to_owned()
            )
        );
        let r = parse("busybox").unwrap();
        assert_eq!(
            distribution_source(&r).0,
            "containerd.io/distribution.source.docker.io"
        );
        assert_eq!(distribution_source(&r).1, "library/busybox");
    }

    const SHA256: &str = "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";

    /// Every reference here is read as `oci-spec`'s regular expression reads it: accepted
    /// with the same parts, or refused.
    #[test]
    fn reads_references_as_oci_spec_does() {
        let long_repo = format!("host.io/{}", "a".repeat(256));
        let long_tag = format!("busybox:{}", "t".repeat(129));
        let cases = [
            "busybox",
            "busybox:1.36",
            "library/busybox",
            "docker.io/busybox",
            "index.docker.io/busybox:1",
            "index.docker.io/team/app",
            "localhost/app",
            "localhost:5000/app:1",
            "test.com:tag",
            "test.com:5000",
            "test.com/repo:tag",
            "test:5000/repo",
            "test:5000/repo:tag",
            "127.0.0.1:5000/team/app:1",
            "sub-dom1.foo.com/bar/baz/quux:some-long-tag",
            "b.gcr.io/test.example.com/my-app:test.example.com",
            "xn--n3h.com/myimage:xn--n3h.com",
            "foo_bar.com:8080",
            "foo/foo_bar.com:8080",
            "opensuse/leap:15.3",
            "a__b/c---d/e.f_g:_tag",
            "Registry.Example.COM/app",
            "UPPER/app",
            "Upper",
            "app:Tag_1.2-3",
            "lowercase:Uppercase",
            "",
            ":justtag",
            "@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "repo@sha256:ffffffffffffffffffffffffffffffffff",
            "validname@invaliddigest:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "repo@sha384:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "repo@sha256:ffff",
            "repo@sha256:gggggggggggggggggggggggggggggggggggggggggggggggggggggggggggggggg",
            "repo@@sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "app:.tag",
            "app:-tag",
            "app:",
            "app:tag:more",
            "-app",
            "app-",
            "a..b",
            "a___b",
            "a/",
            "/a",
            "a//b",
            "host:/app",
            "host:50a0/app",
            "-host.io/app",
            "host-.io/app",
            "ho_st.io/app",
            "host..io/app",
            "host.io:5000",
            "host.io:5000/app/",
            "app with space",
            "app\n",
            "app/ü",
            "app:tägs",
            long_repo.as_str(),
            long_tag.as_str(),
        ];
        let with_digests: Vec<String> = cases
            .iter()
            .filter(|c| !c.contains('@'))
            .map(|c| format!("{c}@{SHA256}"))
            .collect();
        for case in cases
            .iter()
            .copied()
            .chain(with_digests.iter().map(String::as_str))
        {
            let theirs = oci_client::Reference::from_str(case).ok().filter(|r| {
                // Their `\w` is Unicode's; distribution's (Go's) is ASCII, like ours.
                r.tag().is_none_or(str::is_ascii)
                    && !r.repository().chars().any(|c| c.is_ascii_uppercase())
            });
            let ours = parse(case).ok();
            assert_eq!(ours, theirs, "{case:?}");
        }
    }

    #[test]
    fn refusals_say_which_part_is_wrong() {
        let detail = |image: &str| parse(image).unwrap_err();
        assert!(detail("").contains("empty"));
        assert!(detail("app:-x").contains("tag"));
        assert!(detail("app@md5:ffffffffffffffffffffffffffffffff").contains("algorithm"));
        assert!(detail("app@sha256:ffff").contains("digest"));
        assert!(detail("UPPER/app").contains("lowercase"));
        assert!(detail("a//b").contains("name"));
    }
}
