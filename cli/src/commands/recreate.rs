//! `riggerctl recreate POD -c NAME...`: a ContainerRecreateRequest, and with `--wait` each
//! container's progress until it completes.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use rigger_proto::v1::ApplyRequest;
use serde_json::Value;

use crate::client::{Client, ConnectArgs, fetch, refused};
use crate::output::str_of;

/// Restart containers of a pod in place: creates a ContainerRecreateRequest.
#[derive(Debug, clap::Args)]
pub struct Args {
    pod: String,
    /// A container to recreate (repeat for several).
    #[arg(long = "container", short = 'c', required = true, value_name = "NAME")]
    containers: Vec<String>,
    /// One container after the other, each once the previous one is back.
    #[arg(long)]
    ordered: bool,
    /// Grace period for preStop and stop [default: the pod's].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    grace: Option<Duration>,
    /// Fail the request if it is not done after this long.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    deadline: Option<Duration>,
    /// The request's name [default: POD-recreate-<time>].
    #[arg(long)]
    name: Option<String>,
    /// Show each container's progress until the request completes; exit 1 if one failed.
    #[arg(long)]
    wait: bool,
}

impl Args {
    /// The ContainerRecreateRequest this asks for.
    fn object(&self, namespace: &str) -> Value {
        let name = self.name.clone().unwrap_or_else(|| {
            let now = SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!(
                "{}-recreate-{}{:03}",
                self.pod,
                now.as_secs(),
                now.subsec_millis()
            )
        });
        let mut strategy = serde_json::json!({"orderedRecreate": self.ordered});
        if let Some(grace) = self.grace {
            strategy["terminationGracePeriodSeconds"] = grace.as_secs().into();
        }
        let mut spec = serde_json::json!({
            "podName": self.pod,
            "containers": self.containers.iter().map(|c| serde_json::json!({"name": c})).collect::<Vec<_>>(),
            "strategy": strategy,
        });
        if let Some(deadline) = self.deadline {
            spec["activeDeadlineSeconds"] = deadline.as_secs().into();
        }
        serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "ContainerRecreateRequest",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        })
    }
}

pub async fn run(
    args: Args,
    client: &mut Client,
    connection: &ConnectArgs,
    namespace: &str,
) -> anyhow::Result<()> {
    let object = args.object(namespace);
    let wait = args.wait;
    let name = str_of(&object, "/metadata/name").to_owned();
    client
        .apply(ApplyRequest {
            json: object.to_string(),
            dry_run: false,
        })
        .await
        .map_err(|s| refused(&s))?;
    println!("containerrecreaterequest.apps.kruise.io/{name} created");
    if !wait {
        return Ok(());
    }
    // One line per change of a container's phase, until the request completes.
    let mut shown: HashMap<String, String> = HashMap::new();
    loop {
        let current = fetch(client, connection, "crr", namespace, &name).await?;
        let states = current
            .pointer("/status/containerRecreateStates")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for state in &states {
            let container = str_of(state, "/name");
            let mut line = str_of(state, "/phase").to_owned();
            if state["isKilled"] == true {
                line.push_str(" (old container stopped)");
            }
            let message = str_of(state, "/message");
            if !message.is_empty() {
                line.push_str(&format!(": {message}"));
            }
            if shown.get(container) != Some(&line) {
                println!("  {container}: {line}");
                shown.insert(container.to_owned(), line);
            }
        }
        if str_of(&current, "/status/phase") == "Completed" {
            let failed = states.iter().any(|s| str_of(s, "/phase") == "Failed");
            let message = str_of(&current, "/status/message");
            if failed {
                anyhow::bail!(
                    "recreate {name} completed with failed containers{}",
                    if message.is_empty() {
                        String::new()
                    } else {
                        format!(": {message}")
                    }
                );
            }
            println!("recreate {name} completed");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
