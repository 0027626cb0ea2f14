//! `rigger-controller`: the controller daemon.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rigger_controller::config::{ControllerArgs, ControllerConfig};
use rigger_daemon::config::EXIT_BAD_CONFIG;

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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_BAD_CONFIG as u8)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let config = match ControllerConfig::resolve(&cli.args) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("rigger-controller: error: {e}");
            return ExitCode::from(EXIT_BAD_CONFIG as u8);
        }
    };
    if let Err(e) = rigger_daemon::logging::init(config.log_format, &config.log_level) {
        eprintln!("rigger-controller: error: {e}");
        return ExitCode::from(EXIT_BAD_CONFIG as u8);
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
