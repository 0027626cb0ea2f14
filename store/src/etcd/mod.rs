//! The etcd store: objects under `<prefix>objects/<kind>/<namespace>/<name>`, revisions
//! are etcd's `mod_revision` (cluster-wide and increasing, as the embedded store's), and
//! conditional writes are etcd transactions comparing that revision.

pub mod election;

use std::path::PathBuf;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp, TxnOpResponse,
};

use super::{Backend, ObjectKey, Precondition, StoreError, Stored, check};

/// Keys of a Rigger installation start with this (several could share an etcd).
pub const DEFAULT_PREFIX: &str = "/rigger/";

#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    endpoints: String,
    prefix: String,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// How the controller reaches etcd over TLS (paths; checked when the config is resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: PathBuf,
    /// Client certificate and key, for an etcd with `--client-cert-auth`.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// tonic's TLS settings for etcd: its CA, and the controller's identity when given.
fn tls_options(tls: &EtcdTls) -> Result<etcd_client::TlsOptions, String> {
    let read = |path: &std::path::Path| {
        rigger_daemon::config::read_small_file(path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let mut options = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca)?));
    if let Some((cert, key)) = &tls.identity {
        options = options.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(options)
}

fn revision_of(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// How long the store waits for one etcd request.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A client to `endpoints` (`host:port`, several for an etcd cluster), over TLS when
/// `tls` is given; its connection runs on the calling runtime. `request_timeout` bounds
/// every request; `None` for the leader election's, whose Campaign waits as long as
/// another replica leads (and whose keep-alives are bounded by the lease itself).
pub async fn connect_client(
    endpoints: &[String],
    tls: Option<&EtcdTls>,
    request_timeout: Option<std::time::Duration>,
) -> Result<Client, StoreError> {
    let joined = endpoints.join(",");
    let scheme = if tls.is_some() { "etcds" } else { "etcd" };
    let mut options = ConnectOptions::new()
        .with_connect_timeout(std::time::Duration::from_secs(5))
        .with_keep_alive(
            std::time::Duration::from_secs(10),
            std::time::Duration::from_secs(5),
        );
    if let Some(timeout) = request_timeout {
        options = options.with_timeout(timeout);
    }
    if let Some(tls) = tls {
        options = options.with_tls(tls_options(tls).map_err(|detail| StoreError::Backend {
            location: format!("{scheme}://{joined}"),
            detail,
        })?);
    }
    Client::connect(endpoints, Some(options))
        .await
        .map_err(|e| StoreError::Backend {
            location: format!("{scheme}://{joined}"),
            detail: format!("cannot connect: {}", rigger_daemon::error_chain(&e)),
        })
}

impl EtcdStore {
    /// Connect to `endpoints` (`host:port`, several for an etcd cluster), over TLS when
    /// `tls` is given.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        tls: Option<&EtcdTls>,
    ) -> Result<Self, StoreError> {
        let joined = endpoints.join(",");
        let scheme = if tls.is_some() { "etcds" } else { "etcd" };
        let mut client = connect_client(endpoints, tls, Some(REQUEST_TIMEOUT)).await?;
        // A cheap read proves the cluster answers before the controller binds; it reads
        // the store's format, checked before anything is written.
        let location = format!("{scheme}://{joined}");
        let unanswered = |e: etcd_client::Error| StoreError::Backend {
            location: location.clone(),
            detail: format!("does not answer: {}", rigger_daemon::error_chain(&e)),
        };
        let format_key = format!("{prefix}format");
        let found = client
            .get(format_key.clone(), None)
            .await
            .map_err(unanswered)?
            .kvs()
            .first()
            .map(|kv| {
                kv.value_str()
                    .ok()
                    .and_then(|text| text.trim().parse::<u64>().ok())
                    // Unreadable: no format this release knows.
                    .unwrap_or(u64::MAX)
            });
        super::check_format(&format!("{location} (prefix {prefix})"), found)?;
        if found.is_none() {
            // Recorded once; a replica that recorded it meanwhile wins, with the same.
            client
                .txn(
                    Txn::new()
                        .when([Compare::create_revision(
                            format_key.clone(),
                            CompareOp::Equal,
                            0,
                        )])
                        .and_then([TxnOp::put(
                            format_key,
                            super::STORE_FORMAT.to_string(),
                            None,
                        )]),
                )
                .await
                .map_err(unanswered)?;
        }
        Ok(Self {
            client,
            endpoints: joined,
            prefix: prefix.to_owned(),
        })
    }

    /// The store's client (the leader election makes its own: [`connect_client`]).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn backend(&self, e: &etcd_client::Error) -> StoreError {
        StoreError::Backend {
            location: format!("etcd://{}", self.endpoints),
            detail: e.to_string(),
        }
    }

    fn path(&self, key: &ObjectKey) -> String {
        format!("{}objects/{}", self.prefix, key.encode())
    }

    /// The current revision of `key` (0 when absent), for conflict messages.
    async fn current(&self, key: &ObjectKey) -> Result<Option<u64>, StoreError> {
        Ok(self.get(key.clone()).await?.map(|s| s.revision))
    }

    async fn commit_all(&self, ops: Vec<TxnOp>) -> Result<(), StoreError> {
        self.client
            .clone()
            .txn(Txn::new().and_then(ops))
            .await
            .map_err(|e| self.backend(&e))?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl Backend for EtcdStore {
    async fn put(
        &self,
        key: ObjectKey,
        object: Vec<u8>,
        precondition: Precondition,
    ) -> Result<u64, StoreError> {
        let path = self.path(&key);
        let compare = match precondition {
            Precondition::Any => Vec::new(),
            Precondition::Absent => {
                vec![Compare::create_revision(path.clone(), CompareOp::Equal, 0)]
            }
            Precondition::Revision(revision) => vec![Compare::mod_revision(
                path.clone(),
                CompareOp::Equal,
                i64::try_from(revision).unwrap_or(i64::MAX),
            )],
        };
        let txn = Txn::new()
            .when(compare)
            .and_then([TxnOp::put(path, object, None)]);
        let response = self
            .client
            .clone()
            .txn(txn)
            .await
            .map_err(|e| self.backend(&e))?;
        if !response.succeeded() {
            let current = self.current(&key).await?;
            check(&key.to_string(), precondition, current)?;
            // The object changed back between the two reads: report it as a conflict.
            return Err(StoreError::Conflict {
                key: key.to_string(),
                expected: 0,
                actual: current.unwrap_or(0),
            });
        }
        Ok(response
            .header()
            .map_or(0, |header| revision_of(header.revision())))
    }

    /// Write every object, unconditionally, in as few transactions as etcd takes: each
    /// within its default limits (128 operations, 1.5 MiB per request), in order.
    async fn put_all(&self, objects: Vec<(ObjectKey, Vec<u8>)>) -> Result<(), StoreError> {
        const MAX_OPS: usize = 64;
        const MAX_BYTES: usize = 1 << 20;
        let mut batch: Vec<TxnOp> = Vec::new();
        let mut bytes = 0;
        for (key, object) in objects {
            if !batch.is_empty() && (batch.len() == MAX_OPS || bytes + object.len() > MAX_BYTES) {
                self.commit_all(std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
            bytes += object.len();
            batch.push(TxnOp::put(self.path(&key), object, None));
        }
        if !batch.is_empty() {
            self.commit_all(batch).await?;
        }
        Ok(())
    }

    async fn get(&self, key: ObjectKey) -> Result<Option<Stored>, StoreError> {
        let response = self
            .client
            .clone()
            .get(self.path(&key), None)
            .await
            .map_err(|e| self.backend(&e))?;
        Ok(response.kvs().first().map(|kv| Stored {
            key,
            revision: revision_of(kv.mod_revision()),
            object: kv.value().to_vec(),
        }))
    }

    async fn list(&self, kind: &str) -> Result<Vec<Stored>, StoreError> {
        let prefix = format!("{}objects/{kind}/", self.prefix);
        let response = self
            .client
            .clone()
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| self.backend(&e))?;
        let strip = format!("{}objects/", self.prefix);
        Ok(response
            .kvs()
            .iter()
            .filter_map(|kv| {
                let key = kv.key_str().ok()?.strip_prefix(&strip)?;
                Some(Stored {
                    key: ObjectKey::decode(key)?,
                    revision: revision_of(kv.mod_revision()),
                    object: kv.value().to_vec(),
                })
            })
            .collect())
    }

    async fn delete(&self, key: ObjectKey, precondition: Precondition) -> Result<(), StoreError> {
        let path = self.path(&key);
        let mut compare = vec![Compare::create_revision(
            path.clone(),
            CompareOp::Greater,
            0,
        )];
        if let Precondition::Revision(revision) = precondition {
            compare.push(Compare::mod_revision(
                path.clone(),
                CompareOp::Equal,
                i64::try_from(revision).unwrap_or(i64::MAX),
            ));
        }
        let txn = Txn::new()
            .when(compare)
            .and_then([TxnOp::delete(path, None)]);
        let response = self
            .client
            .clone()
            .txn(txn)
            .await
            .map_err(|e| self.backend(&e))?;
        if response.succeeded() {
            let deleted = response
                .op_responses()
                .into_iter()
                .any(|op| matches!(op, TxnOpResponse::Delete(d) if d.deleted() > 0));
            if deleted {
                return Ok(());
            }
        }
        match self.current(&key).await? {
            None => Err(StoreError::NotFound {
                key: key.to_string(),
            }),
            current => {
                check(&key.to_string(), precondition, current)?;
                Err(StoreError::Conflict {
                    key: key.to_string(),
                    expected: 0,
                    actual: current.unwrap_or(0),
                })
            }
        }
    }
}
