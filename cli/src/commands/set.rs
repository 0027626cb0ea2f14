//! `riggerctl set image pod/NAME CONTAINER=IMAGE...`: the pod as stored, with new
//! images, applied again (an in-place update).

use rigger_proto::v1::ApplyRequest;
use serde_json::Value;

use crate::client::{Client, ConnectArgs, fetch, refused};

/// Change objects in place: `set image pod/NAME CONTAINER=IMAGE...`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: SetCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SetCommand {
    /// New images for a pod's containers, updated in place (same sandbox and volumes).
    Image {
        /// pod/NAME
        object: String,
        /// CONTAINER=IMAGE, one or more.
        #[arg(required = true)]
        images: Vec<String>,
    },
}

pub async fn run(
    args: Args,
    client: &mut Client,
    connection: &ConnectArgs,
    namespace: &str,
) -> anyhow::Result<()> {
    match args.what {
        SetCommand::Image { object, images } => {
            set_image(client, connection, namespace, &object, &images).await
        }
    }
}

/// `set image pod/NAME C=IMAGE...`: the pod as stored, with new images, applied again.
async fn set_image(
    client: &mut Client,
    connection: &ConnectArgs,
    namespace: &str,
    object: &str,
    images: &[String],
) -> anyhow::Result<()> {
    let name = object
        .split_once('/')
        .filter(|(kind, name)| matches!(*kind, "pod" | "pods" | "po") && !name.is_empty())
        .map(|(_, name)| name)
        .ok_or_else(|| anyhow::anyhow!("{object:?}: expected pod/NAME"))?;
    let mut pod = fetch(client, connection, "pod", namespace, name).await?;
    if let Some(pod) = pod.as_object_mut() {
        pod.remove("status");
    }
    if let Some(labels) = pod
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove("lifecycle.rigger.dev/state");
    }
    for assignment in images {
        let (container, image) = assignment
            .split_once('=')
            .filter(|(c, i)| !c.is_empty() && !i.is_empty())
            .ok_or_else(|| anyhow::anyhow!("{assignment:?}: expected CONTAINER=IMAGE"))?;
        let target = pod
            .pointer_mut("/spec/containers")
            .and_then(Value::as_array_mut)
            .and_then(|cs| cs.iter_mut().find(|c| c["name"] == container))
            .ok_or_else(|| anyhow::anyhow!("pod {name} has no container {container:?}"))?;
        target["image"] = image.into();
    }
    let response = client
        .apply(ApplyRequest {
            json: pod.to_string(),
            dry_run: false,
        })
        .await
        .map_err(|s| refused(&s))?
        .into_inner();
    println!("pod/{name} image updated ({})", response.outcome);
    Ok(())
}
