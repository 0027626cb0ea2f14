//! The objects named by `-f`, as kubectl reads them: a file, `-` (standard input), or a
//! directory's `.yaml`, `.yml` and `.json` files in name order (with `-R`, its
//! subdirectories' too). Every YAML document of a file is an object; empty ones are
//! skipped. Errors name the file and the document.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::Value;

/// Extensions kubectl reads in a directory.
const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// Every object of every file `paths` name, in order.
pub fn read(paths: &[PathBuf], recursive: bool) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read standard input")?;
            objects.extend(documents(&text, "<stdin>")?);
            continue;
        }
        let meta =
            std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
        let files = if meta.is_dir() {
            let mut files = Vec::new();
            let mut seen = BTreeSet::new();
            files_in(path, recursive, &mut seen, &mut files)?;
            if files.is_empty() {
                anyhow::bail!(
                    "{}: no .yaml, .yml or .json files{}",
                    path.display(),
                    if recursive {
                        ""
                    } else {
                        " (-R reads subdirectories)"
                    }
                );
            }
            files
        } else {
            vec![path.clone()]
        };
        for file in files {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            objects.extend(documents(&text, &file.display().to_string())?);
        }
    }
    Ok(objects)
}

/// The manifest files in `dir`, sorted; subdirectories when `recursive` (each directory
/// once, so a symlink loop ends).
fn files_in(
    dir: &Path,
    recursive: bool,
    seen: &mut BTreeSet<PathBuf>,
    out: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let canonical = dir
        .canonicalize()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    if !seen.insert(canonical) {
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("cannot read {}", dir.display()))?;
    entries.sort();
    for entry in entries {
        let Ok(meta) = std::fs::metadata(&entry) else {
            continue; // a dangling symlink names nothing to apply
        };
        if meta.is_dir() {
            if recursive {
                files_in(&entry, recursive, seen, out)?;
            }
        } else if entry
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.contains(&e))
        {
            out.push(entry);
        }
    }
    Ok(())
}

/// Every document of a YAML stream, as JSON values; empty documents skipped.
pub fn documents(text: &str, source: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value: Value = serde::Deserialize::deserialize(document)
            .map_err(|e| anyhow::anyhow!("{source}: document {}: {e}", i + 1))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    if out.is_empty() {
        anyhow::bail!("{source}: no objects");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn job(name: &str) -> String {
        format!(
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata:\n  name: {name}\nspec:\n  image: a:1\n"
        )
    }

    fn names(objects: &[Value]) -> Vec<&str> {
        objects
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn a_directory_is_read_in_name_order_and_subdirectories_only_with_recursive() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("b.yaml"), job("b")).unwrap();
        std::fs::write(
            root.join("a.yml"),
            format!("{}---\n{}", job("a1"), job("a2")),
        )
        .unwrap();
        std::fs::write(root.join("notes.txt"), "not a manifest").unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(
            root.join("sub/c.json"),
            r#"{"kind":"Secret","metadata":{"name":"c"}}"#,
        )
        .unwrap();
        // A loop back to the top is read once.
        std::os::unix::fs::symlink(root, root.join("sub/loop")).unwrap();

        let flat = read(&[root.to_owned()], false).unwrap();
        assert_eq!(names(&flat), ["a1", "a2", "b"]);
        let deep = read(&[root.to_owned()], true).unwrap();
        assert_eq!(names(&deep), ["a1", "a2", "b", "c"]);
        let both = read(&[root.join("b.yaml"), root.join("sub/c.json")], false).unwrap();
        assert_eq!(names(&both), ["b", "c"]);
    }

    #[test]
    fn errors_name_the_file_and_the_document() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("bad.yaml"), format!("{}---\n: [", job("ok"))).unwrap();
        let err = read(&[root.to_owned()], false).unwrap_err().to_string();
        assert!(err.contains("bad.yaml: document 2"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        let err = read(&[empty.path().to_owned()], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("-R"), "{err}");
        let err = read(&[root.join("missing.yaml")], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.yaml"), "{err}");
    }
}
