//! Content checked against its digest (sha256, the only algorithm images here use).

use sha2::{Digest as _, Sha256};

/// Whether `data` is the content `digest` names; else why not.
pub(crate) fn verify_digest(data: &[u8], digest: &str) -> Result<(), String> {
    let Some(expected) = digest.strip_prefix("sha256:") else {
        return Err(format!("unsupported digest algorithm in {digest}"));
    };
    let actual = hex::encode(Sha256::digest(data));
    if actual == expected {
        Ok(())
    } else {
        Err(format!("content of {digest} hashes to sha256:{actual}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_verified() {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(b"abc")));
        assert!(verify_digest(b"abc", &digest).is_ok());
        assert!(verify_digest(b"abd", &digest).is_err());
        assert!(verify_digest(b"abc", "sha512:00").is_err());
    }
}
