//! `riggerctl`: the command line for Rigger's controller, in kubectl's habits.
//!
//! [`client`] reaches the controller (leader, TLS, token, rate limit); each verb is a
//! file of [`commands`]; [`output`] prints tables, names, ages and sizes.

mod client;
mod commands;
mod manifests;
mod output;
mod rate_limit;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use self::client::ConnectArgs;
use self::commands::{
    apply, delete, describe, exec, explain, get, label, logs, recreate, set, version, wait,
};

#[derive(Debug, Parser)]
#[command(name = "riggerctl", version = rigger_version::LONG, about = "Talk to a Rigger controller")]
struct Cli {
    #[command(flatten)]
    connection: ConnectArgs,
    /// Namespace of namespaced objects.
    #[arg(long, short = 'n', global = true, default_value = "default")]
    namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Apply(apply::Args),
    Get(get::Args),
    Describe(describe::Args),
    Explain(explain::Args),
    Delete(delete::Args),
    Label(label::Args),
    Logs(logs::Args),
    Exec(exec::Args),
    Set(set::Args),
    Recreate(recreate::Args),
    #[command(flatten)]
    Docs(rigger_daemon::cli::DocsCommand),
    Wait(wait::Args),
    Version(version::Args),
}

fn main() -> ExitCode {
    let cli = match rigger_daemon::cli::parse_args::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // Completions, the man page and explain need no controller.
    if let Command::Docs(docs) = &cli.command {
        return docs.print(<Cli as clap::CommandFactory>::command());
    }
    if let Command::Version(args) = &cli.command {
        // Printed before the controller is asked: an unreachable one still shows it.
        println!("{}", version::client_line());
        if args.client {
            return ExitCode::SUCCESS;
        }
    }
    if let Command::Explain(args) = &cli.command {
        return match explain::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("riggerctl: error: {e:#}");
                ExitCode::FAILURE
            }
        };
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

/// The verb's exit status (0 unless `exec` passes on another).
async fn run(cli: Cli) -> anyhow::Result<i32> {
    let namespace = cli.namespace.as_str();
    if let Command::Wait(args) = cli.command {
        // Connects itself: within its --timeout, through a failover.
        wait::run(args, &cli.connection, namespace).await?;
        return Ok(0);
    }
    // Through a failover under way, when the controller is replicated.
    let client = &mut client::connect_for_a_verb(&cli.connection).await?;
    match cli.command {
        Command::Apply(args) => apply::run(args, client).await,
        Command::Get(args) => get::run(args, client, &cli.connection, namespace).await,
        Command::Describe(args) => describe::run(args, client, &cli.connection, namespace).await,
        Command::Delete(args) => delete::run(args, client, namespace).await,
        Command::Label(args) => label::run(args, client).await,
        Command::Logs(args) => logs::run(args, client, &cli.connection, namespace).await,
        Command::Exec(args) => return exec::run(args, client, namespace).await,
        Command::Set(args) => set::run(args, client, &cli.connection, namespace).await,
        Command::Recreate(args) => recreate::run(args, client, &cli.connection, namespace).await,
        Command::Version(_) => version::run(client).await,
        Command::Wait(_) => Ok(()),
        Command::Docs(_) | Command::Explain(_) => Ok(()),
    }
    .map(|()| 0)
}
