//! The agent↔controller messages, as each side decodes what the other sent: protobuf
//! bytes, then the parts each side reads further (pod specs, recreate work).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use rigger_proto::v1::{AgentMessage, ControllerMessage, agent_message, controller_message, task};

fuzz_target!(|bytes: &[u8]| {
    if let Ok(message) = ControllerMessage::decode(bytes) {
        match message.message {
            Some(controller_message::Message::Task(task)) => {
                if let Some(task::Work::RecreateContainers(recreate)) = &task.work {
                    let _ = rigger_agent::recreate::RecreateWork::from_proto(recreate);
                }
                if let Some(task::Work::PullImage(pull)) = &task.work {
                    let _ = rigger_pull::check_reference(&pull.image);
                }
            }
            Some(controller_message::Message::Pods(set)) => {
                for assigned in set.pods {
                    let _ = serde_json::from_str::<rigger_proto::pod::Pod>(&assigned.json);
                    let _ = serde_json::from_str::<Vec<rigger_proto::lifecycle::Cooperator>>(
                        &assigned.cooperators,
                    );
                }
            }
            _ => {}
        }
    }
    if let Ok(message) = AgentMessage::decode(bytes)
        && let Some(agent_message::Message::PodStatus(status)) = message.message
    {
        let _ = serde_json::from_str::<serde_json::Value>(&status.json);
    }
});
