//! Registry authentication, as containerd's docker authorizer does it:
//!
//! - nothing is sent until a host asks for it (a 401 with `WWW-Authenticate`);
//! - credentials go only to the host they are configured for (a mirror is a host of its
//!   own: the registry's credentials never reach it), and to the token service that host
//!   names only over HTTPS (or to the same host, when it is configured as plain HTTP);
//! - a docker identity token is traded at the token service for an access token (the
//!   OAuth2 refresh-token grant, as docker does), never sent as it is;
//! - a bearer token is kept per host and asked for again when the host refuses it.
//!
//! Redirects (blobs served from object storage) never carry credentials: reqwest drops
//! `Authorization` when a redirect leaves the host.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::AUTHORIZATION;
use tokio::sync::Mutex;

use super::body::{CappedRead, read_capped};

/// A token service that does not answer within this long has failed.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Token responses larger than this are refused (they are a few KiB).
const MAX_TOKEN_RESPONSE: u64 = 1 << 20;

/// Credentials for one host, as docker's `config.json` (or a pull secret) gives them.
#[derive(Clone, Default)]
pub enum Credential {
    #[default]
    Anonymous,
    Basic {
        user: String,
        password: String,
    },
    /// docker's `identitytoken`: a refresh token for the host's token service.
    IdentityToken(String),
}

/// Secrets are never printed.
impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Anonymous => "Anonymous",
            Self::Basic { .. } => "Basic(..)",
            Self::IdentityToken(_) => "IdentityToken(..)",
        })
    }
}

/// What a host asked for in `WWW-Authenticate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// The first challenge of a `WWW-Authenticate` value that Rigger can answer.
pub fn parse_challenge(value: &str) -> Option<Challenge> {
    let (scheme, params) = value
        .trim()
        .split_once(char::is_whitespace)
        .unwrap_or((value.trim(), ""));
    let params = parse_params(params);
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    if scheme.eq_ignore_ascii_case("basic") {
        Some(Challenge::Basic)
    } else if scheme.eq_ignore_ascii_case("bearer") {
        Some(Challenge::Bearer {
            realm: param("realm")?,
            service: param("service"),
            scope: param("scope"),
        })
    } else {
        None
    }
}

/// `k="v", k2=v2`: quoted values may hold commas and escaped quotes.
fn parse_params(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            return out;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ',') {
                value.push(c);
            }
        }
        out.push((key.trim().to_owned(), value.trim().to_owned()));
    }
}

/// Where the token service is, and whether a host's credentials may go there: over
/// HTTPS, or to the host itself (by name) when the host is configured as plain HTTP.
pub fn may_send_credentials(realm: &str, host_url: &str) -> bool {
    let parse = |url: &str| reqwest::Url::parse(url).ok();
    let Some(realm) = parse(realm) else {
        return false;
    };
    match realm.scheme() {
        "https" => true,
        "http" => parse(host_url).is_some_and(|host| {
            host.scheme() == "http"
                && host.host_str().is_some()
                && host.host_str() == realm.host_str()
        }),
        _ => false,
    }
}

/// Why authenticating with a host failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("{0}")]
    Denied(String),
    #[error("token service {realm}: {detail}")]
    TokenService { realm: String, detail: String },
}

/// What a host is answered with now.
#[derive(Debug, Default)]
enum Answer {
    /// Not asked yet: requests go without credentials.
    #[default]
    Nothing,
    Header(String),
}

/// One host's credentials and what it asked for.
#[derive(Debug)]
pub struct HostAuth {
    /// `scheme://host[:port]`
    url: String,
    credential: Credential,
    answer: Mutex<Answer>,
}

impl HostAuth {
    pub fn new(url: &str, credential: Credential) -> Self {
        Self {
            url: url.to_owned(),
            credential,
            answer: Mutex::new(Answer::Nothing),
        }
    }

    /// The `Authorization` header for the next request: none until the host asked.
    pub async fn header(&self) -> Option<String> {
        match &*self.answer.lock().await {
            Answer::Nothing => None,
            Answer::Header(header) => Some(header.clone()),
        }
    }

    /// The host refused a request with `www_authenticate`: work out the answer (asking
    /// the token service for `scope` when it wants a bearer token). `sent` is the header
    /// that was refused: when another request already renewed it, nothing is asked.
    pub async fn challenged(
        &self,
        http: &reqwest::Client,
        www_authenticate: Option<&str>,
        scope: &str,
        sent: Option<&str>,
    ) -> Result<(), AuthError> {
        let mut answer = self.answer.lock().await;
        if let Answer::Header(current) = &*answer
            && Some(current.as_str()) != sent
        {
            return Ok(());
        }
        let challenge = www_authenticate.and_then(parse_challenge).ok_or_else(|| {
            AuthError::Denied(format!(
                "{} refused the request and asked for nothing Rigger can answer",
                self.url
            ))
        })?;
        let header = match challenge {
            Challenge::Basic => match &self.credential {
                Credential::Basic { user, password } => basic_header(user, password),
                _ => {
                    return Err(AuthError::Denied(format!(
                        "{} wants a user and password; none are configured for it",
                        self.url
                    )));
                }
            },
            Challenge::Bearer {
                realm,
                service,
                scope: asked,
            } => {
                let scope = asked.unwrap_or_else(|| scope.to_owned());
                let token = self.token(http, &realm, service.as_deref(), &scope).await?;
                format!("Bearer {token}")
            }
        };
        *answer = Answer::Header(header);
        Ok(())
    }

