//! The webhook's certificate: a CA of its own (ten years) and a serving certificate it
//! signs (one year, renewed a month before its end, or when the names it must hold
//! change), kept in one Secret of the controller's namespace so that every replica
//! serves the same one and the API server trusts them all through one `caBundle`. The
//! CA outlives the serving certificates, so a renewal never changes the `caBundle`.
//!
//! The Secret itself is `deploy/kubernetes`'s (shipped empty): the controller may read
//! and write that one Secret and create none.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// The Secret every replica reads the certificate from.
pub const SECRET_NAME: &str = "rigger-sidecar-webhook-certs";
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";

const DAY: i64 = 24 * 60 * 60;
/// A serving certificate is renewed this long before its end.
const RENEW_BEFORE: i64 = 30 * DAY;

#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("the webhook certificate cannot be made: {0}")]
    Generate(#[from] rcgen::Error),
    #[error(
        "Secret {namespace}/{SECRET_NAME} does not exist: apply deploy/kubernetes, which holds it (empty; the controller fills it)"
    )]
    Missing { namespace: String },
    #[error("Secret {namespace}/{SECRET_NAME}: {source}")]
    Api {
        namespace: String,
        source: kube::Error,
    },
}

/// What the Secret holds, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookPki {
    pub ca_cert: String,
    ca_key: String,
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for WebhookPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookPki").finish_non_exhaustive()
    }
}

/// What to do with the certificate found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    Keep,
    /// The serving certificate, from the CA found.
    Certificate,
    /// Everything (no usable CA).
    Authority,
}

/// What `found` needs (pure): kept while its CA is good for a year more and its serving
/// certificate holds every name and is a month from its end; `now` in seconds since the
/// Unix epoch.
pub fn renewal(found: Option<&WebhookPki>, names: &[String], now: i64) -> Renewal {
    let Some(found) = found else {
        return Renewal::Authority;
    };
    let ca_good = CertificateParams::from_ca_cert_pem(&found.ca_cert)
        .is_ok_and(|ca| ca.not_after.unix_timestamp() > now + 365 * DAY)
        && KeyPair::from_pem(&found.ca_key).is_ok();
    if !ca_good {
        return Renewal::Authority;
    }
    let Ok(serving) = CertificateParams::from_ca_cert_pem(&found.cert) else {
        return Renewal::Certificate;
    };
    let held: Vec<String> = serving
        .subject_alt_names
        .iter()
        .filter_map(|san| match san {
            rcgen::SanType::DnsName(name) => Some(name.to_string()),
            rcgen::SanType::IpAddress(ip) => Some(ip.to_string()),
            _ => None,
        })
        .collect();
    let fresh = serving.not_after.unix_timestamp() > now + RENEW_BEFORE;
    if fresh && names.iter().all(|n| held.contains(n)) && KeyPair::from_pem(&found.key).is_ok() {
        Renewal::Keep
    } else {
        Renewal::Certificate
    }
}

