//! Who may talk to the controller.
//!
//! - **Agents** present a client certificate signed by the configured CA (mTLS). The
//!   node name is the certificate's: a `Register` for any name the certificate is not
//!   valid for is refused, so an agent receives only its own node's work and reports
//!   only for itself.
//! - **Users** (riggerctl) send `authorization: Bearer <token>`; tokens come from a
//!   file of `token,user,role` lines (Kubernetes' static token file, plus a role):
//!   `admin` may change objects, `viewer` may only read.
//!
//! Tokens are kept as SHA-256 digests and never logged.

use std::collections::HashMap;
use std::path::Path;

use rustls_pki_types::{CertificateDer, ServerName};
use sha2::Digest as _;
use tonic::{Request, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Viewer,
    Admin,
}

/// Users and their roles, by token digest.
#[derive(Clone, Default)]
pub struct Users {
    by_digest: HashMap<[u8; 32], (String, Role)>,
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Users")
            .field("count", &self.by_digest.len())
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    sha2::Sha256::digest(token.as_bytes()).into()
}

impl Users {
    /// Parse a tokens file; errors name the line, never the token.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut users = Self::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [token, user, role] = fields.as_slice() else {
                return Err(format!("line {}: expected token,user,role", i + 1));
            };
            if token.len() < 16 {
                return Err(format!(
                    "line {}: the token is shorter than 16 characters",
                    i + 1
                ));
            }
            let role = match *role {
                "admin" => Role::Admin,
                "viewer" => Role::Viewer,
                other => {
                    return Err(format!(
                        "line {}: role {other:?} is neither admin nor viewer",
                        i + 1
                    ));
                }
            };
            if users
                .by_digest
                .insert(digest(token), ((*user).to_owned(), role))
                .is_some()
            {
                return Err(format!("line {}: the token is given twice", i + 1));
            }
        }
        if users.by_digest.is_empty() {
            return Err("no tokens in the file".to_owned());
        }
        Ok(users)
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = rigger_daemon::config::read_small_file(path).map_err(|e| e.to_string())?;
        Self::parse(&String::from_utf8_lossy(&bytes))
    }
}

/// The user API's gatekeeper.
#[derive(Debug, Clone)]
pub enum UserAuth {
    Tokens(Users),
    /// Plain-text mode without a tokens file: anyone may do anything (logged at start).
    Open,
}

impl UserAuth {
    /// The user behind `request` if it may act with `needed`.
    pub fn authorize<T>(&self, request: &Request<T>, needed: Role) -> Result<String, Status> {
        let users = match self {
            Self::Open => return Ok("anonymous".to_owned()),
            Self::Tokens(users) => users,
        };
        let token = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Status::unauthenticated(
                    "no bearer token: riggerctl needs --token (or token in its config file)",
                )
            })?;
        let (user, role) = users
            .by_digest
            .get(&digest(token.trim()))
            .ok_or_else(|| Status::unauthenticated("the bearer token is not valid"))?;
        if *role < needed {
            return Err(Status::permission_denied(format!(
                "user {user:?} may only read (role viewer)"
            )));
        }
        Ok(user.clone())
    }
}

/// The refusal of an agent's call that came without a client certificate.
pub fn no_client_certificate() -> Status {
    Status::unauthenticated("no client certificate: agents authenticate with mTLS")
}

/// Check that the client certificate (leaf first) is valid for node `name`. The chain
/// was already verified against the CA during the TLS handshake.
pub fn check_certificates(certs: &[CertificateDer<'static>], name: &str) -> Result<(), Status> {
    let leaf = certs.first().ok_or_else(no_client_certificate)?;
    let certificate = webpki::EndEntityCert::try_from(leaf)
        .map_err(|e| Status::unauthenticated(format!("unreadable client certificate: {e}")))?;
    let server_name = ServerName::try_from(name)
        .map_err(|_| Status::invalid_argument(format!("{name:?} is not a node name")))?;
    certificate
        .verify_is_valid_for_subject_name(&server_name)
        .map_err(|_| {
            Status::permission_denied(format!(
                "the client certificate is not issued for node {name:?}"
            ))
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn request(token: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    }

    #[test]
    fn roles_and_refusals() {
        let auth = UserAuth::Tokens(
            Users::parse("# comment\nadmin-token-0123456789,alice,admin\nviewer-token-0123456789,bob,viewer\n")
                .unwrap(),
        );
        assert_eq!(
            auth.authorize(&request(Some("admin-token-0123456789")), Role::Admin)
                .unwrap(),
            "alice"
        );
        assert!(
            auth.authorize(&request(Some("viewer-token-0123456789")), Role::Viewer)
                .is_ok()
        );
        let denied = auth
            .authorize(&request(Some("viewer-token-0123456789")), Role::Admin)
            .unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        let unknown = auth
            .authorize(&request(Some("wrong-token-0123456789")), Role::Viewer)
            .unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::Unauthenticated);
        assert!(!unknown.message().contains("wrong-token"));
        let missing = auth.authorize(&request(None), Role::Viewer).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn token_file_errors_name_the_line_not_the_token() {
        let err = Users::parse("supersecret-token-123,alice,root\n").unwrap_err();
        assert!(err.starts_with("line 1: role \"root\""), "{err}");
        assert!(!err.contains("supersecret"), "{err}");
        assert!(
            Users::parse("short,alice,admin")
                .unwrap_err()
                .contains("shorter")
        );
        assert!(Users::parse("# nothing\n").is_err());
    }
}