    /// A bearer token from the token service at `realm`.
    async fn token(
        &self,
        http: &reqwest::Client,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<String, AuthError> {
        let fail = |detail: String| AuthError::TokenService {
            realm: realm.to_owned(),
            detail,
        };
        let trusted = may_send_credentials(realm, &self.url);
        let mut query: Vec<(&str, &str)> = vec![("scope", scope)];
        if let Some(service) = service {
            query.push(("service", service));
        }
        let request = match &self.credential {
            Credential::IdentityToken(refresh) if trusted => {
                let mut form = query.clone();
                form.extend([
                    ("grant_type", "refresh_token"),
                    ("refresh_token", refresh.as_str()),
                    ("client_id", "rigger-agent"),
                ]);
                http.post(realm).form(&form)
            }
            Credential::Basic { user, password } if trusted => http
                .get(realm)
                .query(&query)
                .header(AUTHORIZATION, basic_header(user, password)),
            Credential::Anonymous => http.get(realm).query(&query),
            _ => {
                return Err(AuthError::Denied(format!(
                    "{} sends its credentials' token requests to {realm}, which is neither HTTPS nor the host itself; they are not sent there",
                    self.url
                )));
            }
        };
        let response = request
            .timeout(TOKEN_TIMEOUT)
            .send()
            .await
            .map_err(|e| fail(rigger_daemon::error_chain(&e)))?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(AuthError::Denied(format!(
                "the token service {realm} refused the credentials for {} (HTTP {status})",
                self.url
            )));
        }
        if !status.is_success() {
            return Err(fail(format!("HTTP {status}")));
        }
        let body = read_capped(response, MAX_TOKEN_RESPONSE)
            .await
            .map_err(|e| match e {
                CappedRead::TooBig => fail(format!(
                    "the response is larger than {MAX_TOKEN_RESPONSE} bytes"
                )),
                CappedRead::Failed(detail) => fail(detail),
            })?;
        token_from(&body).ok_or_else(|| fail("the response holds no token".to_owned()))
    }
}

fn basic_header(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// `token` (the distribution spec) or `access_token` (OAuth2) of a token response.
fn token_from(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct TokenResponse {
        token: Option<String>,
        access_token: Option<String>,
    }
    let parsed: TokenResponse = serde_json::from_slice(body).ok()?;
    parsed
        .token
        .filter(|t| !t.is_empty())
        .or(parsed.access_token.filter(|t| !t.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_parsed_as_registries_send_them() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/busybox:pull".into()),
            })
        );
        // A scope with several actions holds a comma inside the quotes.
        assert_eq!(
            parse_challenge(r#"bearer realm="https://t/x", scope="repository:a/b:pull,push""#),
            Some(Challenge::Bearer {
                realm: "https://t/x".into(),
                service: None,
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="registry""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Bearer service=x"), None, "no realm");
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(parse_challenge(""), None);
    }

    #[test]
    fn credentials_go_to_a_token_service_over_https_or_to_the_plain_http_host_itself() {
        assert!(may_send_credentials(
            "https://auth.example/token",
            "https://reg.example"
        ));
        assert!(may_send_credentials(
            "https://auth.example/token",
            "http://reg.example"
        ));
        assert!(may_send_credentials(
            "http://127.0.0.1:9000/token",
            "http://127.0.0.1:5000"
        ));
        assert!(!may_send_credentials(
            "http://auth.example/token",
            "https://reg.example"
        ));
        assert!(!may_send_credentials(
            "http://evil.example/token",
            "http://reg.example"
        ));
        assert!(!may_send_credentials(
            "ftp://reg.example/token",
            "http://reg.example"
        ));
    }

    #[test]
    fn token_responses_of_both_shapes() {
        assert_eq!(token_from(br#"{"token":"a"}"#).as_deref(), Some("a"));
        assert_eq!(token_from(br#"{"access_token":"b"}"#).as_deref(), Some("b"));
        assert_eq!(
            token_from(br#"{"token":"","access_token":"c"}"#).as_deref(),
            Some("c")
        );
        assert_eq!(token_from(b"{}"), None);
        assert_eq!(token_from(b"not json"), None);
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let basic = Credential::Basic {
            user: "user".into(),
            password: "hunter2".into(),
        };
        let identity = Credential::IdentityToken("refresh-secret".into());
        let text = format!("{basic:?} {identity:?}");
        assert!(
            !text.contains("hunter2") && !text.contains("refresh-secret"),
            "{text}"
        );
    }
}
