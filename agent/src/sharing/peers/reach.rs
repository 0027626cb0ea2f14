//! Which blobs an image reaches: what a peer grant for the image lets a node fetch.
//!
//! From the image's top document (an index or a manifest) to its manifests, and from each
//! manifest to its config and layers — read from this node's own content store, never
//! from the peer. The decisions are here, without I/O; the serving side reads the
//! documents.

use std::collections::BTreeSet;

use serde::Deserialize;

use super::request::is_sha256_digest;

/// Most manifests an index may list and layers a manifest may have for a grant to be
/// checked (far above real images; bounds the work a hostile document can cause).
const MAX_ENTRIES: usize = 1024;

/// What one document names.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Named {
    /// Documents to read in turn (an index's manifests).
    pub documents: Vec<String>,
    /// Blobs the image reaches through this document (config and layers).
    pub blobs: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    #[serde(default)]
    manifests: Vec<Entry>,
    config: Option<Entry>,
    #[serde(default)]
    layers: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    digest: String,
}

/// What `document` (JSON of an index or a manifest, OCI or Docker) names. A digest that
/// is not sha256 is left out: nothing is served under it anyway.
pub fn named(document: &[u8]) -> Result<Named, String> {
    let document: Document =
        serde_json::from_slice(document).map_err(|e| format!("not an image document: {e}"))?;
    if document.manifests.len() > MAX_ENTRIES || document.layers.len() > MAX_ENTRIES {
        return Err(format!("names more than {MAX_ENTRIES} entries"));
    }
    let sha256 = |entry: Entry| is_sha256_digest(&entry.digest).then_some(entry.digest);
    Ok(Named {
        documents: document.manifests.into_iter().filter_map(sha256).collect(),
        blobs: document
            .config
            .into_iter()
            .chain(document.layers)
            .filter_map(sha256)
            .collect(),
    })
}

/// The blobs reached from `top`, reading documents with `read` (`None`: not held here,
/// as an index's manifests for other platforms are not). The documents themselves count
/// as reached. An index of indexes is not followed (images do not nest them).
pub fn reached(
    top: &str,
    mut read: impl FnMut(&str) -> Option<Vec<u8>>,
) -> Result<BTreeSet<String>, String> {
    let mut reached = BTreeSet::from([top.to_owned()]);
    let Some(document) = read(top) else {
        return Err(format!("{top} is not held on this node"));
    };
    let named_by_top = named(&document).map_err(|e| format!("{top}: {e}"))?;
    reached.extend(named_by_top.blobs);
    for manifest in named_by_top.documents {
        let Some(document) = read(&manifest) else {
            continue;
        };
        let named_by_manifest = named(&document).map_err(|e| format!("{manifest}: {e}"))?;
        reached.insert(manifest);
        reached.extend(named_by_manifest.blobs);
    }
    Ok(reached)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn manifest(config: char, layers: &[char]) -> Vec<u8> {
        let layers: Vec<_> = layers
            .iter()
            .map(|l| serde_json::json!({"digest": digest(*l), "size": 1}))
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "config": {"digest": digest(config), "size": 1},
            "layers": layers,
        }))
        .unwrap()
    }

    #[test]
    fn an_index_reaches_the_layers_of_the_manifests_held_here() {
        let index = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "manifests": [{"digest": digest('1')}, {"digest": digest('2')}],
        }))
        .unwrap();
        let documents = HashMap::from([
            (digest('0'), index),
            (digest('1'), manifest('c', &['a', 'b'])),
            // digest('2'), another platform's manifest, is not held here.
        ]);
        let reached = reached(&digest('0'), |d| documents.get(d).cloned()).unwrap();
        let expected: BTreeSet<String> = ['0', '1', 'c', 'a', 'b'].map(digest).into();
        assert_eq!(reached, expected);
    }

    #[test]
    fn hostile_documents_reach_nothing_beyond_them() {
        let top = digest('0');
        // Not JSON, not held, digests that are not sha256, too many entries.
        assert!(reached(&top, |_| Some(b"\xff".to_vec())).is_err());
        assert!(reached(&top, |_| None).is_err());
        let odd = serde_json::to_vec(&serde_json::json!({
            "config": {"digest": "sha256:../../etc"},
            "layers": [{"digest": "md5:00"}, {"digest": digest('a')}],
        }))
        .unwrap();
        let reached_odd = reached(&top, |_| Some(odd.clone())).unwrap();
        assert_eq!(reached_odd, [top.clone(), digest('a')].into());
        let many: Vec<_> = (0..=MAX_ENTRIES)
            .map(|_| serde_json::json!({"digest": digest('a')}))
            .collect();
        let huge = serde_json::to_vec(&serde_json::json!({"layers": many})).unwrap();
        assert!(reached(&top, |_| Some(huge.clone())).is_err());
    }
}
