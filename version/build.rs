//! The git commit the binaries were built from, as `RIGGER_COMMIT`: given in the
//! environment (a build from a source tarball, a container build without `.git`), else
//! asked of git, else `unknown`. Rerun when HEAD moves, not on every file changed: a
//! commit is what the binaries name, never whether the tree was clean.

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=RIGGER_COMMIT");
    let commit = match std::env::var("RIGGER_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => {
            if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
                let git_dir = PathBuf::from(git_dir);
                println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
                println!(
                    "cargo:rerun-if-changed={}",
                    git_dir.join("packed-refs").display()
                );
                if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    println!(
                        "cargo:rerun-if-changed={}",
                        git_dir.join(reference).display()
                    );
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=RIGGER_COMMIT={commit}");
}
