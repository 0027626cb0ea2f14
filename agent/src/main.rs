//! The `rigger-agent` command: `status` (node inventory) and `run` (the daemon).

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use rigger_agent::config::{AgentConfig, RunArgs};
use rigger_agent::inventory::{self, InventoryOptions};
use rigger_agent::render::{self, OutputFormat};
use rigger_pull::media::Platform;
use rigger_pull::registry::hosts::DEFAULT_HOSTS_DIR;
use rigger_pull::{DEFAULT_MAX_CONNECTIONS, Progress, PullOptions, Puller};
use rigger_runtime::{
    CRI_NAMESPACE, Connection, DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONTAINERD_ADDRESS, Runtime,
};

#[derive(Debug, Parser)]
#[command(
    name = "rigger-agent",
    version = rigger_version::LONG,
    about = "Rigger's node agent for containerd nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show what this node has: runtime versions, images, pods, containers, resources.
    Status(StatusArgs),
    /// Pull images into containerd (faster than containerd's own pull, same result).
    Pull(PullArgs),
    /// Run the agent daemon.
    Run(Box<RunArgs>),
    /// Print the reference of `run`'s configuration (Markdown): every key of the file
    /// with its flag, environment variable and meaning.
    ConfigReference,
    #[command(flatten)]
    Docs(rigger_daemon::cli::DocsCommand),
}

#[derive(Debug, clap::Args)]
struct PullArgs {
    /// containerd's gRPC socket.
    #[arg(long, env = "RIGGER_CONTAINERD_ADDRESS", default_value = DEFAULT_CONTAINERD_ADDRESS, value_name = "SOCK")]
    address: PathBuf,
    /// containerd namespace (kubelet and CRI use k8s.io).
    #[arg(long, short = 'n', default_value = CRI_NAMESPACE, value_name = "NS")]
    namespace: String,
    /// Use plain HTTP for registries without a hosts.toml.
    #[arg(long)]
    plain_http: bool,
    /// containerd's certs.d directory of hosts.toml files (mirrors, per-host settings).
    #[arg(long, env = "RIGGER_AGENT_REGISTRY_CONFIG", default_value = DEFAULT_HOSTS_DIR, value_name = "DIR")]
    registry_config: PathBuf,
    /// Platform to pull from multi-platform images [default: this machine's].
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    platform: Option<String>,
    /// Connections open at once, across all layers and images.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    max_connections: usize,
    /// Bandwidth cap for all downloads together, e.g. 50MiB or 1000000 (bytes/s).
    #[arg(long, value_name = "BYTES_PER_S")]
    limit_rate: Option<String>,
    /// docker config.json with registry credentials [default: $DOCKER_CONFIG or ~/.docker].
    #[arg(long, value_name = "PATH")]
    docker_config: Option<PathBuf>,
    /// A transfer that receives nothing for this long is retried, e.g. 30s.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    stall_timeout: Option<std::time::Duration>,
    /// Snapshotter to unpack into.
    #[arg(long, default_value = "overlayfs", value_name = "NAME")]
    snapshotter: String,
    /// Largest manifest, index or image config read from a registry, e.g. 16MiB;
    /// bigger ones are refused as they stream.
    #[arg(long, default_value = "8MiB", value_name = "BYTES")]
    max_document_size: bytesize::ByteSize,
    /// A pull that would take the image filesystem past this percent used is refused
    /// before it downloads (kubelet's `imageGCHighThresholdPercent`); 100: only what
    /// does not fit at all.
    #[arg(
        long,
        env = "RIGGER_AGENT_IMAGE_FS_THRESHOLD_PERCENT",
        default_value_t = rigger_pull::disk_guard::DEFAULT_THRESHOLD_PERCENT,
        value_parser = clap::value_parser!(u8).range(1..=100),
        value_name = "PERCENT"
    )]
    image_fs_threshold_percent: u8,
    /// Every byte through containerd's Content.Write, none written straight into its
    /// content store (what big blobs are, when this process sees the store as
    /// containerd does: half containerd's CPU in a pull).
    #[arg(long, env = "RIGGER_AGENT_THROUGH_CONTENT_API")]
    through_content_api: bool,
    /// The agent's state directory; downloads in progress wait in its `spool/`, so a
    /// pull that is interrupted and run again continues where it stopped.
    #[arg(long, env = "RIGGER_AGENT_STATE_DIR", default_value = rigger_agent::DEFAULT_STATE_DIR, value_name = "DIR")]
    state_dir: PathBuf,
    /// Images to pull, e.g. docker.io/library/nginx:1.27 or registry:5000/app@sha256:...
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    /// containerd's gRPC socket.
    #[arg(long, env = "RIGGER_CONTAINERD_ADDRESS", default_value = DEFAULT_CONTAINERD_ADDRESS, value_name = "SOCK")]
    address: PathBuf,
    /// Only this containerd namespace (default: all).
    #[arg(long, short = 'n', value_name = "NS")]
    namespace: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    output: OutputFormat,
    /// Do not measure the disk used under containerd's root (faster on big nodes).
    #[arg(long)]
    no_disk_usage: bool,
}

fn main() -> ExitCode {
    let cli = match rigger_daemon::cli::parse_args::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        Command::Status(args) => report(status(&args)),
        Command::Pull(args) => report(pull(&args)),
        Command::Run(args) => run(&args),
        Command::ConfigReference => config_reference(),
        Command::Docs(docs) => docs.print(<Cli as clap::CommandFactory>::command()),
    }
}

