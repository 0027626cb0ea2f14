//! Media types Rigger pulls, and picking the manifest for a platform out of an index.

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
const DOCKER_SCHEMA1_SIGNED: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// What we ask registries for; schema 1 is deliberately absent.
pub const ACCEPTED_MANIFESTS: &[&str] = &[OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST];

const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The compression of a layer media type; `Err` names a type containerd would not unpack.
pub fn layer_compression(media_type: &str) -> Result<Compression, String> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar" => Ok(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Ok(Compression::Zstd),
        other => Err(format!(
            "layer media type {other:?} is not an image layer Rigger (or containerd) unpacks"
        )),
    }
}

pub fn is_index(media_type: &str) -> bool {
    media_type == OCI_INDEX || media_type == DOCKER_LIST
}

/// The media type of a served manifest, from its own `mediaType` field (or its shape,
/// for OCI documents that omit it). Schema 1 and unknown types are refused.
pub fn manifest_media_type(bytes: &[u8]) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        schema_version: Option<u32>,
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
        layers: Option<serde_json::Value>,
    }
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| format!("manifest is not valid JSON: {e}"))?;
    let media_type = match (
        probe.media_type,
        probe.manifests.is_some(),
        probe.layers.is_some(),
    ) {
        (Some(t), _, _) => t,
        (None, true, false) => OCI_INDEX.to_owned(),
        (None, false, true) => OCI_MANIFEST.to_owned(),
        _ if probe.schema_version == Some(1) => DOCKER_SCHEMA1.to_owned(),
        _ => {
            return Err(
                "manifest has no mediaType and is neither an index nor an image manifest"
                    .to_owned(),
            );
        }
    };
    match media_type.as_str() {
        OCI_INDEX | OCI_MANIFEST | DOCKER_LIST | DOCKER_MANIFEST => Ok(media_type),
        DOCKER_SCHEMA1 | DOCKER_SCHEMA1_SIGNED => Err(
            "Docker schema 1 manifests are not supported (deprecated; re-push the image with a current client)".to_owned(),
        ),
        other => Err(format!("unsupported manifest media type {other:?}")),
    }
}

