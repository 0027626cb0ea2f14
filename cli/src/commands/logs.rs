//! `riggerctl logs POD [-c CONTAINER] [--tail N] [-f]`: a container's log, through the
//! node's agent.

use std::time::Duration;

use rigger_proto::v1::PodLogsRequest;

use crate::client::{Client, refused};

/// Print a pod's container log (the current attempt's).
#[derive(Debug, clap::Args)]
pub struct Args {
    pod: String,
    #[arg(long, short = 'c')]
    container: Option<String>,
    /// Only the last N lines.
    #[arg(long, default_value_t = 0)]
    tail: u32,
    /// Keep printing new lines (asks the agent again every second).
    #[arg(long, short = 'f')]
    follow: bool,
}

pub async fn run(args: Args, client: &mut Client, namespace: &str) -> anyhow::Result<()> {
    let Args {
        pod,
        container,
        tail,
        follow,
    } = args;
    use std::io::Write as _;
    let request = |tail_lines| PodLogsRequest {
        namespace: namespace.to_owned(),
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
