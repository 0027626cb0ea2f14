//! `riggerctl wait KIND/NAME --for=condition=NAME|delete`.

use std::time::{Duration, Instant};

use serde_json::Value;

use rigger_proto::v1::GetRequest;

use crate::client::{Client, fetch, refused};
use crate::output::str_of;

/// Wait until an object has a condition (`--for=condition=Complete`) or is gone
/// (`--for=delete`; an object that does not exist is gone).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// KIND/NAME, e.g. imagepulljob/warm-nginx.
    object: String,
    #[arg(long = "for", value_name = "condition=NAME|delete")]
    condition: String,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// Whether `object` has condition `name` with status True.
fn has_condition(object: &Value, name: &str) -> bool {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                str_of(c, "/type").eq_ignore_ascii_case(name) && str_of(c, "/status") == "True"
            })
        })
}

pub async fn run(args: Args, client: &mut Client, namespace: &str) -> anyhow::Result<()> {
    let Args {
        object,
        condition,
        timeout,
    } = args;
    let (kind, name) = object
        .split_once('/')
        .filter(|(k, n)| !k.is_empty() && !n.is_empty())
        .ok_or_else(|| anyhow::anyhow!("{object:?}: expected KIND/NAME, e.g. imagepulljob/warm"))?;
    let deadline = Instant::now() + timeout;
    if condition == "delete" {
        return wait_deleted(client, kind, namespace, name, deadline, timeout).await;
    }
    let wanted = condition
        .strip_prefix("condition=")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| anyhow::anyhow!("--for {condition:?}: expected condition=NAME or delete"))?;
    loop {
        let current = fetch(client, kind, namespace, name).await?;
        if has_condition(&current, wanted) {
            println!("{}/{name} condition met", kind.to_ascii_lowercase());
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "timed out after {} waiting for {wanted} on {kind}/{name} ({})",
                humantime::format_duration(timeout),
                str_of(&current, "/status/message")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Until `kind/name` is not found.
async fn wait_deleted(
    client: &mut Client,
    kind: &str,
    namespace: &str,
    name: &str,
    deadline: Instant,
    timeout: Duration,
) -> anyhow::Result<()> {
    loop {
        match client
            .get(GetRequest {
                kind: kind.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
            .await
        {
            Err(status) if status.code() == tonic::Code::NotFound => {
                println!("{}/{name} condition met", kind.to_ascii_lowercase());
                return Ok(());
            }
            Err(status) => return Err(refused(&status)),
            Ok(_) if Instant::now() >= deadline => anyhow::bail!(
                "timed out after {} waiting for {kind}/{name} to be deleted",
                humantime::format_duration(timeout)
            ),
            Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}
