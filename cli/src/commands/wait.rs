//! `riggerctl wait KIND/NAME --for=condition=NAME|create|delete|jsonpath=TEMPLATE[=VALUE]`.

use std::time::Duration;

use serde_json::Value;

use crate::client::{Change, ConnectArgs, Selectors, Watch};
use crate::output::{Template, str_of};

/// Wait until an object has a condition (`--for=condition=Complete`), exists
/// (`--for=create`, as kubectl's), is gone (`--for=delete`; an object that does not
/// exist is gone), or a JSONPath template
/// gives a value (`--for=jsonpath={.status.phase}=Completed`; without `=VALUE`, any
/// non-empty result).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// KIND/NAME, e.g. imagepulljob/warm-nginx.
    object: String,
    #[arg(
        long = "for",
        value_name = "condition=NAME|create|delete|jsonpath=T[=VALUE]"
    )]
    condition: String,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// What `--for` waits for.
enum Wanted {
    Created,
    Deleted,
    Condition(String),
    JsonPath(Template, Option<String>),
}

/// `TEMPLATE[=VALUE]`: the value follows the template's last `}=` (or, for a bare
/// path, its last `=`).
fn json_path_test(expression: &str) -> anyhow::Result<(Template, Option<String>)> {
    let (template, value) = match expression.rfind("}=") {
        Some(at) => (&expression[..=at], Some(&expression[at + 2..])),
        None if !expression.contains('{') => match expression.rsplit_once('=') {
            Some((path, value)) => (path, Some(value)),
            None => (expression, None),
        },
        None => (expression, None),
    };
    let template = Template::parse(template).map_err(|e| anyhow::anyhow!("--for: {e}"))?;
    Ok((template, value.map(str::to_owned)))
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

pub async fn run(args: Args, connection: &ConnectArgs, namespace: &str) -> anyhow::Result<()> {
    // The whole wait, connecting included, within --timeout: a controller failing over
    // (the leader killed) is waited out, its successor followed.
    let deadline = tokio::time::Instant::now() + args.timeout;
    let client = &mut crate::client::connect_within(connection, deadline).await?;
    let Args {
        object,
        condition,
        timeout,
    } = args;
    let (kind, name) = object
        .split_once('/')
        .filter(|(k, n)| !k.is_empty() && !n.is_empty())
        .ok_or_else(|| anyhow::anyhow!("{object:?}: expected KIND/NAME, e.g. imagepulljob/warm"))?;
    let wanted = if condition == "delete" {
        Wanted::Deleted
    } else if condition == "create" {
        Wanted::Created
    } else {
        match condition.strip_prefix("jsonpath=") {
            Some(expression) => {
                let (template, value) = json_path_test(expression)?;
                Wanted::JsonPath(template, value)
            }
            None => Wanted::Condition(
                condition
                    .strip_prefix("condition=")
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "--for {condition:?}: expected condition=NAME, create, delete or jsonpath=TEMPLATE[=VALUE]"
                        )
                    })?
                    .to_owned(),
            ),
        }
    };
    let met = || println!("{}/{name} condition met", kind.to_ascii_lowercase());
    // The controller's Watch of this one object: each change is judged as it comes.
    let selectors = Selectors {
        labels: String::new(),
        fields: format!("metadata.name={name}"),
    };
    let mut watch =
        Watch::new(client, kind, namespace, &selectors).following_the_leader(connection);
    let mut last: Option<Value> = None;
    loop {
        let change = match tokio::time::timeout_at(deadline, watch.next()).await {
            Ok(change) => change?,
            Err(_) => {
                let after = humantime::format_duration(timeout);
                match wanted {
                    Wanted::Deleted => anyhow::bail!(
                        "timed out after {after} waiting for {kind}/{name} to be deleted"
                    ),
                    Wanted::Created => anyhow::bail!(
                        "timed out after {after} waiting for {kind}/{name} to be created"
                    ),
                    Wanted::Condition(_) | Wanted::JsonPath(..) => {}
                }
                let message = last
                    .as_ref()
                    .map(|o| str_of(o, "/status/message"))
                    .unwrap_or_default();
                anyhow::bail!(
                    "timed out after {after} waiting for {condition} on {kind}/{name} ({message})"
                );
            }
        };
        match (change, &wanted) {
            // Nothing by that name: gone already, or nothing to wait on.
            // A new leader's listing follows: judged as the first one was.
            (Change::Relisted, _) => last = None,
            (Change::Synced, Wanted::Deleted) if last.is_none() => {
                met();
                return Ok(());
            }
            // Not there yet: what --for=create waits for.
            (Change::Synced | Change::Object { deleted: true, .. }, Wanted::Created) => {
                last = None;
            }
            (Change::Synced, _) if last.is_none() => {
                anyhow::bail!("{kind}/{name}: not found")
            }
            (Change::Synced, _) => {}
            (Change::Object { deleted: true, .. }, Wanted::Deleted) => {
                met();
                return Ok(());
            }
            (Change::Object { deleted: true, .. }, _) => {
                anyhow::bail!("{kind}/{name} was deleted while waiting for {condition}")
            }
            (Change::Object { object, .. }, wanted) => {
                let done = match wanted {
                    Wanted::Created => true,
                    Wanted::Deleted => false,
                    Wanted::Condition(name) => has_condition(&object, name),
                    Wanted::JsonPath(template, value) => {
                        let got = template.render(&object);
                        match value {
                            Some(value) => got == *value,
                            None => !got.is_empty(),
                        }
                    }
                };
                if done {
                    met();
                    return Ok(());
                }
                last = Some(object);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_json_path_test_splits_where_kubectl_does() {
        let object = serde_json::json!({"status": {"phase": "Completed", "n": 3}});
        let check = |expression: &str| {
            let (template, value) = json_path_test(expression).unwrap();
            (template.render(&object), value)
        };
        assert_eq!(
            check("{.status.phase}=Completed"),
            ("Completed".to_owned(), Some("Completed".to_owned()))
        );
        assert_eq!(check("{.status.n}"), ("3".to_owned(), None));
        assert_eq!(
            check(".status.phase=Completed"),
            ("Completed".to_owned(), Some("Completed".to_owned()))
        );
        // A value with = in it: only the last }= splits.
        assert_eq!(check("{.status.phase}=a=b").1, Some("a=b".to_owned()));
        assert!(json_path_test("{.status[}=x").is_err());
    }
}
