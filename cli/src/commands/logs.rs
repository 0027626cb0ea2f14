//! `riggerctl logs POD [-c CONTAINER] [--tail N] [-f]`: a container's log, through the
//! node's agent.

use rigger_proto::v1::PodLogsRequest;

use crate::client::{Client, ConnectArgs, connect_to_the_next_leader, is_failover, refused};

/// Print a pod's container log (the current attempt's).
#[derive(Debug, clap::Args)]
pub struct Args {
    pod: String,
    #[arg(long, short = 'c')]
    container: Option<String>,
    /// Only the last N lines.
    #[arg(long, default_value_t = 0)]
    tail: u32,
    /// Keep printing new lines as the container writes them (through a controller
    /// failover too: on from the next leader, no line twice).
    #[arg(long, short = 'f')]
    follow: bool,
}

pub async fn run(
    args: Args,
    client: &mut Client,
    connection: &ConnectArgs,
    namespace: &str,
) -> anyhow::Result<()> {
    let Args {
        pod,
        container,
        tail,
        follow,
    } = args;
    use std::io::Write as _;
    let mut request = PodLogsRequest {
        namespace: namespace.to_owned(),
        name: pod,
        container: container.unwrap_or_default(),
        tail_lines: tail,
        // A whole log (no --tail) comes as a stream of bounded pieces that ends once
        // what was written so far is sent; -f keeps following.
        until_now: !follow && tail == 0,
        ..PodLogsRequest::default()
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
    // its start. Following goes on through a failover: from the next leader, resumed
    // where the last piece printed ended.
    loop {
        let opened = client.follow_logs(request.clone()).await;
        let mut stream = match opened {
            Ok(stream) => stream.into_inner(),
            Err(status) if follow && is_failover(&status) => {
                *client = connect_to_the_next_leader(connection).await?;
                continue;
            }
            Err(status) if status.code() == tonic::Code::Unimplemented => anyhow::bail!(
                "the controller cannot follow logs (it is older than this riggerctl); upgrade it, or leave out -f"
            ),
            Err(status) => return Err(refused(&status)),
        };
        loop {
            match stream.message().await {
                Ok(Some(output)) => {
                    std::io::stdout().write_all(&output.stdout)?;
                    std::io::stdout().flush()?;
                    if output.log_attempt != 0 || output.log_offset != 0 {
                        request.resume = true;
                        request.resume_attempt = output.log_attempt;
                        request.resume_offset = output.log_offset;
                        request.resume_pod_uid = output.pod_uid;
                    }
                }
                // A followed stream ends only when its controller goes away.
                Ok(None) if follow => break,
                Ok(None) => return Ok(()),
                Err(status) if follow && is_failover(&status) => break,
                Err(status) => return Err(refused(&status)),
            }
        }
        *client = connect_to_the_next_leader(connection).await?;
    }
}
