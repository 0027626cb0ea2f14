//! `riggerctl`: the command line for Rigger's controller, in kubectl's habits.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use comfy_table::{Table, presets};
use rigger_controller::rate_limit::WaitOutRateLimit;
use rigger_proto::v1::control_client::ControlClient;
use rigger_proto::v1::{
    ApplyRequest, DeleteRequest, GetRequest, ListRequest, PodExecRequest, PodLogsRequest,
};
use serde_json::Value;
use tonic::transport::Channel;

mod label;

#[derive(Debug, Parser)]
#[command(name = "riggerctl", version, about = "Talk to a Rigger controller")]
struct Cli {
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
    /// Namespace of namespaced objects.
    #[arg(long, short = 'n', global = true, default_value = "default")]
    namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or update objects from YAML (or JSON); `-` reads standard input. Every
    /// document is checked first: if one is refused, none is applied.
    Apply {
        #[arg(long, short = 'f', value_name = "FILE")]
        filename: PathBuf,
        /// Check only; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show objects: one by name, or all of a kind.
    Get {
        /// imagepulljob (ipj), containerrecreaterequest (crr), pod (po), node (no), secret.
        kind: String,
        name: Option<String>,
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Keep watching and print changes.
        #[arg(long, short = 'w')]
        watch: bool,
        /// List across all namespaces.
        #[arg(long, short = 'A')]
        all_namespaces: bool,
    },
    /// Show one object in detail (for jobs: every node's pull).
    Describe { kind: String, name: String },
    /// Delete an object.
    Delete { kind: String, name: String },
    /// Set (`KEY=VALUE`) or remove (`KEY-`) labels an admin keeps on a node: the labels
    /// jobs with pull secrets choose nodes by, and the only way to set a reserved prefix
    /// (`node-restriction.rigger.dev/`).
    Label {
        /// node (no).
        kind: String,
        name: String,
        #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
        labels: Vec<String>,
        /// Replace a value that is already there.
        #[arg(long)]
        overwrite: bool,
    },
    /// Print a pod's container log (the current attempt's).
    Logs {
        pod: String,
        #[arg(long, short = 'c')]
        container: Option<String>,
        /// Only the last N lines.
        #[arg(long, default_value_t = 0)]
        tail: u32,
        /// Keep printing new lines (asks the agent again every second).
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Run a command in a pod's container (not interactive): `exec POD -- CMD ARGS...`.
    Exec {
        pod: String,
        #[arg(long, short = 'c')]
        container: Option<String>,
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        timeout: Duration,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Change objects in place: `set image pod/NAME CONTAINER=IMAGE...`.
    Set {
        #[command(subcommand)]
        what: SetCommand,
    },
    /// Restart containers of a pod in place: creates a ContainerRecreateRequest.
    Recreate {
        pod: String,
        /// A container to recreate (repeat for several).
        #[arg(long = "container", short = 'c', required = true, value_name = "NAME")]
        containers: Vec<String>,
        /// One container after the other, each once the previous one is back.
        #[arg(long)]
        ordered: bool,
        /// Grace period for preStop and stop [default: the pod's].
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        grace: Option<Duration>,
        /// Fail the request if it is not done after this long.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        deadline: Option<Duration>,
        /// The request's name [default: POD-recreate-<time>].
        #[arg(long)]
        name: Option<String>,
        /// Show each container's progress until the request completes; exit 1 if one failed.
        #[arg(long)]
        wait: bool,
    },
    #[command(flatten)]
    Docs(rigger_daemon::cli::DocsCommand),
    /// Wait until an object has a condition, e.g. `--for=condition=Complete`.
    Wait {
        /// KIND/NAME, e.g. imagepulljob/warm-nginx.
        object: String,
        #[arg(long = "for", value_name = "condition=NAME")]
        condition: String,
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
}

#[derive(Debug, Subcommand)]
enum SetCommand {
    /// New images for a pod's containers, updated in place (same sandbox and volumes).
    Image {
        /// pod/NAME
        object: String,
        /// CONTAINER=IMAGE, one or more.
        #[arg(required = true)]
        images: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

fn main() -> ExitCode {
    let cli = match rigger_daemon::cli::parse_args::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // Completions and the man page need no controller.
    if let Command::Docs(docs) = &cli.command {
        return docs.print(<Cli as clap::CommandFactory>::command());
    }
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| rt.block_on(run(cli)));
    match result {
        Ok(0) => ExitCode::SUCCESS,
        // `exec` passes on the command's exit status.
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("riggerctl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
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
struct BearerToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

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

type Client = ControlClient<
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

async fn connect(cli: &Cli) -> anyhow::Result<Client> {
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
    // Several servers: replicas of an HA controller; the leader answers, followers say
    // "not the leader" and the next one is tried.
    let mut errors: Vec<String> = Vec::new();
    for server in servers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let mut client = match connect_one(server, ca_file.as_deref(), token.clone()).await {
            Ok(client) => client,
            Err(e) => {
                errors.push(format!("{e:#}"));
                continue;
            }
        };
        match client
            .list(ListRequest {
                kind: "Node".to_owned(),
                namespace: String::new(),
            })
            .await
        {
            Ok(_) => return Ok(client),
            // A follower, or a replica on its way down: the next one may lead.
            Err(status) if status.code() == tonic::Code::Unavailable => {
                errors.push(format!("{server}: {}", status.message()));
            }
            Err(status) => return Err(refused(&status)),
        }
    }
    match errors.as_slice() {
        [] => Err(anyhow::anyhow!("--server names no controller")),
        [one] => Err(anyhow::anyhow!("{one}")),
        all => Err(anyhow::anyhow!(
            "no controller answered: {}",
            all.join("; ")
        )),
    }
}

async fn connect_one(
    server: &str,
    ca_file: Option<&std::path::Path>,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
) -> anyhow::Result<Client> {
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
    let channel = endpoint.connect().await.map_err(|e| {
        anyhow::anyhow!(
            "cannot reach the controller at {server}: {}",
            rigger_daemon::error_chain(&e)
        )
    })?;
    // A list of thousands of nodes, or a job's status over them, is tens of MiB.
    let channel = WaitOutRateLimit::new(channel, RATE_LIMIT_PATIENCE, say_rate_limited);
    Ok(ControlClient::with_interceptor(channel, BearerToken(token))
        .max_decoding_message_size(MAX_RESPONSE))
}

/// The controller's refusal as one line.
fn refused(status: &tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", status.message())
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let mut client = connect(&cli).await?;
    if let Command::Exec {
        pod,
        container,
        timeout,
        command,
    } = &cli.command
    {
        let output = client
            .exec(PodExecRequest {
                namespace: cli.namespace.clone(),
                name: pod.clone(),
                container: container.clone().unwrap_or_default(),
                command: command.clone(),
                timeout_seconds: u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX),
            })
            .await
            .map_err(|s| refused(&s))?
            .into_inner();
        use std::io::Write as _;
        std::io::stdout().write_all(&output.stdout)?;
        std::io::stderr().write_all(&output.stderr)?;
        return Ok(output.exit_code);
    }
    run_command(cli, &mut client).await.map(|()| 0)
}

async fn run_command(cli: Cli, client: &mut Client) -> anyhow::Result<()> {
    match cli.command {
        Command::Apply { filename, dry_run } => apply(client, &filename, dry_run).await,
        Command::Get {
            kind,
            name,
            output,
            watch,
            all_namespaces,
        } => {
            let namespace = if all_namespaces { "" } else { &cli.namespace };
            get(client, &kind, name.as_deref(), namespace, output, watch).await
        }
        Command::Describe { kind, name } => {
            let object = fetch(client, &kind, &cli.namespace, &name).await?;
            print!("{}", describe(&object));
            Ok(())
        }
        Command::Delete { kind, name } => {
            client
                .delete(DeleteRequest {
                    kind: kind.clone(),
                    namespace: cli.namespace.clone(),
                    name: name.clone(),
                })
                .await
                .map_err(|s| refused(&s))?;
            println!("{} \"{name}\" deleted", kind.to_ascii_lowercase());
            Ok(())
        }
        Command::Label {
            kind,
            name,
            labels,
            overwrite,
        } => label::run(client, &kind, &name, &labels, overwrite).await,
        Command::Wait {
            object,
            condition,
            timeout,
        } => wait(client, &cli.namespace, &object, &condition, timeout).await,
        Command::Logs {
            pod,
            container,
            tail,
            follow,
        } => {
            use std::io::Write as _;
            let request = |tail_lines| PodLogsRequest {
                namespace: cli.namespace.clone(),
                name: pod.clone(),
                container: container.clone().unwrap_or_default(),
                tail_lines,
            };
            let output = client
                .logs(request(tail))
                .await
                .map_err(|s| refused(&s))?
                .into_inner();
            std::io::stdout().write_all(&output.stdout)?;
            if !follow {
                return Ok(());
            }
            // Following: the whole log is asked for again each second and only lines
            // beyond what was seen are printed (a restarted container starts over).
            let mut seen = client
                .logs(request(0))
                .await
                .map_err(|s| refused(&s))?
                .into_inner()
                .stdout;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = client
                    .logs(request(0))
                    .await
                    .map_err(|s| refused(&s))?
                    .into_inner()
                    .stdout;
                let new = if now.starts_with(&seen) {
                    &now[seen.len()..]
                } else {
                    &now[..]
                };
                std::io::stdout().write_all(new)?;
                std::io::stdout().flush()?;
                seen = now;
            }
        }
        Command::Recreate {
            pod,
            containers,
            ordered,
            grace,
            deadline,
            name,
            wait,
        } => {
            let recreate = Recreate {
                pod,
                containers,
                ordered,
                grace,
                deadline,
                name,
            };
            run_recreate(client, &cli.namespace, recreate, wait).await
        }
        Command::Set {
            what: SetCommand::Image { object, images },
        } => set_image(client, &cli.namespace, &object, &images).await,
        Command::Exec { .. } | Command::Docs(_) => Ok(()),
    }
}

/// `set image pod/NAME C=IMAGE...`: the pod as stored, with new images, applied again.
async fn set_image(
    client: &mut Client,
    namespace: &str,
    object: &str,
    images: &[String],
) -> anyhow::Result<()> {
    let name = object
        .split_once('/')
        .filter(|(kind, name)| matches!(*kind, "pod" | "pods" | "po") && !name.is_empty())
        .map(|(_, name)| name)
        .ok_or_else(|| anyhow::anyhow!("{object:?}: expected pod/NAME"))?;
    let mut pod = fetch(client, "pod", namespace, name).await?;
    if let Some(pod) = pod.as_object_mut() {
        pod.remove("status");
    }
    if let Some(labels) = pod
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove("lifecycle.rigger.dev/state");
    }
    for assignment in images {
        let (container, image) = assignment
            .split_once('=')
            .filter(|(c, i)| !c.is_empty() && !i.is_empty())
            .ok_or_else(|| anyhow::anyhow!("{assignment:?}: expected CONTAINER=IMAGE"))?;
        let target = pod
            .pointer_mut("/spec/containers")
            .and_then(Value::as_array_mut)
            .and_then(|cs| cs.iter_mut().find(|c| c["name"] == container))
            .ok_or_else(|| anyhow::anyhow!("pod {name} has no container {container:?}"))?;
        target["image"] = image.into();
    }
    let response = client
        .apply(ApplyRequest {
            json: pod.to_string(),
            dry_run: false,
        })
        .await
        .map_err(|s| refused(&s))?
        .into_inner();
    println!("pod/{name} image updated ({})", response.outcome);
    Ok(())
}

/// What `riggerctl recreate` asks for.
#[derive(Debug)]
struct Recreate {
    pod: String,
    containers: Vec<String>,
    ordered: bool,
    grace: Option<Duration>,
    deadline: Option<Duration>,
    name: Option<String>,
}

impl Recreate {
    fn object(&self, namespace: &str) -> Value {
        let name = self.name.clone().unwrap_or_else(|| {
            let now = SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!(
                "{}-recreate-{}{:03}",
                self.pod,
                now.as_secs(),
                now.subsec_millis()
            )
        });
        let mut strategy = serde_json::json!({"orderedRecreate": self.ordered});
        if let Some(grace) = self.grace {
            strategy["terminationGracePeriodSeconds"] = grace.as_secs().into();
        }
        let mut spec = serde_json::json!({
            "podName": self.pod,
            "containers": self.containers.iter().map(|c| serde_json::json!({"name": c})).collect::<Vec<_>>(),
            "strategy": strategy,
        });
        if let Some(deadline) = self.deadline {
            spec["activeDeadlineSeconds"] = deadline.as_secs().into();
        }
        serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "ContainerRecreateRequest",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        })
    }
}

async fn run_recreate(
    client: &mut Client,
    namespace: &str,
    recreate: Recreate,
    wait: bool,
) -> anyhow::Result<()> {
    let object = recreate.object(namespace);
    let name = str_of(&object, "/metadata/name").to_owned();
    client
        .apply(ApplyRequest {
            json: object.to_string(),
            dry_run: false,
        })
        .await
        .map_err(|s| refused(&s))?;
    println!("containerrecreaterequest.apps.kruise.io/{name} created");
    if !wait {
        return Ok(());
    }
    // One line per change of a container's phase, until the request completes.
    let mut shown: HashMap<String, String> = HashMap::new();
    loop {
        let current = fetch(client, "crr", namespace, &name).await?;
        let states = current
            .pointer("/status/containerRecreateStates")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for state in &states {
            let container = str_of(state, "/name");
            let mut line = str_of(state, "/phase").to_owned();
            if state["isKilled"] == true {
                line.push_str(" (old container stopped)");
            }
            let message = str_of(state, "/message");
            if !message.is_empty() {
                line.push_str(&format!(": {message}"));
            }
            if shown.get(container) != Some(&line) {
                println!("  {container}: {line}");
                shown.insert(container.to_owned(), line);
            }
        }
        if str_of(&current, "/status/phase") == "Completed" {
            let failed = states.iter().any(|s| str_of(s, "/phase") == "Failed");
            let message = str_of(&current, "/status/message");
            if failed {
                anyhow::bail!(
                    "recreate {name} completed with failed containers{}",
                    if message.is_empty() {
                        String::new()
                    } else {
                        format!(": {message}")
                    }
                );
            }
            println!("recreate {name} completed");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Every document of a YAML stream, as JSON values; empty documents skipped.
fn documents(text: &str, source: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value: Value = serde::Deserialize::deserialize(document)
            .map_err(|e| anyhow::anyhow!("{source}: document {}: {e}", i + 1))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    if out.is_empty() {
        anyhow::bail!("{source}: no objects");
    }
    Ok(out)
}

async fn apply(client: &mut Client, filename: &PathBuf, dry_run: bool) -> anyhow::Result<()> {
    let (text, source) = if filename.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read standard input")?;
        (text, "<stdin>".to_owned())
    } else {
        let text = std::fs::read_to_string(filename)
            .with_context(|| format!("cannot read {}", filename.display()))?;
        (text, filename.display().to_string())
    };
    let objects = documents(&text, &source)?;
    // All or nothing: every document passes a dry run before any is applied.
    for object in &objects {
        client
            .apply(ApplyRequest {
                json: object.to_string(),
                dry_run: true,
            })
            .await
            .map_err(|s| refused(&s))?;
    }
    if dry_run {
        for object in &objects {
            println!("{} (dry run)", display_name(object));
        }
        return Ok(());
    }
    for object in &objects {
        let response = client
            .apply(ApplyRequest {
                json: object.to_string(),
                dry_run: false,
            })
            .await
            .map_err(|s| refused(&s))?
            .into_inner();
        println!("{} {}", display_name(object), response.outcome);
    }
    Ok(())
}

/// `imagepulljob.rigger.dev/warm`, as kubectl names objects.
fn display_name(object: &Value) -> String {
    let kind = object["kind"]
        .as_str()
        .unwrap_or("object")
        .to_ascii_lowercase();
    let group = object["apiVersion"]
        .as_str()
        .and_then(|v| v.split_once('/'))
        .map(|(group, _)| format!(".{group}"))
        .unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or("");
    format!("{kind}{group}/{name}")
}

async fn fetch(
    client: &mut Client,
    kind: &str,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Value> {
    let object = client
        .get(GetRequest {
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
        .await
        .map_err(|s| refused(&s))?
        .into_inner();
    serde_json::from_str(&object.json).context("the controller sent an unreadable object")
}

async fn fetch_all(client: &mut Client, kind: &str, namespace: &str) -> anyhow::Result<Vec<Value>> {
    let list = client
        .list(ListRequest {
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
        })
        .await
        .map_err(|s| refused(&s))?
        .into_inner();
    list.items
        .iter()
        .map(|o| serde_json::from_str(&o.json).context("the controller sent an unreadable object"))
        .collect()
}

async fn get(
    client: &mut Client,
    kind: &str,
    name: Option<&str>,
    namespace: &str,
    output: Output,
    watch: bool,
) -> anyhow::Result<()> {
    let mut printed_header = false;
    let mut last: Vec<String> = Vec::new();
    loop {
        let objects = match name {
            Some(name) => vec![fetch(client, kind, namespace, name).await?],
            None => fetch_all(client, kind, namespace).await?,
        };
        match output {
            Output::Json | Output::Yaml => {
                let value = match (name, objects.as_slice()) {
                    (Some(_), [one]) => one.clone(),
                    _ => serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects}),
                };
                let text = if output == Output::Json {
                    format!("{}\n", serde_json::to_string_pretty(&value)?)
                } else {
                    serde_yaml_ng::to_string(&value)?
                };
                if last.first() != Some(&text) {
                    if watch && !last.is_empty() && output == Output::Yaml {
                        println!("---");
                    }
                    print!("{text}");
                    last = vec![text];
                }
            }
            Output::Table | Output::Wide => {
                let all_namespaces = namespace.is_empty();
                let (header, rows) = table_rows(&objects, output == Output::Wide, all_namespaces);
                if !watch {
                    if rows.is_empty() {
                        eprintln!("No resources found.");
                    } else {
                        print_table(&header, &rows, true);
                    }
                    return Ok(());
                }
                // Watching: the header once, then each row whenever it changes.
                let lines: Vec<String> = render_table(&header, &rows);
                if !printed_header {
                    println!("{}", lines[0]);
                    printed_header = true;
                }
                for line in &lines[1..] {
                    if !last.contains(line) {
                        println!("{line}");
                    }
                }
                last = lines;
            }
        }
        if !watch {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn str_of<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn num_of(value: &Value, pointer: &str) -> u64 {
    value.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

/// kubectl-style age of an RFC 3339 time: `5s`, `3m`, `2h`, `4d`.
fn age(rfc3339: &str) -> String {
    let Ok(then) = humantime::parse_rfc3339(rfc3339) else {
        return "-".to_owned();
    };
    let secs = SystemTime::now()
        .duration_since(then)
        .unwrap_or_default()
        .as_secs();
    match secs {
        0..120 => format!("{secs}s"),
        120..7200 => format!("{}m", secs / 60),
        7200..172_800 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

fn bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec_short().to_string()
}

fn table_rows(
    objects: &[Value],
    wide: bool,
    all_namespaces: bool,
) -> (Vec<String>, Vec<Vec<String>>) {
    let kind = objects
        .first()
        .map(|o| str_of(o, "/kind").to_owned())
        .unwrap_or_default();
    let mut header: Vec<&str> = Vec::new();
    if all_namespaces && kind != "Node" {
        header.push("NAMESPACE");
    }
    let mut rows = Vec::new();
    match kind.as_str() {
        "ImagePullJob" => {
            header.extend([
                "NAME",
                "TOTAL",
                "ACTIVE",
                "SUCCEEDED",
                "FAILED",
                "PROGRESS",
                "AGE",
                "MESSAGE",
            ]);
            if wide {
                header.push("IMAGE");
            }
            for o in objects {
                let (done, total) = o
                    .pointer("/status/nodes")
                    .and_then(Value::as_array)
                    .map(|nodes| {
                        nodes.iter().fold((0, 0), |(d, t), n| {
                            (d + num_of(n, "/bytesDone"), t + num_of(n, "/bytesTotal"))
                        })
                    })
                    .unwrap_or((0, 0));
                let progress = if total == 0 {
                    "-".to_owned()
                } else {
                    format!("{}/{}", bytes(done), bytes(total))
                };
                let mut row = Vec::new();
                if all_namespaces {
                    row.push(str_of(o, "/metadata/namespace").to_owned());
                }
                row.extend([
                    str_of(o, "/metadata/name").to_owned(),
                    num_of(o, "/status/desired").to_string(),
                    num_of(o, "/status/active").to_string(),
                    num_of(o, "/status/succeeded").to_string(),
                    num_of(o, "/status/failed").to_string(),
                    progress,
                    age(str_of(o, "/metadata/creationTimestamp")),
                    str_of(o, "/status/message").to_owned(),
                ]);
                if wide {
                    row.push(str_of(o, "/spec/image").to_owned());
                }
                rows.push(row);
            }
        }
        "Node" => {
            header.extend([
                "NAME",
                "STATUS",
                "AGENT",
                "CONTAINERD",
                "IMAGES",
                "PODS",
                "LAST HEARTBEAT",
            ]);
            if wide {
                header.extend(["LABELS", "REASON"]);
            }
            for o in objects {
                let ready = str_of(o, "/status/conditions/0/status") == "True";
                let mut row = vec![
                    str_of(o, "/metadata/name").to_owned(),
                    if ready { "Ready" } else { "NotReady" }.to_owned(),
                    str_of(o, "/status/nodeInfo/agentVersion").to_owned(),
                    str_of(o, "/status/nodeInfo/containerRuntimeVersion")
                        .trim_start_matches("containerd://")
                        .to_owned(),
                    o.pointer("/status/images")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len)
                        .to_string(),
                    num_of(o, "/status/pods").to_string(),
                    format!(
                        "{} ago",
                        age(str_of(o, "/status/conditions/0/lastHeartbeatTime"))
                    ),
                ];
                if wide {
                    let labels = o
                        .pointer("/metadata/labels")
                        .and_then(Value::as_object)
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default();
                    row.push(labels);
                    row.push(str_of(o, "/status/conditions/0/message").to_owned());
                }
                rows.push(row);
            }
        }
        "SidecarSet" => {
            header.extend(["NAME", "MATCHED", "UPDATED", "READY", "AGE"]);
            for o in objects {
                rows.push(vec![
                    str_of(o, "/metadata/name").to_owned(),
                    num_of(o, "/status/matchedPods").to_string(),
                    num_of(o, "/status/updatedPods").to_string(),
                    num_of(o, "/status/readyPods").to_string(),
                    age(str_of(o, "/metadata/creationTimestamp")),
                ]);
            }
        }
        "ContainerRecreateRequest" => {
            header.extend(["NAME", "POD", "PHASE", "CONTAINERS", "AGE"]);
            if wide {
                header.extend(["NODE", "MESSAGE"]);
            }
            for o in objects {
                let mut row = Vec::new();
                if all_namespaces {
                    row.push(str_of(o, "/metadata/namespace").to_owned());
                }
                let phase = match str_of(o, "/status/phase") {
                    "" => "Pending",
                    phase => phase,
                };
                let containers: Vec<String> = o
                    .pointer("/status/containerRecreateStates")
                    .and_then(Value::as_array)
                    .map(|states| {
                        states
                            .iter()
                            .map(|s| format!("{}={}", str_of(s, "/name"), str_of(s, "/phase")))
                            .collect()
                    })
                    .unwrap_or_default();
                row.extend([
                    str_of(o, "/metadata/name").to_owned(),
                    str_of(o, "/spec/podName").to_owned(),
                    phase.to_owned(),
                    containers.join(","),
                    age(str_of(o, "/metadata/creationTimestamp")),
                ]);
                if wide {
                    row.push(
                        str_of(o, "/metadata/labels/crr.apps.kruise.io~1node-name").to_owned(),
                    );
                    row.push(str_of(o, "/status/message").to_owned());
                }
                rows.push(row);
            }
        }
        "Pod" => {
            header.extend(["NAME", "READY", "STATUS", "RESTARTS", "LIFECYCLE", "AGE"]);
            if wide {
                header.extend(["NODE", "IMAGES", "WORKING SIDECARS"]);
            }
            for o in objects {
                let containers = o
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                let statuses = o
                    .pointer("/status/containerStatuses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let ready = statuses.iter().filter(|c| c["ready"] == true).count();
                let restarts: u64 = statuses.iter().map(|c| num_of(c, "/restartCount")).sum();
                let phase = match str_of(o, "/status/phase") {
                    "" => "Pending",
                    phase => phase,
                };
                let mut row = Vec::new();
                if all_namespaces {
                    row.push(str_of(o, "/metadata/namespace").to_owned());
                }
                row.extend([
                    str_of(o, "/metadata/name").to_owned(),
                    format!("{ready}/{containers}"),
                    phase.to_owned(),
                    restarts.to_string(),
                    match str_of(o, "/metadata/labels/lifecycle.rigger.dev~1state") {
                        "" => "-".to_owned(),
                        state => state.to_owned(),
                    },
                    age(str_of(o, "/metadata/creationTimestamp")),
                ]);
                if wide {
                    row.push(str_of(o, "/spec/nodeName").to_owned());
                    let images: Vec<&str> = o
                        .pointer("/spec/containers")
                        .and_then(Value::as_array)
                        .map(|cs| cs.iter().map(|c| str_of(c, "/image")).collect())
                        .unwrap_or_default();
                    row.push(images.join(","));
                    // Hot-upgrade sidecars: which slot serves (Kruise's annotation).
                    let working: std::collections::BTreeMap<String, String> = o
                        .pointer("/metadata/annotations/kruise.io~1sidecarset-working-hotupgrade-container")
                        .and_then(Value::as_str)
                        .and_then(|w| serde_json::from_str(w).ok())
                        .unwrap_or_default();
                    row.push(if working.is_empty() {
                        "-".to_owned()
                    } else {
                        working.into_values().collect::<Vec<_>>().join(",")
                    });
                }
                rows.push(row);
            }
        }
        _ => {
            header.extend(["NAME", "TYPE", "DATA", "AGE"]);
            for o in objects {
                let mut row = Vec::new();
                if all_namespaces {
                    row.push(str_of(o, "/metadata/namespace").to_owned());
                }
                row.extend([
                    str_of(o, "/metadata/name").to_owned(),
                    str_of(o, "/type").to_owned(),
                    o.pointer("/data")
                        .and_then(Value::as_object)
                        .map_or(0, serde_json::Map::len)
                        .to_string(),
                    age(str_of(o, "/metadata/creationTimestamp")),
                ]);
                rows.push(row);
            }
        }
    }
    (header.into_iter().map(str::to_owned).collect(), rows)
}

fn render_table(header: &[String], rows: &[Vec<String>]) -> Vec<String> {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    table.set_header(header.to_vec());
    for row in rows {
        table.add_row(row.clone());
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
        .to_string()
        .lines()
        .map(|l| l.trim_end().to_owned())
        .collect()
}

fn print_table(header: &[String], rows: &[Vec<String>], with_header: bool) {
    for (i, line) in render_table(header, rows).iter().enumerate() {
        if i > 0 || with_header {
            println!("{line}");
        }
    }
}

fn describe(object: &Value) -> String {
    let mut out = String::new();
    let mut metadata_only = object.clone();
    if let Some(status) = metadata_only
        .get_mut("status")
        .and_then(Value::as_object_mut)
    {
        status.remove("nodes");
        status.remove("containerRecreateStates");
    }
    out.push_str(&serde_yaml_ng::to_string(&metadata_only).unwrap_or_default());
    if let Some(states) = object
        .pointer("/status/containerRecreateStates")
        .and_then(Value::as_array)
    {
        out.push_str("Containers:\n");
        let header: Vec<String> = ["CONTAINER", "PHASE", "KILLED", "MESSAGE"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let rows: Vec<Vec<String>> = states
            .iter()
            .map(|c| {
                vec![
                    str_of(c, "/name").to_owned(),
                    str_of(c, "/phase").to_owned(),
                    (c["isKilled"] == true).to_string(),
                    str_of(c, "/message").to_owned(),
                ]
            })
            .collect();
        for line in render_table(&header, &rows) {
            out.push_str("  ");
            out.push_str(&line);
            out.push('\n');
        }
    }
    if let Some(nodes) = object.pointer("/status/nodes").and_then(Value::as_array) {
        out.push_str("Nodes:\n");
        let header: Vec<String> = ["NODE", "PHASE", "ATTEMPTS", "PROGRESS", "MESSAGE"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let rows: Vec<Vec<String>> = nodes
            .iter()
            .map(|n| {
                let total = num_of(n, "/bytesTotal");
                vec![
                    str_of(n, "/name").to_owned(),
                    str_of(n, "/phase").to_owned(),
                    num_of(n, "/attempts").to_string(),
                    if total == 0 {
                        "-".to_owned()
                    } else {
                        format!("{}/{}", bytes(num_of(n, "/bytesDone")), bytes(total))
                    },
                    str_of(n, "/message").to_owned(),
                ]
            })
            .collect();
        for line in render_table(&header, &rows) {
            out.push_str("  ");
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Whether `object` has condition `name` with status True.
fn has_condition(object: &Value, name: &str) -> bool {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                str_of(c, "/type").eq_ignore_ascii_case(name) && str_of(c, "/status") == "True"
            })
        })
}

async fn wait(
    client: &mut Client,
    namespace: &str,
    object: &str,
    condition: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let (kind, name) = object
        .split_once('/')
        .filter(|(k, n)| !k.is_empty() && !n.is_empty())
        .ok_or_else(|| anyhow::anyhow!("{object:?}: expected KIND/NAME, e.g. imagepulljob/warm"))?;
    let wanted = condition
        .strip_prefix("condition=")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| anyhow::anyhow!("--for {condition:?}: expected condition=NAME"))?;
    let deadline = Instant::now() + timeout;
    loop {
        let current = fetch(client, kind, namespace, name).await?;
        if has_condition(&current, wanted) {
            println!("{}/{name} condition met", kind.to_ascii_lowercase());
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "timed out after {} waiting for {wanted} on {kind}/{name} ({})",
                humantime::format_duration(timeout),
                str_of(&current, "/status/message")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
