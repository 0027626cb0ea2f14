//! `riggerctl describe KIND NAME`: one object in detail, with a table of its containers
//! (a recreate request) or of every node's pull (a job).

use serde_json::Value;

use crate::client::{Client, ConnectArgs, fetch};
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
    Ok(())
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
        out.push_str("Containers:\n");
        let header: Vec<String> = ["CONTAINER", "PHASE", "KILLED", "MESSAGE"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
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
        for line in render_table(&header, &rows) {
            out.push_str("  ");
            out.push_str(&line);
            out.push('\n');
        }
    }
    if let Some(nodes) = object.pointer("/status/nodes").and_then(Value::as_array) {
        out.push_str("Nodes:\n");
        let header: Vec<String> = ["NODE", "PHASE", "ATTEMPTS", "PROGRESS", "MESSAGE"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
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
        for line in render_table(&header, &rows) {
            out.push_str("  ");
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}
