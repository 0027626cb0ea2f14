//! Reaching the controller: the config file, TLS, the bearer token, the leader among
//! replicas, and the calls every verb makes (get one object, list a kind).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use rigger_proto::v1::control_client::ControlClient;
use rigger_proto::v1::{GetRequest, ListRequest, WatchEvent, WatchRequest};
use serde_json::Value;
use tonic::transport::Channel;

use crate::rate_limit::WaitOutRateLimit;

/// Where the controller is and who is asking; every verb takes these.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// Controller URL [default: from the config file, else https://127.0.0.1:9450].
    #[arg(long, global = true, env = "RIGGER_SERVER")]
    server: Option<String>,
    /// CA certificate (PEM) that signed the controller's certificate (https).
    #[arg(long, global = true, env = "RIGGER_CA_FILE", value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// Bearer token [default: from the config file].
    #[arg(long, global = true, env = "RIGGER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Config file with `server`, `ca_file` and `token`
    /// [default: ~/.config/rigger/riggerctl.toml when it exists].
    #[arg(long, global = true, env = "RIGGERCTL_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
}

/// riggerctl's config file.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    server: Option<String>,
    ca_file: Option<PathBuf>,
    token: Option<String>,
}

/// Adds the user's bearer token to every call.
#[derive(Debug, Clone)]
pub struct BearerToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

/// Largest response accepted from the controller.
const MAX_RESPONSE: usize = 1 << 30;

pub type Client = ControlClient<
    tonic::service::interceptor::InterceptedService<WaitOutRateLimit<Channel>, BearerToken>,
>;

/// How long riggerctl waits out the controller's request-rate limit before giving up
/// with its refusal.
const RATE_LIMIT_PATIENCE: Duration = Duration::from_secs(60);

fn say_rate_limited(wait: Duration) {
    eprintln!(
        "riggerctl: the controller limits this client's requests per second; retrying in {:.1}s",
        wait.as_secs_f64()
    );
}

pub async fn connect(cli: &ConnectArgs) -> anyhow::Result<Client> {
    let default_config = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".config/rigger/riggerctl.toml"))
        .filter(|p| p.exists());
    let file = match cli.config.as_ref().or(default_config.as_ref()) {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            toml::from_str::<ConfigFile>(&text)
                .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message()))?
        }
        None => ConfigFile::default(),
    };
    let servers = cli
        .server
        .clone()
        .or(file.server)
        .unwrap_or_else(|| "https://127.0.0.1:9450".to_owned());
    let token = match cli.token.clone().or(file.token) {
        Some(token) => Some(
            format!("Bearer {}", token.trim())
                .parse()
                .map_err(|_| anyhow::anyhow!("the token has characters a header cannot carry"))?,
        ),
        None => None,
    };
    let ca_file = cli.ca_file.clone().or(file.ca_file);
    // Several servers: replicas of an HA controller; the one whose gRPC health service
    // says the API is SERVING leads, followers say NOT_SERVING and the next is tried.
    let mut errors: Vec<String> = Vec::new();
    // A server that answers as a follower is one replica of several, even when it is the
    // only address given (a Service in front of them, which picks one per connection).
    let mut replicated = servers.split(',').filter(|s| !s.trim().is_empty()).count() > 1;
    // Whether every server failed in a way waiting may mend (unreachable, a follower).
    let mut unanswered = true;
    for server in servers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let channel = match connect_one(server, ca_file.as_deref()).await {
            Ok(channel) => channel,
            Err(e) => {
                unanswered &= e.is::<Unanswered>();
                errors.push(format!("{e:#}"));
                continue;
            }
        };
        match leads(channel.clone()).await {
            Ok(true) => {}
            Ok(false) => {
                replicated = true;
                errors.push(format!(
                    "{server}: not the leader: this controller replica is a follower"
                ));
                continue;
            }
            Err(status) => {
                unanswered &= is_failover(&status);
                errors.push(format!("{server}: {}", status.message()));
                continue;
            }
        }
        // A list of thousands of nodes, or a job's status over them, is tens of MiB.
        let channel = WaitOutRateLimit::new(channel, RATE_LIMIT_PATIENCE, say_rate_limited);
        return Ok(ControlClient::with_interceptor(channel, BearerToken(token))
            .max_decoding_message_size(MAX_RESPONSE));
    }
    let message = match errors.as_slice() {
        [] => return Err(anyhow::anyhow!("--server names no controller")),
        [one] => one.clone(),
        all => format!("no controller answered: {}", all.join("; ")),
    };
    if unanswered {
        Err(Unanswered {
            message,
            replicated,
        }
        .into())
    } else {
        Err(anyhow::anyhow!(message))
    }
}