/// A new serving certificate for `names` from `found`'s CA, or a new CA with it.
pub fn issue(
    found: Option<&WebhookPki>,
    renewal: &Renewal,
    names: &[String],
    now: i64,
) -> Result<WebhookPki, rcgen::Error> {
    let start = time::OffsetDateTime::from_unix_timestamp(now - DAY)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    // (The issuer object, the CA as stored: rcgen signs with the CA's name and key, and
    // re-creating it from its parameters re-signs it, which must not change the bundle.)
    let (ca, ca_key, ca_pem) = match (found, renewal) {
        (Some(found), Renewal::Certificate) => {
            let key = KeyPair::from_pem(&found.ca_key)?;
            let params = CertificateParams::from_ca_cert_pem(&found.ca_cert)?;
            (params.self_signed(&key)?, key, Some(found.ca_cert.clone()))
        }
        _ => {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(Vec::<String>::new())?;
            params
                .distinguished_name
                .push(DnType::CommonName, "Rigger sidecar webhook CA");
            params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            params.not_before = start;
            params.not_after = start + time::Duration::days(3650);
            (params.self_signed(&key)?, key, None)
        }
    };
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "rigger-sidecar-webhook");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.not_before = start;
    params.not_after = start + time::Duration::days(365);
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    Ok(WebhookPki {
        ca_cert: ca_pem.unwrap_or_else(|| ca.pem()),
        ca_key: ca_key.serialize_pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

fn from_secret(secret: &Secret) -> Option<WebhookPki> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| {
        data.get(key)
            .and_then(|ByteString(bytes)| String::from_utf8(bytes.clone()).ok())
    };
    Some(WebhookPki {
        ca_cert: text(CA_CERT)?,
        ca_key: text(CA_KEY)?,
        cert: text(TLS_CERT)?,
        key: text(TLS_KEY)?,
    })
}

fn to_secret(pki: &WebhookPki, resource_version: Option<String>) -> Secret {
    let bytes = |text: &str| ByteString(text.as_bytes().to_vec());
    Secret {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(SECRET_NAME.to_owned()),
            resource_version,
            labels: Some([("app.kubernetes.io/name".to_owned(), "rigger".to_owned())].into()),
            ..Default::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(
            [
                (CA_CERT.to_owned(), bytes(&pki.ca_cert)),
                (CA_KEY.to_owned(), bytes(&pki.ca_key)),
                (TLS_CERT.to_owned(), bytes(&pki.cert)),
                (TLS_KEY.to_owned(), bytes(&pki.key)),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

/// The certificate every replica serves, made or renewed when it needs to be. Two
/// replicas at once: one write wins (a replace at the version read), the other reads
/// the winner's.
pub async fn ensure(
    client: &kube::Client,
    namespace: &str,
    names: &[String],
) -> Result<WebhookPki, CertificateError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let failed = |source| CertificateError::Api {
        namespace: namespace.to_owned(),
        source,
    };
    let Some(stored) = api.get_opt(SECRET_NAME).await.map_err(failed)? else {
        return Err(CertificateError::Missing {
            namespace: namespace.to_owned(),
        });
    };
    let found = from_secret(&stored);
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let renewal = renewal(found.as_ref(), names, now);
    if renewal == Renewal::Keep
        && let Some(found) = found
    {
        return Ok(found);
    }
    let pki = issue(found.as_ref(), &renewal, names, now)?;
    let written = api
        .replace(
            SECRET_NAME,
            &PostParams::default(),
            &to_secret(&pki, stored.metadata.resource_version),
        )
        .await;
    match written {
        Ok(_) => {
            tracing::info!(
                secret = SECRET_NAME,
                ?renewal,
                "sidecar webhook certificate written"
            );
            Ok(pki)
        }
        // Another replica wrote first: serve what it wrote.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let stored = api.get(SECRET_NAME).await.map_err(failed)?;
            Ok(from_secret(&stored).unwrap_or(pki))
        }
        Err(error) => Err(failed(error)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const NOW: i64 = 1_795_000_000;

    #[test]
    fn certificates_are_kept_renewed_or_remade_as_they_need() {
        let names = vec!["rigger-controller.rigger-system.svc".to_owned()];
        assert_eq!(renewal(None, &names, NOW), Renewal::Authority);
        let pki = issue(None, &Renewal::Authority, &names, NOW).unwrap();
        assert_eq!(renewal(Some(&pki), &names, NOW), Renewal::Keep);
        // A name more, or a month before the end: a new serving certificate, same CA.
        let more = vec![names[0].clone(), "127.0.0.1".to_owned()];
        assert_eq!(renewal(Some(&pki), &more, NOW), Renewal::Certificate);
        let late = NOW + 340 * DAY;
        assert_eq!(renewal(Some(&pki), &names, late), Renewal::Certificate);
        let renewed = issue(Some(&pki), &Renewal::Certificate, &more, late).unwrap();
        assert_eq!(renewed.ca_cert, pki.ca_cert);
        assert_ne!(renewed.cert, pki.cert);
        assert_eq!(renewal(Some(&renewed), &more, late), Renewal::Keep);
        // Broken or hostile contents: remade, never trusted.
        let broken = WebhookPki {
            ca_key: "not a key".to_owned(),
            ..pki.clone()
        };
        assert_eq!(renewal(Some(&broken), &names, NOW), Renewal::Authority);
        let bad_cert = WebhookPki {
            cert: "garbage".to_owned(),
            ..pki
        };
        assert_eq!(renewal(Some(&bad_cert), &names, NOW), Renewal::Certificate);
    }
}
