//! Manifests and indexes as registries serve them (any bytes: a registry is not trusted).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rigger_pull::media::{self, Platform};

fuzz_target!(|bytes: &[u8]| {
    let _ = media::manifest_media_type(bytes);
    let _ = media::parse_manifest(bytes);
    let _ = media::index_manifests(bytes);
    let _ = media::select_manifest(bytes, &Platform::host());
    if let Ok(text) = std::str::from_utf8(bytes) {
        let _ = media::layer_compression(text);
    }
});
