//! `rigger-controller`: the controller daemon.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rigger_controller::config::{ControllerArgs, ControllerConfig};

#[derive(Debug, Parser)]
#[command(
    name = "rigger-controller",
    version,
    about = "Rigger's controller: dispatches work to node agents"
)]
struct Cli {
    #[command(flatten)]
    args: ControllerArgs,
}

fn main() -> ExitCode {
    let cli = match rigger_daemon::cli::parse_args::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let config = match ControllerConfig::resolve(&cli.args) {
        Ok(config) => config,
        Err(e) => return rigger_daemon::cli::refuse_config("rigger-controller", &e),
    };
    if let Err(e) = rigger_daemon::logging::init(config.log_format, &config.log_level) {
        return rigger_daemon::cli::refuse_config("rigger-controller", &e);
    }
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
            eprintln!("rigger-controller: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
