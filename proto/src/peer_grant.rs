//! Peer grants: the controller's signed word that one node may fetch the blobs of one
//! image from one other node.
//!
//! A node serving blobs to peers must not serve whoever asks: a blob of a private image
//! is only for nodes that could pull it from the registry themselves, and only the
//! controller knows which nodes a job runs on. So a pull task carries, per peer, a grant:
//! a JWT (EdDSA) the controller signs for the fetching node (`sub`), the serving node
//! (`srv`) and the job's image reference (`image`). The serving node checks the
//! signature with one of the controller's public keys (sent when the agent registers;
//! the token's `kid` names which), that it has not expired and was not made to last past
//! [`MAX_GRANT_LIFETIME`], that it names this node as the server, that the request came
//! with the certificate of the node it names, and that the blob asked for belongs to the
//! image *this* node resolved that reference to. No node's report decides what another
//! node serves: a grant names a reference, never a digest some node claimed.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use sha2::{Digest as _, Sha256};

/// The audience every grant is for: a grant is good for nothing else.
const AUDIENCE: &str = "rigger-peer";
/// Clock difference between the controller and nodes a grant tolerates.
const LEEWAY: Duration = Duration::from_secs(30);
/// The longest a grant lasts, whatever the job allows: a leaked grant (a node's memory,
/// a log) is worthless after this, and a retired signing key can be dropped this long
/// after it stopped signing.
pub const MAX_GRANT_LIFETIME: Duration = Duration::from_secs(2 * 3600);

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
    /// The node it may fetch from.
    pub srv: String,
    /// The job's image reference, as the job names it: the serving node serves the
    /// blobs of the image it resolved that reference to itself.
    pub image: String,
    pub aud: String,
    /// Issued at, seconds since the epoch.
    pub iat: u64,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
}

/// What one grant is for.
#[derive(Debug, Clone, Copy)]
pub struct GrantFor<'a> {
    /// The node that may fetch.
    pub node: &'a str,
    /// The node it may fetch from.
    pub server: &'a str,
    /// The job's image reference.
    pub image: &'a str,
}

/// The id of an Ed25519 public key (SPKI PEM): the first 16 hex digits of the SHA-256 of
/// its DER. Derived from the key itself, so nobody can name a key with another's id.
pub fn key_id(public_pem: &[u8]) -> Result<String, GrantError> {
    let text = std::str::from_utf8(public_pem).map_err(|e| GrantError::Key(e.to_string()))?;
    let body: String = text
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .map(str::trim)
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| GrantError::Key(format!("not a PEM: {e}")))?;
    let digest = Sha256::digest(&der);
    Ok(digest[..8].iter().map(|b| format!("{b:02x}")).collect())
}

/// The controller's side: signs grants with its current key.
pub struct GrantSigner {
    key: EncodingKey,
    key_id: String,
}

impl std::fmt::Debug for GrantSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantSigner")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl GrantSigner {
    /// From an Ed25519 private key in PKCS#8 PEM and its public half in SPKI PEM (which
    /// names the key: its id goes into every grant's header).
    pub fn from_pem(private_pem: &[u8], public_pem: &[u8]) -> Result<Self, GrantError> {
        let key =
            EncodingKey::from_ed_pem(private_pem).map_err(|e| GrantError::Key(e.to_string()))?;
        Ok(Self {
            key,
            key_id: key_id(public_pem)?,
        })
    }

    /// The id of the key grants are signed with.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// A grant as `what` says, from `now` until `until` — but never past
    /// [`MAX_GRANT_LIFETIME`] from now.
    pub fn sign(
        &self,
        what: GrantFor<'_>,
        now: SystemTime,
        until: SystemTime,
    ) -> Result<String, GrantError> {
        let latest = now.checked_add(MAX_GRANT_LIFETIME).unwrap_or(now);
        let claims = GrantClaims {
            sub: what.node.to_owned(),
            srv: what.server.to_owned(),
            image: what.image.to_owned(),
            aud: AUDIENCE.to_owned(),
            iat: epoch_seconds(now),
            exp: epoch_seconds(until.min(latest)),
        };
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.key_id.clone());
        jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| GrantError::Sign(e.to_string()))
    }
}

