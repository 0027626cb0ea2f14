//! `rigger-controller`: the controller daemon.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use rigger_controller::certs::{CertsRequest, create};
use rigger_controller::config::{ControllerArgs, ControllerConfig};

#[derive(Debug, Parser)]
#[command(
    name = "rigger-controller",
    version = rigger_version::LONG,
    about = "Rigger's controller: dispatches work to node agents",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: ControllerArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a CA with controller and agent certificates, user tokens and a riggerctl
    /// config, for a lab (real deployments bring their own PKI). Run again with more
    /// `--node`s to add agents under the same CA.
    Certs {
        /// Directory to write into.
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
        /// Names and IPs the controller is reached at [default: localhost, 127.0.0.1].
        #[arg(long = "host", value_name = "NAME")]
        hosts: Vec<String>,
        /// Issue an agent certificate for this node name (repeatable).
        #[arg(long = "node", value_name = "NAME")]
        nodes: Vec<String>,
    },
    /// Print the configuration reference (Markdown): every key of the file with its flag,
    /// environment variable and meaning.
    ConfigReference,
    /// Print the CustomResourceDefinitions of Rigger's kinds (YAML), generated from its
    /// types: what `deploy/kubernetes/crds.yaml` holds, for `kubectl apply -f -`.
    Crds {
        /// Only this API group's (`rigger.dev`: Rigger's own, for a cluster where
        /// Kruise's CRDs stay).
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
    },
    #[command(flatten)]
    Docs(rigger_daemon::cli::DocsCommand),
}

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = match rigger_daemon::cli::parse_args::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if let Some(Command::Docs(docs)) = &cli.command {
        return docs.print(<Cli as clap::CommandFactory>::command());
    }
    if let Some(Command::ConfigReference) = &cli.command {
        return rigger_daemon::cli::print_config_reference(
            &<Cli as clap::CommandFactory>::command(),
            "rigger-controller",
            "/etc/rigger/controller.toml",
            rigger_controller::config::NOT_CONFIG_KEYS,
        );
    }
    if let Some(Command::Crds { group }) = &cli.command {
        return match rigger_api::crd::manifests_yaml(group.as_deref()) {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "rigger-controller: error: the CustomResourceDefinitions do not render: {e}"
                );
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Certs { out, hosts, nodes }) = cli.command {
        return match create(&CertsRequest { out, hosts, nodes }) {
            Ok(written) => {
                for path in written {
                    println!("{}", path.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("rigger-controller: error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let config = match ControllerConfig::resolve(&cli.args) {
        Ok(config) => config,
        Err(e) => return rigger_daemon::cli::refuse_config("rigger-controller", &e),
    };
    if cli.args.check_config {
        println!("rigger-controller: configuration is valid");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = rigger_daemon::logging::init(config.log_format, &config.log_level) {
        return rigger_daemon::cli::refuse_config("rigger-controller", &e);
    }
    rigger_daemon::limits::raise_and_log_open_files_limit();
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            rt.block_on(async {
                let stop = rigger_daemon::shutdown::stop_signal()
                    .context("cannot install signal handlers")?;
                let stop = async move {
                    let signal = stop.await;
                    tracing::info!(%signal, "stop requested");
                };
                rigger_controller::server::run(config, stop).await?;
                Ok(())
            })
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            rigger_daemon::cli::print_error("rigger-controller", &format_args!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}