/// A platform as `os/arch[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    /// The machine this runs on, in GOOS/GOARCH terms.
    pub fn host() -> Self {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "aarch64" => ("arm64", Some("v8")),
            "arm" => ("arm", Some("v7")),
            "x86" => ("386", None),
            "powerpc64" => ("ppc64le", None),
            "s390x" => ("s390x", None),
            "riscv64" => ("riscv64", None),
            other => (other, None),
        };
        Self {
            os: "linux".to_owned(),
            architecture: architecture.to_owned(),
            variant: variant.map(str::to_owned),
        }
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split('/').collect();
        match parts.as_slice() {
            [os, arch] if !os.is_empty() && !arch.is_empty() => Ok(Self {
                os: (*os).to_owned(),
                architecture: (*arch).to_owned(),
                variant: None,
            }),
            [os, arch, variant] if !os.is_empty() && !arch.is_empty() && !variant.is_empty() => {
                Ok(Self {
                    os: (*os).to_owned(),
                    architecture: (*arch).to_owned(),
                    variant: Some((*variant).to_owned()),
                })
            }
            _ => Err(format!(
                "platform {text:?} is not OS/ARCH or OS/ARCH/VARIANT"
            )),
        }
    }

    /// Whether an image config (of a manifest that is not in an index) is for us.
    pub fn matches_config(&self, config: &oci_spec::image::ImageConfiguration) -> bool {
        config.os().to_string() == self.os && config.architecture().to_string() == self.architecture
    }

    fn matches(&self, descriptor: &Descriptor) -> bool {
        let Some(p) = descriptor.platform() else {
            return false;
        };
        if p.os().to_string() != self.os || p.architecture().to_string() != self.architecture {
            return false;
        }
        // An arm64 image without a variant is v8; any variant matches when we ask none.
        match (&self.variant, p.variant()) {
            (None, _) | (_, None) => true,
            (Some(want), Some(have)) => want == have,
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// The manifest for `platform` in an index (manifest list); its position is kept for
/// the GC label containerd writes (`containerd.io/gc.ref.content.m.<i>`).
pub fn select_manifest(bytes: &[u8], platform: &Platform) -> Result<Descriptor, String> {
    let index: ImageIndex =
        serde_json::from_slice(bytes).map_err(|e| format!("index is not valid: {e}"))?;
    index
        .manifests()
        .iter()
        .find(|m| platform.matches(m))
        .cloned()
        .ok_or_else(|| {
            let offered: Vec<String> = index
                .manifests()
                .iter()
                .filter_map(|m| m.platform().as_ref())
                .map(|p| format!("{}/{}", p.os(), p.architecture()))
                .collect();
            format!(
                "no manifest for {platform} (the index offers: {})",
                offered.join(", ")
            )
        })
}

/// The digests an index lists, in its order.
pub fn index_manifests(bytes: &[u8]) -> Result<Vec<String>, String> {
    let index: ImageIndex =
        serde_json::from_slice(bytes).map_err(|e| format!("index is not valid: {e}"))?;
    Ok(index
        .manifests()
        .iter()
        .map(|m| m.digest().to_string())
        .collect())
}

/// An image manifest, with its config and layers checked for types we can unpack.
pub fn parse_manifest(bytes: &[u8]) -> Result<ImageManifest, String> {
    let manifest: ImageManifest =
        serde_json::from_slice(bytes).map_err(|e| format!("image manifest is not valid: {e}"))?;
    let config_type = manifest.config().media_type().to_string();
    if config_type != OCI_CONFIG && config_type != DOCKER_CONFIG {
        return Err(format!(
            "config media type {config_type:?} is not a container image config (an artifact, not an image?)"
        ));
    }
    let layers = manifest.layers().len();
    if layers > MAX_LAYERS {
        return Err(format!(
            "{layers} layers: more than the {MAX_LAYERS} an image may have here (overlayfs \
             cannot stack that many; a registry serving this is broken or hostile)"
        ));
    }
    for layer in manifest.layers() {
        layer_compression(layer.media_type().as_ref())?;
    }
    Ok(manifest)
}

/// The most layers an image may have. Docker stops at 127 and overlayfs mounts cannot
/// stack many more lower directories; the limit keeps a hostile manifest from making
/// the agent plan thousands of downloads.
pub const MAX_LAYERS: usize = 500;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_with_too_many_layers_is_refused() {
        let layer = r#"{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2}"#;
        let manifest = |n: usize| {
            format!(
                r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2}},"layers":[{}]}}"#,
                vec![layer; n].join(",")
            )
        };
        assert!(parse_manifest(manifest(MAX_LAYERS).as_bytes()).is_ok());
        let error = parse_manifest(manifest(MAX_LAYERS + 1).as_bytes()).unwrap_err();
        assert!(
            error.starts_with("501 layers: more than the 500"),
            "{error}"
        );
    }

    #[test]
    fn schema1_and_unknown_types_are_refused() {
        let s1 = br#"{"schemaVersion":1,"name":"x","tag":"1","fsLayers":[]}"#;
        assert!(manifest_media_type(s1).unwrap_err().contains("schema 1"));
        let other = br#"{"schemaVersion":2,"mediaType":"application/vnd.example+json"}"#;
        assert!(
            manifest_media_type(other)
                .unwrap_err()
                .contains("application/vnd.example+json")
        );
        let oci = br#"{"schemaVersion":2,"config":{},"layers":[]}"#;
        assert_eq!(manifest_media_type(oci).unwrap(), OCI_MANIFEST);
    }

    #[test]
    fn layer_types() {
        assert_eq!(
            layer_compression("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Ok(Compression::Gzip)
        );
        assert_eq!(
            layer_compression("application/vnd.oci.image.layer.v1.tar+zstd"),
            Ok(Compression::Zstd)
        );
        assert!(layer_compression("application/vnd.cncf.helm.chart.content.v1.tar+gzip").is_err());
    }

    #[test]
    fn platform_selection() {
        let index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
          {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","size":1,"platform":{"os":"linux","architecture":"arm64","variant":"v8"}},
          {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","size":1,"platform":{"os":"linux","architecture":"amd64"}}]}"#;
        let amd = select_manifest(index, &Platform::parse("linux/amd64").unwrap()).unwrap();
        assert!(amd.digest().to_string().contains("bbbb"));
        let arm = select_manifest(index, &Platform::parse("linux/arm64/v8").unwrap()).unwrap();
        assert!(arm.digest().to_string().contains("aaaa"));
        let err = select_manifest(index, &Platform::parse("linux/s390x").unwrap()).unwrap_err();
        assert!(err.contains("linux/arm64, linux/amd64"), "{err}");
        assert!(Platform::parse("linux").is_err());
    }
}
