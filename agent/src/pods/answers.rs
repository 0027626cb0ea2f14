//! Users' questions about a pod, relayed from the controller: its logs and exec.

use k8s_cri::v1::{ContainerFilter, ContainerState, ListContainersRequest};

use super::{PodRunner, lock};
use crate::labels;

impl PodRunner {
    /// Answer a user's question about one of this node's pods (logs, exec).
    pub async fn answer(
        &self,
        request: rigger_proto::v1::AgentRequest,
    ) -> rigger_proto::v1::AgentResponse {
        use rigger_proto::v1::{AgentResponse, agent_request};
        let id = request.id;
        let result = match request.kind {
            Some(agent_request::Kind::Logs(logs)) => {
                let from = logs.follow.then_some((logs.attempt, logs.offset));
                match self.logs(&logs.pod_uid, &logs.container, logs.tail_lines, from) {
                    Ok(read) => {
                        return AgentResponse {
                            id,
                            stdout: read.text.into_bytes(),
                            log_attempt: read.attempt,
                            log_offset: read.offset,
                            ..AgentResponse::default()
                        };
                    }
                    Err(error) => Err(error),
                }
            }
            Some(agent_request::Kind::Exec(exec)) => {
                Box::pin(self.exec(
                    &exec.pod_uid,
                    &exec.container,
                    exec.command,
                    exec.timeout_seconds,
                ))
                .await
            }
            None => Err("this agent does not know the request (upgrade it)".to_owned()),
        };
        match result {
            Ok((stdout, stderr, exit_code)) => AgentResponse {
                id,
                stdout,
                stderr,
                exit_code,
                ..AgentResponse::default()
            },
            Err(error) => AgentResponse {
                id,
                error,
                ..AgentResponse::default()
            },
        }
    }

    /// The container named `container` (or the pod's first) of pod `uid`.
    pub(super) fn container_name(&self, uid: &str, container: &str) -> Result<String, String> {
        let desired = lock(&self.inner.desired);
        let pod = desired
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
            .ok_or_else(|| format!("pod {uid} does not run on this node"))?;
        if container.is_empty() {
            return pod
                .spec
                .containers
                .first()
                .map(|c| c.name.clone())
                .ok_or_else(|| "the pod has no containers".to_owned());
        }
        let known = pod
            .spec
            .containers
            .iter()
            .chain(&pod.spec.init_containers)
            .any(|c| c.name == container);
        if known {
            Ok(container.to_owned())
        } else {
            Err(format!("the pod has no container named {container:?}"))
        }
    }

    /// The latest attempt's log, messages only (CRI's timestamp/stream/tag prefix
    /// dropped): the last `tail` lines, or, following from `(attempt, offset)`, the
    /// whole lines written since (all of a newer attempt's).
    pub(super) fn logs(
        &self,
        uid: &str,
        container: &str,
        tail: u32,
        from: Option<(u32, u64)>,
    ) -> Result<LogRead, String> {
        use std::io::{Read as _, Seek as _};
        let name = self.container_name(uid, container)?;
        let dir = self.inner.dir.join(uid).join("logs").join(&name);
        let (attempt, latest) = std::fs::read_dir(&dir)
            .map_err(|e| format!("no log for container {name:?} yet ({e})"))?
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                let attempt: u32 = path.file_stem()?.to_str()?.parse().ok()?;
                Some((attempt, path))
            })
            .max_by_key(|(attempt, _)| *attempt)
            .ok_or_else(|| format!("no log for container {name:?} yet"))?;
        let mut file =
            std::fs::File::open(&latest).map_err(|e| format!("{}: {e}", latest.display()))?;
        let length = file.metadata().map_or(0, |m| m.len());
        // A follower reads on from its offset (from the start of a newer attempt, or of a
        // log shorter than the offset: rotated or replaced); a plain read takes the end.
        let start = match from {
            Some((seen, offset)) if seen == attempt && offset <= length => offset,
            Some(_) => 0,
            None => length.saturating_sub(MAX_LOG_READ),
        };
        file.seek(std::io::SeekFrom::Start(start))
            .map_err(|e| format!("{}: {e}", latest.display()))?;
        let mut bytes = Vec::new();
        // Every answer is bounded: a follower is answered in pieces, a plain read (for
        // --tail) is the log's last MAX_LOG_READ bytes.
        file.take(MAX_LOG_READ)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{}: {e}", latest.display()))?;
        // A plain read that started mid-log drops its first, partial line.
        let first = if from.is_none() && start > 0 {
            bytes
                .iter()
                .position(|b| *b == b'\n')
                .map_or(bytes.len(), |i| i + 1)
        } else {
            0
        };
        // Whole lines only: a line being written is sent once it is complete.
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let text = String::from_utf8_lossy(&bytes[first.min(whole)..whole]);
        Ok(LogRead {
            text: log_messages(&text, if from.is_some() { 0 } else { tail }),
            attempt,
            offset: start + whole as u64,
        })
    }

    pub(super) async fn exec(
        &self,
        uid: &str,
        container: &str,
        command: Vec<String>,
        timeout: u32,
    ) -> Result<(Vec<u8>, Vec<u8>, i32), String> {
        let name = self.container_name(uid, container)?;
        let mut cri = crate::cri::connect(&self.inner.connection).await?;
        let running = cri
            .list_containers(ListContainersRequest {
                filter: Some(ContainerFilter {
                    state: Some(k8s_cri::v1::ContainerStateValue {
                        state: ContainerState::ContainerRunning as i32,
                    }),
                    label_selector: [
                        (labels::POD_UID.to_owned(), uid.to_owned()),
                        (labels::CONTAINER_NAME.to_owned(), name.clone()),
                    ]
                    .into(),
                    ..ContainerFilter::default()
                }),
            })
            .await
            .map_err(|s| s.message().to_owned())?
            .into_inner()
            .containers;
        let target = running
            .first()
            .ok_or_else(|| format!("container {name:?} is not running"))?;
        let response = cri
            .exec_sync(k8s_cri::v1::ExecSyncRequest {
                container_id: target.id.clone(),
                cmd: command,
                timeout: i64::from(timeout),
            })
            .await
            .map_err(|s| s.message().to_owned())?
            .into_inner();
        Ok((response.stdout, response.stderr, response.exit_code))
    }
}

/// The most of a log one answer carries (a follower asks again for the rest).
const MAX_LOG_READ: u64 = 16 << 20;

/// What a log read found: the messages, and where a follower goes on from.
pub(super) struct LogRead {
    text: String,
    attempt: u32,
    offset: u64,
}

/// The messages of a CRI log file (each line is `TIME STREAM TAG MESSAGE`), the last
/// `tail` of them (all for 0), newline-terminated.
pub(super) fn log_messages(text: &str, tail: u32) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|line| line.splitn(4, ' ').nth(3).unwrap_or(""))
        .collect();
    let skip = if tail == 0 {
        0
    } else {
        lines.len().saturating_sub(tail as usize)
    };
    let mut out = lines[skip..].join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_log_lines_become_messages() {
        let text =
            "2026-11-22T16:00:00.1Z stdout F one\n2026-11-22T16:00:01.2Z stderr F two words\n";
        assert_eq!(log_messages(text, 0), "one\ntwo words\n");
        assert_eq!(log_messages(text, 1), "two words\n");
        assert_eq!(log_messages("", 5), "");
    }
}