/// No replica could be reached or led: waiting may mend it (another takes over), as
/// opposed to a refusal (the configuration, a certificate).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct Unanswered {
    message: String,
    /// Several replicas were configured: one may be about to lead.
    replicated: bool,
}

/// [`connect`], again and again until `deadline` while no replica leads or answers (a
/// leader killed: another takes over within its lease); a refusal that waiting cannot
/// mend (the configuration, the token) comes at once.
pub async fn connect_within(
    cli: &ConnectArgs,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Client> {
    let mut backoff = failover_backoff();
    loop {
        match connect(cli).await {
            Ok(client) => return Ok(client),
            Err(error) if error.is::<Unanswered>() => {
                let pause = backoff.next_delay();
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(error);
                }
                tokio::time::sleep(pause).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// A connection for one verb: with several replicas configured, a failover under way
/// (no replica leads yet) is waited out within [`READ_FAILOVER_WINDOW`]; a single
/// controller that cannot be reached is said at once, as kubectl says it.
pub async fn connect_for_a_verb(cli: &ConnectArgs) -> anyhow::Result<Client> {
    match connect(cli).await {
        Err(error)
            if error
                .downcast_ref::<Unanswered>()
                .is_some_and(|unanswered| unanswered.replicated) =>
        {
            connect_within(cli, tokio::time::Instant::now() + READ_FAILOVER_WINDOW).await
        }
        connected => connected,
    }
}

/// How long a read (get, describe) that the controller could not answer because it went
/// away or stepped down is asked again of the next leader: a failover with etcd takes a
/// lease (15 s by default) and an election.
const READ_FAILOVER_WINDOW: Duration = Duration::from_secs(30);

/// How often a new leader is looked for: soon, then every two seconds at most.
fn failover_backoff() -> rigger_daemon::backoff::Backoff {
    rigger_daemon::backoff::Backoff::new(Duration::from_millis(250), Duration::from_secs(2))
}

/// A connection to whichever replica leads next, however long that takes (the caller
/// bounds the wait, or its user does); said once on stderr. A refusal that waiting
/// cannot mend (the configuration, a certificate, the token) ends it.
pub async fn connect_to_the_next_leader(connection: &ConnectArgs) -> anyhow::Result<Client> {
    let mut backoff = failover_backoff();
    let mut said = false;
    loop {
        tokio::time::sleep(backoff.next_delay()).await;
        match connect(connection).await {
            Ok(client) => return Ok(client),
            Err(error) if error.is::<Unanswered>() => {
                if !std::mem::replace(&mut said, true) {
                    eprintln!(
                        "riggerctl: the controller went away; waiting for one to lead ({error:#})"
                    );
                }
            }
            Err(error) => return Err(error),
        }
    }
}

/// Whether a call's failure is the controller going away or stepping down, which a new
/// connection (to the new leader) mends.
pub fn is_failover(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
            | tonic::Code::Aborted
    )
}

/// Whether the controller behind `channel` leads: grpc.health.v1 for the API service
/// (no token needed). One without the health service (older than it) is taken at its
/// word, as before: its answers say whether it leads.
async fn leads(channel: Channel) -> Result<bool, tonic::Status> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let request = HealthCheckRequest {
        service: rigger_proto::v1::control_server::SERVICE_NAME.to_owned(),
    };
    match HealthClient::new(channel).check(request).await {
        Ok(answer) => Ok(answer.into_inner().status == ServingStatus::Serving as i32),
        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(true),
        Err(status) => Err(status),
    }
}

async fn connect_one(server: &str, ca_file: Option<&std::path::Path>) -> anyhow::Result<Channel> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(server.to_owned())
        .with_context(|| format!("--server {server:?} is not a URL"))?
        .connect_timeout(Duration::from_secs(10));
    if server.starts_with("https://") {
        let ca_file = ca_file.ok_or_else(|| {
            anyhow::anyhow!(
                "{server}: https needs --ca-file (the CA that signed the controller's certificate)"
            )
        })?;
        let ca =
            std::fs::read(ca_file).with_context(|| format!("--ca-file {}", ca_file.display()))?;
        endpoint = endpoint
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            )
            .with_context(|| format!("TLS settings for {server}"))?;
    }
    endpoint.connect().await.map_err(|e| {
        Unanswered {
            message: format!(
                "cannot reach the controller at {server}: {}",
                rigger_daemon::error_chain(&e)
            ),
            replicated: false,
        }
        .into()
    })
}

