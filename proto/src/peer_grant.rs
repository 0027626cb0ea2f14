//! Peer grants: the controller's signed word that one node may fetch the blobs of one
//! image from other nodes.
//!
//! A node serving blobs to peers must not serve whoever asks: a blob of a private image
//! is only for nodes that could pull it from the registry themselves, and only the
//! controller knows which nodes a job runs on. So a pull task carries a grant, a JWT
//! (EdDSA) the controller signs for the node and the image's digest; the serving node
//! checks the signature with the controller's public key (sent when the agent
//! registers), that it has not expired, that the request came with the certificate of
//! the node it names, and that the blob asked for belongs to its image. The
//! serving node keeps no list of who may fetch what, and a grant is worthless to any
//! other node or image.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};

/// The audience every grant is for: a grant is good for nothing else.
const AUDIENCE: &str = "rigger-peer";
/// Clock difference between the controller and nodes a grant tolerates.
const LEEWAY: Duration = Duration::from_secs(30);

/// `sha256:` and 64 lowercase hex digits: the only digests containerd's content store
/// keys blobs by here (and nothing a path or URL could be made of).
pub fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("the peer grant key is not an Ed25519 key in PEM: {0}")]
    Key(String),
    #[error("cannot sign a peer grant: {0}")]
    Sign(String),
    #[error("the peer grant is not valid: {0}")]
    Invalid(String),
}

/// What a grant says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GrantClaims {
    /// The node that may fetch.
    pub sub: String,
    /// The digest the image's name points at (an index or a manifest); the blobs it
    /// reaches are what the node may fetch.
    pub image: String,
    pub aud: String,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
}

/// The controller's side: signs grants.
pub struct GrantSigner {
    key: EncodingKey,
}

impl std::fmt::Debug for GrantSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantSigner").finish_non_exhaustive()
    }
}

impl GrantSigner {
    /// From an Ed25519 private key in PKCS#8 PEM.
    pub fn from_pem(private_pem: &[u8]) -> Result<Self, GrantError> {
        let key =
            EncodingKey::from_ed_pem(private_pem).map_err(|e| GrantError::Key(e.to_string()))?;
        Ok(Self { key })
    }

    /// A grant for `node` to fetch the blobs of `image` until `now + lifetime`.
    pub fn sign(
        &self,
        node: &str,
        image: &str,
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<String, GrantError> {
        let claims = GrantClaims {
            sub: node.to_owned(),
            image: image.to_owned(),
            aud: AUDIENCE.to_owned(),
            exp: epoch_seconds(now + lifetime),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &self.key)
            .map_err(|e| GrantError::Sign(e.to_string()))
    }
}

/// A serving node's side: checks grants with the controller's public key.
#[derive(Clone)]
pub struct GrantVerifier {
    key: DecodingKey,
}

impl std::fmt::Debug for GrantVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantVerifier").finish_non_exhaustive()
    }
}

impl GrantVerifier {
    /// From the controller's Ed25519 public key in SPKI PEM.
    pub fn from_pem(public_pem: &[u8]) -> Result<Self, GrantError> {
        let key =
            DecodingKey::from_ed_pem(public_pem).map_err(|e| GrantError::Key(e.to_string()))?;
        Ok(Self { key })
    }

    /// The grant's claims when it is signed by the controller and unexpired at `now`.
    /// The caller checks that the requesting peer's certificate is issued for the node
    /// the grant names (`claims.sub`).
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<GrantClaims, GrantError> {
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        // Expiry is checked below against `now`, so tests need no real clock.
        validation.validate_exp = false;
        let claims = jsonwebtoken::decode::<GrantClaims>(token, &self.key, &validation)
            .map_err(|e| GrantError::Invalid(e.to_string()))?
            .claims;
        if claims.exp + LEEWAY.as_secs() < epoch_seconds(now) {
            return Err(GrantError::Invalid("it has expired".to_owned()));
        }
        Ok(claims)
    }
}

fn epoch_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    // An Ed25519 key pair for tests only (`openssl genpkey -algorithm ed25519`).
    const PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFY5Mb7iWGTyY5nnJgqAnns2VJpBC2jnnVSKc1qpe3Xo\n-----END PRIVATE KEY-----\n";
    const PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEABqwAhMntOI3+2vtStDdVVDrGaNbeL1tOFX/Jf/iVc8I=\n-----END PUBLIC KEY-----\n";

    const OTHER_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIC+gJ6oQZf856Ju5drLt3Rw/SO+UMG8Y3dCCuAieHHCs\n-----END PRIVATE KEY-----\n";

    fn pair() -> (GrantSigner, GrantVerifier) {
        (
            GrantSigner::from_pem(PRIVATE.as_bytes()).unwrap(),
            GrantVerifier::from_pem(PUBLIC.as_bytes()).unwrap(),
        )
    }

    const IMAGE: &str = "sha256:0123";

    #[test]
    fn a_grant_names_its_node_and_image_until_it_expires() {
        let (signer, verifier) = pair();
        let now = SystemTime::now();
        let token = signer
            .sign("node-b", IMAGE, now, Duration::from_secs(600))
            .unwrap();
        let claims = verifier.verify(&token, now).unwrap();
        assert_eq!(
            (claims.sub.as_str(), claims.image.as_str()),
            ("node-b", IMAGE)
        );
        assert!(
            verifier
                .verify(&token, now + Duration::from_secs(620))
                .is_ok()
        );
        let expired = verifier.verify(&token, now + Duration::from_secs(700));
        assert!(
            matches!(expired, Err(GrantError::Invalid(_))),
            "{expired:?}"
        );
    }

    #[test]
    fn a_tampered_or_foreign_grant_is_refused() {
        let (signer, verifier) = pair();
        let now = SystemTime::now();
        let token = signer
            .sign("node-b", IMAGE, now, Duration::from_secs(600))
            .unwrap();
        // Another image in the claims, the signature kept.
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let forged = GrantClaims {
            sub: "node-b".to_owned(),
            image: "sha256:ffff".to_owned(),
            aud: AUDIENCE.to_owned(),
            exp: u64::MAX / 2,
        };
        use base64::Engine as _;
        parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&forged).unwrap());
        assert!(verifier.verify(&parts.join("."), now).is_err());
        // Not a JWT at all; an HMAC-signed one (algorithm confusion).
        assert!(verifier.verify("garbage", now).is_err());
        let hmac = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &forged,
            &EncodingKey::from_secret(b"guess"),
        )
        .unwrap();
        assert!(verifier.verify(&hmac, now).is_err());
        // Signed by another controller's key.
        let other = GrantSigner::from_pem(OTHER_PRIVATE.as_bytes()).unwrap();
        let foreign = other
            .sign("node-b", IMAGE, now, Duration::from_secs(600))
            .unwrap();
        assert!(verifier.verify(&foreign, now).is_err());
    }
}
