//! `riggerctl label node NAME KEY=VALUE... KEY-...`: the labels an admin keeps on a node,
//! in kubectl's words. Only these choose a node for a job that carries pull secrets, and
//! only an admin can set a reserved prefix such as `node-restriction.rigger.dev/`.

use std::collections::HashMap;

use anyhow::bail;
use rigger_proto::v1::LabelRequest;
use serde_json::Value;

use crate::client::{Client, refused};

/// Parsed `KEY=VALUE` and `KEY-` arguments.
fn changes(args: &[String]) -> anyhow::Result<(HashMap<String, String>, Vec<String>)> {
    let mut set = HashMap::new();
    let mut remove = Vec::new();
    for arg in args {
        if let Some((key, value)) = arg.split_once('=') {
            if key.is_empty() {
                bail!("{arg:?}: a label needs a key (KEY=VALUE)");
            }
            set.insert(key.to_owned(), value.to_owned());
        } else if let Some(key) = arg.strip_suffix('-')
            && !key.is_empty()
        {
            remove.push(key.to_owned());
        } else {
            bail!("{arg:?}: expected KEY=VALUE to set a label or KEY- to remove one");
        }
    }
    Ok((set, remove))
}

/// Set (`KEY=VALUE`) or remove (`KEY-`) labels an admin keeps on a node: the labels
/// jobs with pull secrets choose nodes by, and the only way to set a reserved prefix
/// (`node-restriction.rigger.dev/`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// node (no).
    kind: String,
    name: String,
    #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
    labels: Vec<String>,
    /// Replace a value that is already there.
    #[arg(long)]
    overwrite: bool,
}

pub async fn run(args: Args, client: &mut Client) -> anyhow::Result<()> {
    let Args {
        kind,
        name,
        labels,
        overwrite,
    } = args;
    let (set, remove) = changes(&labels)?;
    let object = client
        .label(LabelRequest {
            kind,
            namespace: String::new(),
            name: name.clone(),
            set,
            remove,
            overwrite,
        })
        .await
        .map_err(|s| refused(&s))?
        .into_inner();
    let object: Value = serde_json::from_str(&object.json)?;
    let name = object["metadata"]["name"].as_str().unwrap_or(&name);
    println!("node/{name} labeled");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_read_as_kubectl_reads_them() {
        let args = ["team=payments", "zone-", "empty="].map(str::to_owned);
        let (set, remove) = changes(&args).unwrap();
        assert_eq!(set["team"], "payments");
        assert_eq!(set["empty"], "");
        assert_eq!(remove, ["zone"]);
        for bad in ["=x", "-", "plain"] {
            let err = changes(&[bad.to_owned()]).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
