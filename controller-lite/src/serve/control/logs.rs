//! `riggerctl logs -f`: the log, then what the container writes next, as a stream. The
//! agent is asked for what lies past its last answer (attempt and byte offset), so a
//! follower costs a small question every half second, not the whole log again.

use std::pin::Pin;
use std::time::{Duration, Instant};

use rigger_proto::v1::{ContainerLogs, PodLogsRequest, PodOutput, agent_request};
use tokio_stream::Stream;
use tonic::Status;

use super::ControlService;

pub type OutputStream = Pin<Box<dyn Stream<Item = Result<PodOutput, Status>> + Send>>;

/// How often the agent is asked for new lines.
const POLL: Duration = Duration::from_millis(500);
/// How long a follower waits for the pod's agent to be connected (after a failover the
/// agents find the new leader within seconds).
const AGENT_GRACE: Duration = Duration::from_secs(30);

impl ControlService {
    /// The log of pod `uid`'s container on `node`, followed until the caller goes away
    /// or the pod does.
    pub(super) fn follow(
        &self,
        node: String,
        uid: String,
        request: PodLogsRequest,
    ) -> OutputStream {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let pod_uid = uid.clone();
        let pods = self.pods.clone();
        let leadership = self.leadership.clone();
        tokio::spawn(async move {
            // Without --tail the whole log is wanted: read as a follower from its start,
            // a bounded piece per answer, rather than in one answer of any size.
            // A follower resuming (after a failover) says where it got to, in this pod.
            let mut ask = if request.resume && request.resume_pod_uid == uid {
                ContainerLogs {
                    pod_uid: uid,
                    container: request.container,
                    tail_lines: 0,
                    follow: true,
                    attempt: request.resume_attempt,
                    offset: request.resume_offset,
                }
            } else {
                ContainerLogs {
                    pod_uid: uid,
                    container: request.container,
                    tail_lines: request.tail_lines,
                    follow: request.tail_lines == 0,
                    attempt: u32::MAX,
                    offset: 0,
                }
            };
            let mut unreachable_since: Option<Instant> = None;
            loop {
                // A replica that no longer leads loses its agents: its follower goes on
                // from the next leader (riggerctl reconnects on Unavailable).
                if !leadership.is_leader() {
                    let status = Status::unavailable("this controller replica no longer leads");
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                let answer = pods
                    .ask(
                        &node,
                        agent_request::Kind::Logs(ask.clone()),
                        Duration::from_secs(30),
                    )
                    .await;
                let answer = match answer {
                    Ok(answer) => {
                        unreachable_since = None;
                        answer
                    }
                    // A follower resuming after a failover waits a while for the pod's
                    // agent to reconnect to this replica, just elected; then it is told,
                    // as a refusal it does not take for this controller going away. A
                    // first ask is told at once.
                    Err(status) if status.code() == tonic::Code::Unavailable => {
                        let since = *unreachable_since.get_or_insert_with(Instant::now);
                        if !request.resume || since.elapsed() >= AGENT_GRACE {
                            let status = Status::failed_precondition(status.message());
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                        tokio::select! {
                            () = tx.closed() => return,
                            () = tokio::time::sleep(POLL) => continue,
                        }
                    }
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                ask.follow = true;
                ask.attempt = answer.log_attempt;
                ask.offset = answer.log_offset;
                if !answer.stdout.is_empty() {
                    let output = PodOutput {
                        stdout: answer.stdout,
                        log_attempt: answer.log_attempt,
                        log_offset: answer.log_offset,
                        pod_uid: pod_uid.clone(),
                        ..PodOutput::default()
                    };
                    if tx.send(Ok(output)).await.is_err() {
                        return; // The follower went away.
                    }
                    // There may be more right away (a long log comes in pieces).
                    continue;
                }
                if request.until_now {
                    return; // Caught up: the stream ends.
                }
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(POLL) => {}
                }
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
    }
}