/// The controller's refusal as one line.
pub fn refused(status: &tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", status.message())
}

/// After a read failed with `status`: a connection to the next leader to ask it again,
/// when the controller went away or stepped down and `deadline` has not passed; else
/// the refusal.
async fn ask_again(
    connection: &ConnectArgs,
    status: &tonic::Status,
    deadline: tokio::time::Instant,
) -> anyhow::Result<Client> {
    if is_failover(status) && tokio::time::Instant::now() < deadline {
        connect_within(connection, deadline).await
    } else {
        Err(refused(status))
    }
}

/// One object, as the controller serves it.
pub async fn fetch(
    client: &mut Client,
    connection: &ConnectArgs,
    kind: &str,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Value> {
    let request = GetRequest {
        kind: kind.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    let deadline = tokio::time::Instant::now() + READ_FAILOVER_WINDOW;
    let object = loop {
        match client.get(request.clone()).await {
            Ok(object) => break object.into_inner(),
            Err(status) => *client = ask_again(connection, &status, deadline).await?,
        }
    };
    serde_json::from_str(&object.json).context("the controller sent an unreadable object")
}

/// `-l` and `--field-selector`, applied by the controller.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Selectors {
    /// Label selector, e.g. app=web,tier!=db,zone in (a,b),ready,!drain.
    #[arg(long = "selector", short = 'l', default_value = "")]
    pub labels: String,
    /// Field selector on metadata.name and metadata.namespace, e.g. metadata.name=warm.
    #[arg(long = "field-selector", default_value = "")]
    pub fields: String,
}

/// Every object of a kind in a namespace (all namespaces for `""`).
pub async fn fetch_all(
    client: &mut Client,
    connection: &ConnectArgs,
    kind: &str,
    namespace: &str,
    selectors: &Selectors,
) -> anyhow::Result<Vec<Value>> {
    let request = ListRequest {
        kind: kind.to_owned(),
        namespace: namespace.to_owned(),
        label_selector: selectors.labels.clone(),
        field_selector: selectors.fields.clone(),
    };
    let deadline = tokio::time::Instant::now() + READ_FAILOVER_WINDOW;
    let list = loop {
        match client.list(request.clone()).await {
            Ok(list) => break list.into_inner(),
            Err(status) => *client = ask_again(connection, &status, deadline).await?,
        }
    };
    list.items
        .iter()
        .map(|o| serde_json::from_str(&o.json).context("the controller sent an unreadable object"))
        .collect()
}

/// One change a watch reports.
#[derive(Debug)]
pub enum Change {
    /// Added, modified or deleted (`deleted`): the object as it is (or was last).
    Object { object: Value, deleted: bool },
    /// Every object there was at the start has been sent.
    Synced,
    /// The watch starts again from a new listing (another leader answers now): what was
    /// seen before may be gone without a deletion being sent.
    Relisted,
}

/// The controller's changes to objects of a kind (in a namespace, `""` for all, and by
/// the selectors), from the objects there are now; resumed from the last version seen
/// when the stream breaks (from the start again when the controller no longer holds it).
pub struct Watch<'a> {
    client: &'a mut Client,
    request: WatchRequest,
    stream: Option<tonic::Streaming<WatchEvent>>,
    /// Where to find the leader again when this one goes away (`None`: the watch ends).
    reconnect: Option<ConnectArgs>,
    /// A new listing begins: said once before its objects.
    relisted: bool,
}

