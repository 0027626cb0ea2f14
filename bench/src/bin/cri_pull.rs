//! `rigger-bench-cri-pull SOCK IMAGE`: pull IMAGE through CRI's PullImage, as kubelet
//! does, and print the image ID. The benchmark times this process.

use anyhow::Context as _;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{ImageSpec, PullImageRequest};
use rigger_runtime::{DEFAULT_CONNECT_TIMEOUT, Runtime};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(socket), Some(image)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: rigger-bench-cri-pull SOCK IMAGE");
    };
    let runtime = Runtime::connect(socket.as_ref(), DEFAULT_CONNECT_TIMEOUT).await?;
    let response = ImageServiceClient::new(runtime.channel())
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image.clone(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .with_context(|| format!("CRI PullImage {image}"))?;
    println!("{}", response.into_inner().image_ref);
    Ok(())
}
