//! `riggerctl logs POD [-c CONTAINER] [--tail N] [-f]`: a container's log, through the
//! node's agent.

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
    /// Keep printing new lines as the container writes them.
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
    let request = PodLogsRequest {
        namespace: namespace.to_owned(),
        name: pod,
        container: container.unwrap_or_default(),
        tail_lines: tail,
        // A whole log (no --tail) comes as a stream of bounded pieces that ends once
        // what was written so far is sent; -f keeps following.
        until_now: !follow && tail == 0,
    };
    if !follow && tail > 0 {
        let output = client
            .logs(request)
            .await
            .map_err(|s| refused(&s))?
            .into_inner();
        std::io::stdout().write_all(&output.stdout)?;
        return Ok(());
    }
    // Streamed: the log, then (following) each new line, a restarted container's from
    // its start.
    let mut stream = client
        .follow_logs(request)
        .await
        .map_err(|s| match s.code() {
            tonic::Code::Unimplemented => anyhow::anyhow!(
                "the controller cannot follow logs (it is older than this riggerctl); upgrade it, or leave out -f"
            ),
            _ => refused(&s),
        })?
        .into_inner();
    loop {
        match stream.message().await {
            Ok(Some(output)) => {
                std::io::stdout().write_all(&output.stdout)?;
                std::io::stdout().flush()?;
            }
            Ok(None) => return Ok(()),
            Err(status) => return Err(refused(&status)),
        }
    }
}