impl<'a> Watch<'a> {
    pub fn new(client: &'a mut Client, kind: &str, namespace: &str, selectors: &Selectors) -> Self {
        Self {
            client,
            request: WatchRequest {
                kind: kind.to_owned(),
                namespace: namespace.to_owned(),
                label_selector: selectors.labels.clone(),
                field_selector: selectors.fields.clone(),
                resource_version: 0,
            },
            stream: None,
            reconnect: None,
            relisted: false,
        }
    }

    /// Through a failover: when the controller goes away or steps down, connect to the
    /// replica that leads next (as often as it takes: the caller bounds the wait) and
    /// resume from the last version seen.
    #[must_use]
    pub fn following_the_leader(mut self, connection: &ConnectArgs) -> Self {
        self.reconnect = Some(connection.clone());
        self
    }

    /// A new connection to whichever replica leads now.
    async fn reconnect(&mut self) -> anyhow::Result<()> {
        let Some(connection) = &self.reconnect else {
            return Ok(());
        };
        self.stream = None;
        // Another replica's versions are not this one's: from its listing.
        self.request.resource_version = 0;
        self.relisted = true;
        *self.client = connect_to_the_next_leader(connection).await?;
        Ok(())
    }

    /// The next change; an error once the controller refuses or cannot be reached.
    pub async fn next(&mut self) -> anyhow::Result<Change> {
        loop {
            let stream = match &mut self.stream {
                Some(stream) => stream,
                None => {
                    let stream = match self.client.watch(self.request.clone()).await {
                        Ok(stream) => stream.into_inner(),
                        Err(status) if self.reconnect.is_some() && is_failover(&status) => {
                            self.reconnect().await?;
                            continue;
                        }
                        Err(status) => {
                            return Err(match status.code() {
                                tonic::Code::Unimplemented => anyhow::anyhow!(
                                    "the controller does not serve Watch (it is older than this riggerctl); upgrade it, or leave out -w"
                                ),
                                _ => refused(&status),
                            });
                        }
                    };
                    if std::mem::take(&mut self.relisted) {
                        self.stream = Some(stream);
                        return Ok(Change::Relisted);
                    }
                    self.stream.insert(stream)
                }
            };
            match stream.message().await {
                Ok(Some(event)) => {
                    if event.resource_version > 0 {
                        self.request.resource_version = event.resource_version;
                    }
                    let Some(object) = event.object else {
                        return Ok(Change::Synced);
                    };
                    let object: Value = serde_json::from_str(&object.json)
                        .context("the controller sent an unreadable object")?;
                    return Ok(Change::Object {
                        object,
                        deleted: event.r#type == "DELETED",
                    });
                }
                // Fell behind, or too old to resume: start again from what there is.
                Err(status) if status.code() == tonic::Code::OutOfRange => {
                    self.request.resource_version = 0;
                    self.stream = None;
                    self.relisted = true;
                }
                // The controller stopped or stepped down: on to the next leader.
                Ok(None) if self.reconnect.is_some() => self.reconnect().await?,
                Err(status) if self.reconnect.is_some() && is_failover(&status) => {
                    self.reconnect().await?;
                }
                Ok(None) => anyhow::bail!("the controller ended the watch"),
                Err(status) => return Err(refused(&status)),
            }
        }
    }
}