/// A serving node's side: checks grants with the controller's public keys (the one it
/// signs with now, and retired ones until their grants have expired).
#[derive(Clone)]
pub struct GrantVerifier {
    keys: HashMap<String, DecodingKey>,
}

impl std::fmt::Debug for GrantVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("GrantVerifier")
            .field("key_ids", &ids)
            .finish()
    }
}

impl GrantVerifier {
    /// From the controller's Ed25519 public keys in SPKI PEM.
    pub fn from_pems<'a>(
        public_pems: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Self, GrantError> {
        let mut keys = HashMap::new();
        for pem in public_pems {
            let key = DecodingKey::from_ed_pem(pem).map_err(|e| GrantError::Key(e.to_string()))?;
            keys.insert(key_id(pem)?, key);
        }
        if keys.is_empty() {
            return Err(GrantError::Key("no key".to_owned()));
        }
        Ok(Self { keys })
    }

    /// The grant's claims when one of the controller's keys signed it (the one its `kid`
    /// names), it is unexpired at `now`, and it was not made to last longer than
    /// [`MAX_GRANT_LIFETIME`]. The caller checks that it names this node as the server
    /// and that the requesting peer's certificate is issued for the node it names
    /// (`claims.sub`).
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<GrantClaims, GrantError> {
        let invalid = |reason: &str| GrantError::Invalid(reason.to_owned());
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| GrantError::Invalid(e.to_string()))?;
        let kid = header.kid.ok_or_else(|| invalid("it names no key (kid)"))?;
        let key = self.keys.get(&kid).ok_or_else(|| {
            GrantError::Invalid(format!(
                "it is signed with key {kid:?}, which the controller does not name"
            ))
        })?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        // Expiry is checked below against `now`, so tests need no real clock.
        validation.validate_exp = false;
        let claims = jsonwebtoken::decode::<GrantClaims>(token, key, &validation)
            .map_err(|e| GrantError::Invalid(e.to_string()))?
            .claims;
        let now = epoch_seconds(now);
        if claims.exp.saturating_add(LEEWAY.as_secs()) < now {
            return Err(invalid("it has expired"));
        }
        if claims.iat > now.saturating_add(LEEWAY.as_secs()) {
            return Err(invalid("it is issued in the future"));
        }
        if claims.exp.saturating_sub(claims.iat) > MAX_GRANT_LIFETIME.as_secs() {
            return Err(invalid("it lasts longer than any grant may"));
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

    // Ed25519 key pairs for tests only (`openssl genpkey -algorithm ed25519`).
    const PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIFY5Mb7iWGTyY5nnJgqAnns2VJpBC2jnnVSKc1qpe3Xo\n-----END PRIVATE KEY-----\n";
    const PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEABqwAhMntOI3+2vtStDdVVDrGaNbeL1tOFX/Jf/iVc8I=\n-----END PUBLIC KEY-----\n";

    const OTHER_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIC+gJ6oQZf856Ju5drLt3Rw/SO+UMG8Y3dCCuAieHHCs\n-----END PRIVATE KEY-----\n";
    const OTHER_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAicvNB/0QenJ8AYCe960Zgr3Ai/Gr4QBmuXy/j2HZum0=\n-----END PUBLIC KEY-----\n";

    fn signer() -> GrantSigner {
        GrantSigner::from_pem(PRIVATE.as_bytes(), PUBLIC.as_bytes()).unwrap()
    }

    fn pair() -> (GrantSigner, GrantVerifier) {
        (
            signer(),
            GrantVerifier::from_pems([PUBLIC.as_bytes()]).unwrap(),
        )
    }

    const IMAGE: &str = "registry.example/app:1";

    fn what() -> GrantFor<'static> {
        GrantFor {
            node: "node-b",
            server: "node-a",
            image: IMAGE,
        }
    }

