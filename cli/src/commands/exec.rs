//! `riggerctl exec POD [-c CONTAINER] -- CMD ARGS...`: a command in a container, not
//! interactive; riggerctl exits with the command's status.

use std::time::Duration;

use rigger_proto::v1::PodExecRequest;

use crate::client::{Client, refused};

/// Run a command in a pod's container (not interactive): `exec POD -- CMD ARGS...`.
#[derive(Debug, clap::Args)]
pub struct Args {
    pod: String,
    #[arg(long, short = 'c')]
    container: Option<String>,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Returns the command's exit status.
pub async fn run(args: Args, client: &mut Client, namespace: &str) -> anyhow::Result<i32> {
    let Args {
        pod,
        container,
        timeout,
        command,
    } = args;
    let output = client
        .exec(PodExecRequest {
            namespace: namespace.to_owned(),
            name: pod,
            container: container.unwrap_or_default(),
            command,
            timeout_seconds: u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX),
        })
        .await
        .map_err(|s| refused(&s))?
        .into_inner();
    use std::io::Write as _;
    std::io::stdout().write_all(&output.stdout)?;
    std::io::stderr().write_all(&output.stderr)?;
    Ok(output.exit_code)
}