fn config_reference() -> ExitCode {
    let cli = <Cli as clap::CommandFactory>::command();
    let Some(run) = cli.find_subcommand("run") else {
        eprintln!("rigger-agent: error: no `run` command to describe");
        return ExitCode::FAILURE;
    };
    rigger_daemon::cli::print_config_reference(
        run,
        "rigger-agent run",
        "/etc/rigger/agent.toml",
        rigger_agent::config::NOT_CONFIG_KEYS,
    )
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            rigger_daemon::cli::print_error("rigger-agent", &format_args!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn status(args: &StatusArgs) -> anyhow::Result<()> {
    // Quiet by default: the inventory is the output; RUST_LOG turns on diagnostics.
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned());
    let _ = rigger_daemon::logging::init(rigger_daemon::logging::LogFormat::Text, &filter);
    runtime()?.block_on(async {
        let rt = Runtime::connect(&args.address, DEFAULT_CONNECT_TIMEOUT).await?;
        let options = InventoryOptions {
            namespace: args.namespace.clone(),
            skip_disk_usage: args.no_disk_usage,
        };
        let inventory = inventory::collect(&rt, &options).await?;
        let text = render::render(&inventory, args.output)?;
        print!("{text}");
        Ok(())
    })
}

fn pull(args: &PullArgs) -> anyhow::Result<()> {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned());
    let _ = rigger_daemon::logging::init(rigger_daemon::logging::LogFormat::Text, &filter);
    let platform = match &args.platform {
        Some(p) => Platform::parse(p).map_err(|e| anyhow::anyhow!("--platform: {e}"))?,
        None => Platform::host(),
    };
    let limit_rate = match &args.limit_rate {
        None => None,
        Some(text) => {
            let rate = text
                .parse::<bytesize::ByteSize>()
                .map_err(|e| anyhow::anyhow!("--limit-rate {text:?}: {e}"))?
                .as_u64();
            anyhow::ensure!(rate > 0, "--limit-rate must be more than 0");
            Some(rate)
        }
    };
    anyhow::ensure!(
        args.max_connections > 0,
        "--max-connections must be at least 1"
    );
    anyhow::ensure!(
        rigger_pull::registry::MAX_DOCUMENT_SIZE_RANGE.contains(&args.max_document_size.as_u64()),
        "--max-document-size must be between 64KiB and 1GiB"
    );
    let options = PullOptions {
        namespace: args.namespace.clone(),
        snapshotter: args.snapshotter.clone(),
        platform,
        hosts_dir: args.registry_config.clone(),
        spool_dir: args.state_dir.join("spool"),
        plain_http: args.plain_http,
        docker_config: args.docker_config.clone(),
        max_connections: args.max_connections,
        limit_rate,
        stall_timeout: args
            .stall_timeout
            .unwrap_or(rigger_pull::registry::DEFAULT_STALL_TIMEOUT),
        max_document_size: args.max_document_size.as_u64(),
        image_fs_threshold_percent: Some(args.image_fs_threshold_percent),
        write_content_directly: !args.through_content_api,
        ..PullOptions::default()
    };
    let progress: std::sync::Arc<dyn Progress> = if std::io::stderr().is_terminal() {
        std::sync::Arc::new(rigger_agent::progress::TerminalProgress::new())
    } else {
        std::sync::Arc::new(rigger_agent::progress::LineProgress::new(
            std::time::Duration::from_secs(2),
        ))
    };
    runtime()?.block_on(async {
        // Checked before anything is fetched: without containerd nothing can land.
        let connection = Connection::new(&args.address, DEFAULT_CONNECT_TIMEOUT);
        connection.runtime().await?;
        let puller = Puller::new(std::sync::Arc::new(connection), options);
        let pulls = args.images.iter().map(|image| {
            let puller = puller.clone();
            let progress = progress.clone();
            async move { puller.pull(image, progress).await }
        });
        let results = futures::future::join_all(pulls).await;
        let mut failed = Vec::new();
        for result in results {
            match result {
                Ok(image) => println!("{} {}", image.name, image.digest),
                Err(e) => failed.push(e.to_string()),
            }
        }
        match failed.len() {
            0 => Ok(()),
            1 => Err(anyhow::anyhow!("{}", failed[0])),
            n => Err(anyhow::anyhow!("{n} images failed: {}", failed.join("; "))),
        }
    })
}

fn run(args: &RunArgs) -> ExitCode {
    // Everything is validated before anything binds or connects.
    let config = match AgentConfig::resolve(args) {
        Ok(config) => config,
        Err(e) => return rigger_daemon::cli::refuse_config("rigger-agent", &e),
    };
    if args.check_config {
        println!("rigger-agent: configuration is valid");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = rigger_daemon::logging::init(config.log_format, &config.log_level) {
        return rigger_daemon::cli::refuse_config("rigger-agent", &e);
    }
    rigger_daemon::limits::raise_and_log_open_files_limit();
    report(runtime().and_then(|rt| {
        rt.block_on(async {
            let stop =
                rigger_daemon::shutdown::stop_signal().context("cannot install signal handlers")?;
            let stop = async move {
                let signal = stop.await;
                tracing::info!(%signal, "stop requested");
            };
            rigger_agent::service::run(config, stop).await?;
            Ok(())
        })
    }))
}
