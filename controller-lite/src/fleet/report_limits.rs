//! Bounds on what an agent reports. Agents are outside input for the controller: a
//! compromised or broken node must not grow a job's status (one stored object for the
//! whole job) or a pod's without limit. Strings are cut to a size that still says what
//! happened; a pod status too big to be a real one is refused.

use rigger_proto::v1::{PodStatus, TaskStatus};

/// A task's or a container's message: enough for an error chain, not a log.
pub const MAX_MESSAGE_BYTES: usize = 4 << 10;
/// A digest (`sha256:` + 64 hex) with room for other algorithms.
pub const MAX_DIGEST_BYTES: usize = 256;
/// Containers a recreate reports on (a pod has a few; Kubernetes allows no more).
pub const MAX_RECREATE_STATES: usize = 128;
/// A pod status as JSON. A real one — conditions, every container's status with its
/// last state and messages — stays well under this.
pub const MAX_POD_STATUS_BYTES: usize = 256 << 10;
/// Names and uids, as Kubernetes bounds them.
pub const MAX_NAME_BYTES: usize = 253;

/// `text` cut to `max` bytes on a character boundary, saying it was cut, with control
/// characters other than newline and tab replaced: they would reach users' terminals
/// through riggerctl, and each costs six bytes as JSON in the stored status.
pub fn cut(text: &mut String, max: usize) {
    const MARK: &str = " …(cut)";
    if text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        *text = text
            .chars()
            .map(|c| {
                if c.is_control() && c != '\n' && c != '\t' {
                    char::REPLACEMENT_CHARACTER
                } else {
                    c
                }
            })
            .collect();
    }
    if text.len() <= max {
        return;
    }
    let mut end = max.saturating_sub(MARK.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(MARK);
}

/// A task status with its strings and list bounded.
pub fn bound_task_status(mut status: TaskStatus) -> TaskStatus {
    cut(&mut status.message, MAX_MESSAGE_BYTES);
    cut(&mut status.image_digest, MAX_DIGEST_BYTES);
    status.recreate_states.truncate(MAX_RECREATE_STATES);
    for state in &mut status.recreate_states {
        cut(&mut state.name, MAX_NAME_BYTES);
        cut(&mut state.message, MAX_MESSAGE_BYTES);
    }
    status
}

/// A pod status within bounds, or why it is refused.
pub fn check_pod_status(status: &PodStatus) -> Result<(), String> {
    if status.json.len() > MAX_POD_STATUS_BYTES {
        return Err(format!(
            "a pod status of {} bytes (at most {MAX_POD_STATUS_BYTES})",
            status.json.len()
        ));
    }
    for (what, value) in [
        ("uid", &status.uid),
        ("namespace", &status.namespace),
        ("name", &status.name),
    ] {
        if value.len() > MAX_NAME_BYTES {
            return Err(format!(
                "a pod {what} of {} bytes (at most {MAX_NAME_BYTES})",
                value.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rigger_proto::v1::ContainerRecreateState;

    #[test]
    fn long_strings_are_cut_on_a_character_boundary_and_say_so() {
        let mut text = "é".repeat(10_000);
        cut(&mut text, MAX_MESSAGE_BYTES);
        assert!(text.len() <= MAX_MESSAGE_BYTES);
        assert!(text.ends_with("…(cut)"));
        let mut short = "fine".to_owned();
        cut(&mut short, MAX_MESSAGE_BYTES);
        assert_eq!(short, "fine");
    }

    #[test]
    fn terminal_escapes_are_replaced_and_newlines_kept() {
        let mut text = "pull failed\n\u{1b}[2J\u{7}\tdone".to_owned();
        cut(&mut text, MAX_MESSAGE_BYTES);
        assert_eq!(text, "pull failed\n\u{fffd}[2J\u{fffd}\tdone");
    }

    #[test]
    fn a_task_status_from_a_hostile_agent_is_bounded() {
        let status = bound_task_status(TaskStatus {
            message: "x".repeat(64 << 20),
            image_digest: "sha256:".repeat(1000),
            recreate_states: vec![
                ContainerRecreateState {
                    name: "c".repeat(1000),
                    // Four times the bound: 10,000 of 1 MiB each made this test allocate
                    // 10 GiB, for no more than this proves.
                    message: "m".repeat(4 * MAX_MESSAGE_BYTES),
                    ..ContainerRecreateState::default()
                };
                10_000
            ],
            ..TaskStatus::default()
        });
        assert!(status.message.len() <= MAX_MESSAGE_BYTES);
        assert!(status.image_digest.len() <= MAX_DIGEST_BYTES);
        assert_eq!(status.recreate_states.len(), MAX_RECREATE_STATES);
        assert!(
            status.recreate_states.iter().all(|s| {
                s.message.len() <= MAX_MESSAGE_BYTES && s.name.len() <= MAX_NAME_BYTES
            })
        );
    }

    #[test]
    fn pod_statuses_past_what_a_pod_can_reach_are_refused() {
        let ok = PodStatus {
            uid: "u".to_owned(),
            namespace: "default".to_owned(),
            name: "web".to_owned(),
            json: "{}".to_owned(),
        };
        assert!(check_pod_status(&ok).is_ok());
        let huge = PodStatus {
            json: " ".repeat(MAX_POD_STATUS_BYTES + 1),
            ..ok.clone()
        };
        assert!(check_pod_status(&huge).unwrap_err().contains("pod status"));
        let long_name = PodStatus {
            name: "n".repeat(300),
            ..ok
        };
        assert!(
            check_pod_status(&long_name)
                .unwrap_err()
                .contains("pod name")
        );
    }
}
