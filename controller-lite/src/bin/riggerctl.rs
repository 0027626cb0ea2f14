//! `riggerctl`: the command line for Rigger's controller, in kubectl's habits.

use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use comfy_table::{Table, presets};
use rigger_proto::v1::ListNodesRequest;
use rigger_proto::v1::control_client::ControlClient;

#[derive(Debug, Parser)]
#[command(name = "riggerctl", version, about = "Talk to a Rigger controller")]
struct Cli {
    /// Controller URL.
    #[arg(
        long,
        global = true,
        env = "RIGGER_SERVER",
        default_value = "http://127.0.0.1:9450"
    )]
    server: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List objects of a kind.
    Get {
        #[arg(value_enum)]
        kind: Kind,
        /// Output format.
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Kind {
    #[value(alias = "node", alias = "no")]
    Nodes,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let cli = match rigger_daemon::cli::parse_args::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| rt.block_on(run(cli)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("riggerctl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(cli.server.clone())
        .with_context(|| format!("--server {:?} is not a URL", cli.server))?
        .connect()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot reach the controller at {}: {}",
                cli.server,
                rigger_daemon::error_chain(&e)
            )
        })?;
    let mut client = ControlClient::new(channel);
    match cli.command {
        Command::Get {
            kind: Kind::Nodes,
            output,
        } => {
            let nodes = client
                .list_nodes(ListNodesRequest {})
                .await
                .map_err(|s| anyhow::anyhow!("list nodes: {}", s.message()))?
                .into_inner()
                .nodes;
            match output {
                Output::Json => {
                    let items: Vec<serde_json::Value> = nodes
                        .iter()
                        .map(|n| {
                            serde_json::json!({
                                "name": n.name,
                                "labels": n.labels,
                                "ready": n.ready,
                                "reason": n.reason,
                                "agentVersion": n.agent_version,
                                "containerdVersion": n.containerd_version,
                                "lastHeartbeat": n.last_heartbeat.as_ref().and_then(to_rfc3339),
                                "images": n.images,
                                "pods": n.pods,
                                "containers": n.containers,
                            })
                        })
                        .collect();
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&serde_json::json!({"items": items}))?
                    );
                }
                Output::Table => {
                    let mut table = Table::new();
                    table.load_preset(presets::NOTHING);
                    table.set_header(vec![
                        "NAME",
                        "STATUS",
                        "AGENT",
                        "CONTAINERD",
                        "IMAGES",
                        "CONTAINERS",
                        "LAST HEARTBEAT",
                    ]);
                    for n in &nodes {
                        let status = if n.ready {
                            "Ready".to_owned()
                        } else {
                            format!("NotReady ({})", n.reason)
                        };
                        table.add_row(vec![
                            n.name.clone(),
                            status,
                            n.agent_version.clone(),
                            n.containerd_version.clone(),
                            n.images.to_string(),
                            n.containers.to_string(),
                            n.last_heartbeat
                                .as_ref()
                                .and_then(age)
                                .unwrap_or_else(|| "-".into()),
                        ]);
                    }
                    for column in table.column_iter_mut() {
                        column.set_padding((0, 2));
                    }
                    for line in table.to_string().lines() {
                        println!("{}", line.trim_end());
                    }
                }
            }
        }
    }
    Ok(())
}

fn to_system_time(ts: &prost_types::Timestamp) -> Option<SystemTime> {
    SystemTime::try_from(*ts).ok()
}

fn to_rfc3339(ts: &prost_types::Timestamp) -> Option<String> {
    to_system_time(ts).map(|t| humantime::format_rfc3339_seconds(t).to_string())
}

/// kubectl-style age: `5s ago`.
fn age(ts: &prost_types::Timestamp) -> Option<String> {
    let elapsed = SystemTime::now().duration_since(to_system_time(ts)?).ok()?;
    Some(format!(
        "{} ago",
        humantime::format_duration(std::time::Duration::from_secs(elapsed.as_secs()))
    ))
}
