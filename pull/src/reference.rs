//! Image references as pulls read them, and the source label containerd derives from one.

use std::str::FromStr;

use oci_client::Reference;

use crate::error::PullError;

/// Parse an image reference the way pulls do (repository names must be lowercase).
pub(crate) fn parse_reference(image: &str) -> Result<Reference, PullError> {
    let reference = Reference::from_str(image).map_err(|e| PullError::InvalidReference {
        image: image.to_owned(),
        detail: e.to_string(),
    })?;
    if reference
        .repository()
        .chars()
        .any(|c| c.is_ascii_uppercase())
    {
        return Err(PullError::InvalidReference {
            image: image.to_owned(),
            detail: "repository names must be lowercase".to_owned(),
        });
    }
    Ok(reference)
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

    #[test]
    fn source_label_drops_the_port() {
        let r = Reference::from_str("127.0.0.1:5000/team/app:1").unwrap();
        assert_eq!(
            distribution_source(&r),
            (
                "containerd.io/distribution.source.127.0.0.1".to_owned(),
                "team/app".to_owned()
            )
        );
        let r = Reference::from_str("busybox").unwrap();
        assert_eq!(
            distribution_source(&r).0,
            "containerd.io/distribution.source.docker.io"
        );
        assert_eq!(distribution_source(&r).1, "library/busybox");
    }
}
