//! `riggerctl wait KIND/NAME --for=condition=NAME`.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client::{Client, fetch};
use crate::output::str_of;

/// Wait until an object has a condition, e.g. `--for=condition=Complete`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// KIND/NAME, e.g. imagepulljob/warm-nginx.
    object: String,
    #[arg(long = "for", value_name = "condition=NAME")]
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
    let wanted = condition
        .strip_prefix("condition=")
        .filter(|c| !c.is_empty())
        .ok_or_else(|| anyhow::anyhow!("--for {condition:?}: expected condition=NAME"))?;
    let deadline = Instant::now() + timeout;
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