    #[test]
    fn a_grant_names_both_nodes_and_the_image_until_it_expires() {
        let (signer, verifier) = pair();
        let now = SystemTime::now();
        let token = signer
            .sign(what(), now, now + Duration::from_secs(600))
            .unwrap();
        let claims = verifier.verify(&token, now).unwrap();
        assert_eq!(
            (
                claims.sub.as_str(),
                claims.srv.as_str(),
                claims.image.as_str()
            ),
            ("node-b", "node-a", IMAGE)
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
    fn no_grant_outlasts_the_maximum_whatever_it_is_asked_for() {
        let (signer, verifier) = pair();
        let now = SystemTime::now();
        let far = now + Duration::from_secs(100 * 365 * 86_400);
        let token = signer.sign(what(), now, far).unwrap();
        let claims = verifier.verify(&token, now).unwrap();
        assert_eq!(claims.exp - claims.iat, MAX_GRANT_LIFETIME.as_secs());
        assert!(
            verifier
                .verify(&token, now + MAX_GRANT_LIFETIME + Duration::from_secs(60))
                .is_err()
        );
        // Nothing overflows at the end of time either.
        let end = UNIX_EPOCH + Duration::from_secs(i64::MAX as u64 / 2);
        assert!(signer.sign(what(), end, end).is_ok());
    }

    #[test]
    fn a_retired_key_verifies_until_it_is_dropped_and_an_unknown_kid_is_refused() {
        let now = SystemTime::now();
        let until = now + Duration::from_secs(600);
        let old = GrantSigner::from_pem(OTHER_PRIVATE.as_bytes(), OTHER_PUBLIC.as_bytes()).unwrap();
        let new = signer();
        assert_ne!(old.key_id(), new.key_id());
        let old_token = old.sign(what(), now, until).unwrap();
        let new_token = new.sign(what(), now, until).unwrap();
        let both = GrantVerifier::from_pems([PUBLIC.as_bytes(), OTHER_PUBLIC.as_bytes()]).unwrap();
        assert!(both.verify(&old_token, now).is_ok());
        assert!(both.verify(&new_token, now).is_ok());
        let only_new = GrantVerifier::from_pems([PUBLIC.as_bytes()]).unwrap();
        let refused = only_new.verify(&old_token, now).unwrap_err().to_string();
        assert!(refused.contains("does not name"), "{refused}");
        assert!(GrantVerifier::from_pems([]).is_err());
    }

    #[test]
    fn a_tampered_or_foreign_grant_is_refused() {
        let (signer, verifier) = pair();
        let now = SystemTime::now();
        let token = signer
            .sign(what(), now, now + Duration::from_secs(600))
            .unwrap();
        // Another server in the claims, the signature kept.
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let forged = GrantClaims {
            sub: "node-b".to_owned(),
            srv: "node-c".to_owned(),
            image: IMAGE.to_owned(),
            aud: AUDIENCE.to_owned(),
            iat: epoch_seconds(now),
            exp: epoch_seconds(now) + 60,
        };
        parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&forged).unwrap());
        assert!(verifier.verify(&parts.join("."), now).is_err());
        // Not a JWT at all; an HMAC-signed one (algorithm confusion), with the right kid.
        assert!(verifier.verify("garbage", now).is_err());
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(signer.key_id().to_owned());
        let hmac =
            jsonwebtoken::encode(&header, &forged, &EncodingKey::from_secret(b"guess")).unwrap();
        assert!(verifier.verify(&hmac, now).is_err());
        // Signed by another controller's key under this one's kid.
        let other = GrantSigner {
            key: EncodingKey::from_ed_pem(OTHER_PRIVATE.as_bytes()).unwrap(),
            key_id: signer.key_id().to_owned(),
        };
        let foreign = other
            .sign(what(), now, now + Duration::from_secs(600))
            .unwrap();
        assert!(verifier.verify(&foreign, now).is_err());
    }

    #[test]
    fn key_ids_come_from_the_key() {
        let id = key_id(PUBLIC.as_bytes()).unwrap();
        assert_eq!(id.len(), 16);
        assert_eq!(id, key_id(PUBLIC.as_bytes()).unwrap());
        assert_ne!(id, key_id(OTHER_PUBLIC.as_bytes()).unwrap());
        assert!(key_id(b"-----BEGIN PUBLIC KEY-----\n%%%\n").is_err());
    }
}
