//! A registry token server for tests: the bearer-token half of the distribution registry's
//! `auth: token` scheme (docs/spec/auth/token.md), so pulls can be tested against a
//! registry that wants tokens, as Docker Hub, GHCR and Harbor do.
//!
//! It makes a signing key and a self-signed certificate, writes the certificate to
//! `--cert-out` (the registry's `rootcertbundle`), and answers `GET /token?service=…&
//! scope=repository:NAME:pull` with an ES256 JWT carrying the certificate in `x5c`.
//! Clients authenticate with basic auth as `--user`/`--password`; without credentials
//! they get a token only with `--allow-anonymous`. With `--refresh-token`, `POST /token`
//! answers docker's OAuth2 refresh-token grant (`grant_type=refresh_token`, what a docker
//! `identitytoken` is traded with) for that token. `GET /_token/issued` lists who got
//! tokens for what, and by which grant (JSON), for assertions.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use clap::Parser;
use serde::{Deserialize, Serialize};

/// Clock skew the distribution registry tolerates on `exp` and `nbf`.
const REGISTRY_LEEWAY: u64 = 60;

#[derive(Debug, Parser)]
#[command(
    name = "rigger-lab-token-server",
    about = "Bearer-token server for registry tests"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to write the signing certificate (PEM), for the registry's rootcertbundle.
    #[arg(long)]
    cert_out: PathBuf,
    /// The `iss` of issued tokens (the registry's `auth.token.issuer`).
    #[arg(long, default_value = "rigger-lab-token-server")]
    issuer: String,
    /// Credentials that get tokens.
    #[arg(long)]
    user: Option<String>,
    #[arg(long)]
    password: Option<String>,
    /// Issue tokens to clients without credentials.
    #[arg(long)]
    allow_anonymous: bool,
    /// The refresh token (a docker `identitytoken`) that `POST /token` accepts.
    #[arg(long)]
    refresh_token: Option<String>,
    /// How long issued tokens are accepted, in seconds. The registry allows 60 s of clock
    /// skew past a token's `exp`, so `exp` is set that much earlier.
    #[arg(long, default_value_t = 300)]
    expires_in: u64,
}

struct Issuer {
    args: Args,
    key: jsonwebtoken::EncodingKey,
    /// The certificate, base64 DER, for the JWT's `x5c`.
    cert: String,
    issued: Mutex<Vec<Issued>>,
}

#[derive(Debug, Clone, Serialize)]
struct Issued {
    account: String,
    scope: String,
    /// `basic`, `anonymous` or `refresh_token`.
    grant: String,
    /// Whether the request carried an `Authorization` header of any kind.
    authorization: bool,
}

/// The OAuth2 form of `POST /token`.
#[derive(Debug, Deserialize)]
struct TokenForm {
    grant_type: String,
    refresh_token: Option<String>,
    service: Option<String>,
    scope: Option<String>,
}

#[derive(Debug, Deserialize)]
struct TokenQuery {
    service: Option<String>,
    scope: Option<String>,
}

#[derive(Debug, Serialize)]
struct Access {
    #[serde(rename = "type")]
    kind: String,
    name: String,
    actions: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Claims {
    iss: String,
    sub: String,
    aud: String,
    exp: u64,
    nbf: u64,
    iat: u64,
    jti: String,
    access: Vec<Access>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let key_pair = rcgen::KeyPair::generate().context("signing key")?;
    let cert = rcgen::CertificateParams::new(vec!["rigger-lab-token-server".to_owned()])
        .context("certificate parameters")?
        .self_signed(&key_pair)
        .context("self-signed certificate")?;
    std::fs::write(&args.cert_out, cert.pem())
        .with_context(|| format!("write {}", args.cert_out.display()))?;
    let key = jsonwebtoken::EncodingKey::from_ec_pem(key_pair.serialize_pem().as_bytes())
        .context("signing key as PEM")?;
    let listen = args.listen;
    let issuer = Arc::new(Issuer {
        key,
        cert: base64::engine::general_purpose::STANDARD.encode(cert.der()),
        args,
        issued: Mutex::default(),
    });
    let app = axum::Router::new()
        .route("/token", get(token).post(oauth_token))
        .route("/_token/issued", get(issued))
        .with_state(issuer);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

async fn issued(State(issuer): State<Arc<Issuer>>) -> Response {
    let issued = issuer.issued.lock().map(|i| i.clone()).unwrap_or_default();
    axum::Json(issued).into_response()
}

async fn token(
    State(issuer): State<Arc<Issuer>>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
) -> Response {
    let account = match basic_credentials(&headers) {
        Some((user, password))
            if Some(&user) == issuer.args.user.as_ref()
                && Some(&password) == issuer.args.password.as_ref() =>
        {
            user
        }
        Some(_) => return (StatusCode::UNAUTHORIZED, "bad credentials\n").into_response(),
        None if issuer.args.allow_anonymous => String::new(),
        None => {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"rigger-lab\"")],
                "credentials required\n",
            )
                .into_response();
        }
    };
    let grant = if account.is_empty() {
        "anonymous"
    } else {
        "basic"
    };
    let authorization = headers.contains_key(header::AUTHORIZATION);
    issue(
        &issuer,
        account,
        query.service,
        query.scope,
        grant,
        authorization,
    )
}

/// docker's refresh-token grant: the identity token buys an access token.
async fn oauth_token(
    State(issuer): State<Arc<Issuer>>,
    headers: HeaderMap,
    Form(form): Form<TokenForm>,
) -> Response {
    let accepted = issuer.args.refresh_token.is_some()
        && form.grant_type == "refresh_token"
        && form.refresh_token == issuer.args.refresh_token;
    if !accepted {
        return (StatusCode::UNAUTHORIZED, "invalid grant\n").into_response();
    }
    let authorization = headers.contains_key(header::AUTHORIZATION);
    issue(
        &issuer,
        "identity".to_owned(),
        form.service,
        form.scope,
        "refresh_token",
        authorization,
    )
}

/// A signed token for `account` with pull access to the scope's repository.
fn issue(
    issuer: &Issuer,
    account: String,
    service: Option<String>,
    scope: Option<String>,
    grant: &str,
    authorization: bool,
) -> Response {
    let scope = scope.unwrap_or_default();
    // "repository:NAME:ACTIONS"; only pull is granted.
    let access = scope
        .strip_prefix("repository:")
        .and_then(|rest| rest.rsplit_once(':'))
        .map(|(name, actions)| Access {
            kind: "repository".to_owned(),
            name: name.to_owned(),
            actions: actions
                .split(',')
                .filter(|a| *a == "pull")
                .map(str::to_owned)
                .collect(),
        })
        .into_iter()
        .collect();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let claims = Claims {
        iss: issuer.args.issuer.clone(),
        sub: account.clone(),
        aud: service.unwrap_or_default(),
        exp: (now + issuer.args.expires_in).saturating_sub(REGISTRY_LEEWAY),
        nbf: now.saturating_sub(REGISTRY_LEEWAY + 10),
        iat: now,
        jti: format!("{now}-{}", std::process::id()),
        access,
    };
    let mut jwt_header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    jwt_header.x5c = Some(vec![issuer.cert.clone()]);
    let token = match jsonwebtoken::encode(&jwt_header, &claims, &issuer.key) {
        Ok(token) => token,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    if let Ok(mut issued) = issuer.issued.lock() {
        issued.push(Issued {
            account,
            scope,
            grant: grant.to_owned(),
            authorization,
        });
    }
    axum::Json(serde_json::json!({
        "token": token,
        "access_token": token,
        "expires_in": issuer.args.expires_in,
    }))
    .into_response()
}

fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}
