//! The `rigger-agent` command: `status` (node inventory) and `run` (the daemon).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use rigger_agent::config::{AgentConfig, RunArgs};
use rigger_agent::inventory::{self, InventoryOptions};
use rigger_agent::render::{self, OutputFormat};
use rigger_agent::runtime::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONTAINERD_ADDRESS, Runtime};

#[derive(Debug, Parser)]
#[command(
    name = "rigger-agent",
    version,
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
    /// Run the agent daemon.
    Run(RunArgs),
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
        Command::Run(args) => run(&args),
    }
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rigger-agent: error: {e:#}");
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

fn run(args: &RunArgs) -> ExitCode {
    // Everything is validated before anything binds or connects.
    let config = match AgentConfig::resolve(args) {
        Ok(config) => config,
        Err(e) => return rigger_daemon::cli::refuse_config("rigger-agent", &e),
    };
    if let Err(e) = rigger_daemon::logging::init(config.log_format, &config.log_level) {
        return rigger_daemon::cli::refuse_config("rigger-agent", &e);
    }
    report(runtime().and_then(|rt| {
        rt.block_on(async {
            let stop =
                rigger_daemon::shutdown::stop_signal().context("cannot install signal handlers")?;
            let stop = async move {
                let signal = stop.await;
                tracing::info!(%signal, "stop requested");
            };
            rigger_agent::daemon::run(config, stop).await?;
            Ok(())
        })
    }))
}
