//! `riggerctl describe KIND NAME`: one object in detail, with a table of its containers
//! (a recreate request) or of every node's pull (a job), and its events.

use serde_json::Value;

use std::time::SystemTime;

use crate::client::{Client, ConnectArgs, Selectors, fetch, fetch_all};
use crate::output::{bytes, num_of, render_table, str_of};

/// Show one object in detail (for jobs: every node's pull).
#[derive(Debug, clap::Args)]
pub struct Args {
    kind: String,
    name: String,
}

pub async fn run(
    args: Args,
    client: &mut Client,
    connection: &ConnectArgs,
    namespace: &str,
) -> anyhow::Result<()> {
    let object = fetch(client, connection, &args.kind, namespace, &args.name).await?;
    print!("{}", describe(&object));
    // A cluster-wide object's events are in `default`, as Kubernetes keeps a Node's.
    let events_namespace = match str_of(&object, "/metadata/namespace") {
        "" => "default",
        namespace => namespace,
    };
    let events = fetch_all(
        client,
        connection,
        "event",
        events_namespace,
        &Selectors::default(),
    )
    .await;
    match events {
        Ok(events) => print!("{}", events_of(&object, &events, SystemTime::now())),
        // A controller older than events still describes the object.
        Err(error) => println!("Events:  (not available: {error:#})"),
    }
    Ok(())
}

/// kubectl's Events section: the events about `object`, oldest first.
fn events_of(object: &Value, events: &[Value], now: SystemTime) -> String {
    let kind = str_of(object, "/kind");
    let name = str_of(object, "/metadata/name");
    let uid = str_of(object, "/metadata/uid");
    let mut about: Vec<&Value> = events
        .iter()
        .filter(|e| {
            let involved = &e["involvedObject"];
            str_of(involved, "/kind") == kind
                && str_of(involved, "/name") == name
                // An object deleted and made again is another: its events are its own.
                && (uid.is_empty()
                    || str_of(involved, "/uid").is_empty()
                    || str_of(involved, "/uid") == uid)
        })
        .collect();
    if about.is_empty() {
        return "Events:  <none>\n".to_owned();
    }
    about.sort_by(|a, b| str_of(a, "/lastTimestamp").cmp(str_of(b, "/lastTimestamp")));
    let rows: Vec<Vec<String>> = about
        .iter()
        .map(|e| {
            let last = rigger_api::table::age(Some(str_of(e, "/lastTimestamp")), now);
            let count = num_of(e, "/count");
            let age = if count > 1 {
                let first = rigger_api::table::age(Some(str_of(e, "/firstTimestamp")), now);
                format!("{last} (x{count} over {first})")
            } else {
                last
            };
            vec![
                str_of(e, "/type").to_owned(),
                str_of(e, "/reason").to_owned(),
                age,
                str_of(e, "/source/component").to_owned(),
                str_of(e, "/message").to_owned(),
            ]
        })
        .collect();
    section(
        "Events",
        &["Type", "Reason", "Age", "From", "Message"],
        &rows,
    )
}

/// A titled table, indented under its title, as kubectl's describe shows one.
fn section(title: &str, header: &[&str], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|s| (*s).to_owned()).collect();
    let mut out = format!("{title}:\n");
    for line in render_table(&header, rows) {
        out.push_str("  ");
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn describe(object: &Value) -> String {
    let mut out = String::new();
    let mut metadata_only = object.clone();
    if let Some(status) = metadata_only
        .get_mut("status")
        .and_then(Value::as_object_mut)
    {
        status.remove("nodes");
        status.remove("containerRecreateStates");
    }
    out.push_str(&serde_yaml_ng::to_string(&metadata_only).unwrap_or_default());
    if let Some(states) = object
        .pointer("/status/containerRecreateStates")
        .and_then(Value::as_array)
    {
        let rows: Vec<Vec<String>> = states
            .iter()
            .map(|c| {
                vec![
                    str_of(c, "/name").to_owned(),
                    str_of(c, "/phase").to_owned(),
                    (c["isKilled"] == true).to_string(),
                    str_of(c, "/message").to_owned(),
                ]
            })
            .collect();
        out.push_str(&section(
            "Containers",
            &["CONTAINER", "PHASE", "KILLED", "MESSAGE"],
            &rows,
        ));
    }
    if let Some(nodes) = object.pointer("/status/nodes").and_then(Value::as_array) {
        let rows: Vec<Vec<String>> = nodes
            .iter()
            .map(|n| {
                let total = num_of(n, "/bytesTotal");
                vec![
                    str_of(n, "/name").to_owned(),
                    str_of(n, "/phase").to_owned(),
                    num_of(n, "/attempts").to_string(),
                    if total == 0 {
                        "-".to_owned()
                    } else {
                        format!("{}/{}", bytes(num_of(n, "/bytesDone")), bytes(total))
                    },
                    str_of(n, "/message").to_owned(),
                ]
            })
            .collect();
        out.push_str(&section(
            "Nodes",
            &["NODE", "PHASE", "ATTEMPTS", "PROGRESS", "MESSAGE"],
            &rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_events_section_shows_the_objects_own_events_oldest_first_with_counts() {
        let now =
            humantime::parse_rfc3339("2026-11-26T10:10:00Z").unwrap_or(SystemTime::UNIX_EPOCH);
        let job = serde_json::json!({"kind": "ImagePullJob",
            "metadata": {"name": "warm", "namespace": "default", "uid": "u2"}});
        let event = |name: &str, uid: &str, reason: &str, last: &str, count: u64| {
            serde_json::json!({"involvedObject": {"kind": "ImagePullJob", "name": name, "uid": uid},
                "type": "Normal", "reason": reason, "message": format!("{reason} of {name}"),
                "count": count, "firstTimestamp": "2026-11-26T10:00:00Z", "lastTimestamp": last,
                "source": {"component": "rigger-controller"}})
        };
        let events = [
            event("warm", "u2", "Second", "2026-11-26T10:09:50Z", 3),
            event("warm", "u2", "First", "2026-11-26T10:09:00Z", 1),
            event("warm", "u1", "OfAnEarlierWarm", "2026-11-26T10:09:00Z", 1),
            event("cold", "u3", "OfAnother", "2026-11-26T10:09:00Z", 1),
        ];
        let text = events_of(&job, &events, now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[2].contains("First"), "{text}");
        assert!(
            lines[3].contains("Second") && lines[3].contains("10s (x3 over 10m)"),
            "{text}"
        );
        assert_eq!(events_of(&job, &events[3..], now), "Events:  <none>\n");
    }
}
