//! What kubelet records on the containers it creates, read back as kubelet reads it:
//! leniently. kubelet wrote it from a spec the API server validated, and newer releases
//! add fields (1.37's `httpGet.protocol`, a port's `hostPort`) that must not make a hook
//! Rigger can run unreadable. Only the fields Rigger reads are kept; Rigger's own types
//! then decode them, so a value of the wrong shape is still an error.

use rigger_proto::pod::{ContainerPort, Handler};
use serde_json::Value;

/// The lifecycle actions Rigger runs, each with the fields it reads.
const HANDLER_ACTIONS: [(&str, &[&str]); 4] = [
    ("exec", &["command"]),
    (
        "httpGet",
        &["path", "port", "host", "scheme", "httpHeaders"],
    ),
    ("sleep", &["seconds"]),
    ("tcpSocket", &["port", "host"]),
];
const HEADER_FIELDS: &[&str] = &["name", "value"];
const PORT_FIELDS: &[&str] = &["containerPort", "name", "protocol"];

/// kubelet's `io.kubernetes.container.preStopHandler`: its `LifecycleHandler` as JSON.
pub(super) fn lifecycle_handler(text: &str) -> Result<Handler, String> {
    let Value::Object(handler) = serde_json::from_str(text).map_err(|e| e.to_string())? else {
        return Err("not a JSON object".to_owned());
    };
    let mut known = serde_json::Map::new();
    let mut unknown = Vec::new();
    for (action, mut fields) in handler {
        let Some((_, kept)) = HANDLER_ACTIONS.iter().find(|(name, _)| *name == action) else {
            unknown.push(action);
            continue;
        };
        keep_fields(&mut fields, kept);
        if let Some(Value::Array(headers)) = fields.get_mut("httpHeaders") {
            headers
                .iter_mut()
                .for_each(|header| keep_fields(header, HEADER_FIELDS));
        }
        known.insert(action, fields);
    }
    if known.is_empty() && !unknown.is_empty() {
        return Err(format!(
            "its action is one Rigger cannot run: {}",
            unknown.join(", ")
        ));
    }
    serde_json::from_value(Value::Object(known)).map_err(|e| e.to_string())
}

/// kubelet's `io.kubernetes.container.ports`: the container's `ports` as JSON.
pub(super) fn container_ports(text: &str) -> Result<Vec<ContainerPort>, String> {
    let mut ports: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Value::Array(ports) = &mut ports {
        ports
            .iter_mut()
            .for_each(|port| keep_fields(port, PORT_FIELDS));
    }
    serde_json::from_value(ports).map_err(|e| e.to_string())
}

fn keep_fields(value: &mut Value, fields: &[&str]) {
    if let Value::Object(object) = value {
        object.retain(|field, _| fields.contains(&field.as_str()));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use rigger_proto::pod::{IntOrName, SleepAction};

    #[test]
    fn every_hook_kubelet_writes_is_read_and_newer_fields_are_ignored() {
        let sleep = lifecycle_handler(r#"{"sleep":{"seconds":5}}"#).unwrap();
        assert_eq!(sleep.sleep, Some(SleepAction { seconds: 5 }));
        let zero = lifecycle_handler(r#"{"sleep":{"seconds":0}}"#).unwrap();
        assert_eq!(zero.sleep, Some(SleepAction { seconds: 0 }));
        let exec = lifecycle_handler(r#"{"exec":{"command":["sh","-c","nginx -s quit"]}}"#);
        assert_eq!(exec.unwrap().exec.unwrap().command.len(), 3);
        let http = lifecycle_handler(
            r#"{"httpGet":{"path":"/drain","port":"http","scheme":"HTTP","protocol":"HTTP2",
                "httpHeaders":[{"name":"X","value":"1","future":true}]}}"#,
        )
        .unwrap()
        .http_get
        .unwrap();
        assert_eq!(http.port, IntOrName::Name("http".to_owned()));
        assert_eq!(http.http_headers[0].value, "1");
        let tcp = lifecycle_handler(r#"{"tcpSocket":{"port":8080}}"#).unwrap();
        assert_eq!(tcp.tcp_socket.unwrap().port, IntOrName::Int(8080));
    }

    #[test]
    fn a_hook_rigger_cannot_run_or_cannot_read_is_named() {
        let err = lifecycle_handler(r#"{"grpc":{"port":9000}}"#).unwrap_err();
        assert!(err.contains("cannot run: grpc"), "{err}");
        assert!(lifecycle_handler("{").is_err());
        assert!(
            lifecycle_handler("[1]")
                .unwrap_err()
                .contains("not a JSON object")
        );
        let err = lifecycle_handler(r#"{"sleep":{"seconds":"five"}}"#).unwrap_err();
        assert!(err.contains("invalid type"), "{err}");
    }

    #[test]
    fn ports_with_host_ports_are_read() {
        let ports = container_ports(
            r#"[{"name":"http","hostPort":8080,"containerPort":8080,"protocol":"TCP","hostIP":"0.0.0.0"}]"#,
        )
        .unwrap();
        assert_eq!(ports[0].container_port, 8080);
        assert_eq!(ports[0].name.as_deref(), Some("http"));
        assert!(container_ports(r#"{"name":"x"}"#).is_err());
    }
}
