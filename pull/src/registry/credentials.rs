//! Which credentials a registry gets: pull secrets first, then the node's docker config.
//! They are only looked up here; `auth` decides when and where they are sent.

use super::auth::Credential;
/// A registry's credentials that cannot be read (never their content: they are secrets).
#[derive(Debug, thiserror::Error)]
#[error("credentials for {registry}: {detail}")]
pub struct CredentialsError {
    pub registry: String,
    pub detail: String,
}

/// The first credentials for `registry` in the given docker config documents.
pub(crate) fn secret_credentials(
    registry: &str,
    docker_configs: &[String],
) -> Result<Option<Credential>, CredentialsError> {
    for (i, document) in docker_configs.iter().enumerate() {
        let found = docker_credential::get_credential_from_reader(
            std::io::Cursor::new(document.as_bytes()),
            docker_server(registry),
        );
        match found {
            Ok(docker_credential::DockerCredential::UsernamePassword(user, password)) => {
                return Ok(Some(Credential::Basic { user, password }));
            }
            Ok(docker_credential::DockerCredential::IdentityToken(token)) => {
                return Ok(Some(Credential::IdentityToken(token)));
            }
            Err(docker_credential::CredentialRetrievalError::NoCredentialConfigured) => {}
            // The document's content never goes into the message: it holds secrets.
            Err(e) => {
                return Err(CredentialsError {
                    registry: registry.to_owned(),
                    detail: format!("pull secret {} is not a usable docker config: {e}", i + 1),
                });
            }
        }
    }
    Ok(None)
}

/// docker keeps Docker Hub's credentials under its v1 URL.
fn docker_server(registry: &str) -> &str {
    if registry == "docker.io" {
        "https://index.docker.io/v1/"
    } else {
        registry
    }
}

/// Registry credentials from a docker `config.json` (explicit path, or docker's default).
pub(crate) fn credentials(
    registry: &str,
    docker_config: Option<&std::path::Path>,
) -> Result<Credential, CredentialsError> {
    let server = docker_server(registry);
    let found = match docker_config {
        Some(path) => {
            let file = std::fs::File::open(path).map_err(|e| CredentialsError {
                registry: registry.to_owned(),
                detail: format!("{}: {e}", path.display()),
            })?;
            docker_credential::get_credential_from_reader(file, server)
        }
        None => docker_credential::get_credential(server),
    };
    match found {
        Ok(docker_credential::DockerCredential::UsernamePassword(user, password)) => {
            Ok(Credential::Basic { user, password })
        }
        Ok(docker_credential::DockerCredential::IdentityToken(token)) => {
            Ok(Credential::IdentityToken(token))
        }
        Err(
            docker_credential::CredentialRetrievalError::ConfigNotFound
            | docker_credential::CredentialRetrievalError::ConfigReadError
            | docker_credential::CredentialRetrievalError::NoCredentialConfigured,
        ) if docker_config.is_none() => Ok(Credential::Anonymous),
        Err(docker_credential::CredentialRetrievalError::NoCredentialConfigured) => {
            Ok(Credential::Anonymous)
        }
        Err(e) => Err(CredentialsError {
            registry: registry.to_owned(),
            detail: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_secrets_come_first_and_never_show_in_errors() {
        let other = r#"{"auths":{"other.example":{"auth":"dXNlcjpzZWNyZXQ="}}}"#.to_owned();
        let ours = r#"{"auths":{"reg.example:5000":{"auth":"dXNlcjpzZWNyZXQ="}}}"#.to_owned();
        match secret_credentials("reg.example:5000", &[other.clone(), ours]).unwrap() {
            Some(Credential::Basic {
                user: u,
                password: p,
            }) => {
                assert_eq!((u.as_str(), p.as_str()), ("user", "secret"))
            }
            other => panic!("{other:?}"),
        }
        assert!(
            secret_credentials("reg.example:5000", &[other])
                .unwrap()
                .is_none()
        );
        let broken = r#"{"auths": "sup3rsecret"#.to_owned();
        let err = secret_credentials("reg.example:5000", &[broken])
            .unwrap_err()
            .to_string();
        assert!(err.contains("pull secret 1"), "{err}");
        assert!(!err.contains("sup3rsecret"), "{err}");
    }

    #[test]
    fn credentials_come_from_the_given_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        // "user:secret" in base64.
        std::fs::write(
            &path,
            r#"{"auths":{"reg.example:5000":{"auth":"dXNlcjpzZWNyZXQ="}}}"#,
        )
        .unwrap();
        match credentials("reg.example:5000", Some(&path)).unwrap() {
            Credential::Basic {
                user: u,
                password: p,
            } => assert_eq!((u.as_str(), p.as_str()), ("user", "secret")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            credentials("other.example", Some(&path)).unwrap(),
            Credential::Anonymous
        ));
        let err = credentials("x", Some(&dir.path().join("missing.json"))).unwrap_err();
        assert!(err.to_string().contains("missing.json"), "{err}");
    }
}
